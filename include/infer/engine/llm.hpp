#pragma once
/// \file
/// `infer::LLM`: the offline API (vLLM's `LLM.generate` is the model users know). It picks one of the
/// compiled engine presets at run time (`LlmOptions::engine`, `block_size`), runs a whole batch of
/// prompts or conversations to completion, draws a progress bar on a terminal, and returns per-request
/// text, token ids, finish reasons and timings, with a summary of the run.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "infer/engine/presets.hpp"
#include "infer/tokenizer/chat_template.hpp"

namespace infer {

/// "512M", "2G", "1048576" → bytes: the --kv-cache-memory syntax of infer-generate, infer-serve and router
/// configs. InvalidArgument names `what` and the text.
inline std::size_t parse_memory_size(const std::string& s, const std::string& what = "--kv-cache-memory") {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = s.substr(used);
  const double mult = unit.empty() ? 1 : unit == "K" || unit == "KiB" ? 1024.0
                                   : unit == "M" || unit == "MiB" ? 1048576.0
                                   : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
  if (used == 0 || mult < 0 || v <= 0)
    throw InvalidArgument(detail::cat(what, " '", s, "' is not a size like 512M or 2G"));
  return static_cast<std::size_t>(v * mult);
}

struct LlmOptions {
  std::string engine = "paged";    ///< "paged" (PagedEngine) or "static" (StaticEngine, default_static_shape)
  std::int32_t block_size = 16;    ///< paged engine: 8, 16 or 32
  EngineOptions engine_options;
  std::string chat_template;       ///< a built-in template (chatml, llama3, llama3.1, mistral) instead of the model's
  bool progress = true;            ///< draw a progress bar when stderr is a terminal
  bool summary = true;             ///< print the run's summary to stderr at the end
};

/// What one generate()/chat() call did, over all its requests.
struct GenerationSummary {
  std::int64_t requests = 0;
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_prompt_tokens = 0;
  std::int64_t output_tokens = 0;
  std::int64_t preemptions = 0;
  double seconds = 0;
  double mean_ttft_s = 0;
  /// KV-cache occupancy at the step that used the most blocks, and the worst waste seen: slots
  /// allocated but empty, per live sequence (paging keeps this under one block).
  KvStats kv_at_peak;
  double max_wasted_slots_per_sequence = 0;
  [[nodiscard]] double output_tokens_per_s() const { return seconds > 0 ? static_cast<double>(output_tokens) / seconds : 0; }
  [[nodiscard]] double total_tokens_per_s() const {
    return seconds > 0 ? static_cast<double>(output_tokens + prompt_tokens) / seconds : 0;
  }
};

class LLM {
  // The engines LlmOptions can pick, compiled once each. Declared first: the members below deduce
  // their return types through visit().
  using Engines = std::variant<PagedEngine<cpu, 8>, PagedEngine<cpu, 16>, PagedEngine<cpu, 32>, StaticEngine<cpu>>;

  template <class E>
  void make(const std::filesystem::path& model) {
    engine_ = std::make_unique<Engines>(std::in_place_type<E>, model, options_.engine_options);
  }
  template <class F>
  decltype(auto) visit(F&& f) const { return std::visit(std::forward<F>(f), *engine_); }
  template <class F>
  decltype(auto) visit(F&& f) { return std::visit(std::forward<F>(f), *engine_); }

 public:
  explicit LLM(const std::filesystem::path& model, LlmOptions options = {}) : options_(std::move(options)) {
    using detail::cat;
    if (options_.engine == "static") {
      make<StaticEngine<cpu>>(model);
    } else if (options_.engine == "paged") {
      switch (options_.block_size) {
        case 8: make<PagedEngine<cpu, 8>>(model); break;
        case 16: make<PagedEngine<cpu, 16>>(model); break;
        case 32: make<PagedEngine<cpu, 32>>(model); break;
        default:
          throw InvalidArgument(cat("block_size = ", options_.block_size, " is not compiled in; choose 8, 16 or 32"));
      }
    } else {
      throw InvalidArgument(cat("engine '", options_.engine, "' is unknown; choose paged or static"));
    }
  }

  [[nodiscard]] const Tokenizer& tokenizer() const {
    const Tokenizer* t = visit([](auto& e) { return e.tokenizer(); });
    require<InvalidArgument>(t != nullptr, "this model has no tokenizer");
    return *t;
  }
  [[nodiscard]] const ModelConfig& config() const { return visit([](auto& e) -> const ModelConfig& { return e.config(); }); }
  [[nodiscard]] KvStats kv_stats() const { return visit([](auto& e) { return e.kv_stats(); }); }
  [[nodiscard]] EngineStats stats() const { return visit([](auto& e) { return e.stats(); }); }
  [[nodiscard]] const GenerationSummary& last_summary() const noexcept { return summary_; }
  [[nodiscard]] std::string_view engine_name() const noexcept { return options_.engine; }

  /// Completes every prompt; results in prompt order. Throws InvalidArgument naming the first bad prompt
  /// (nothing is run then).
  std::vector<RequestOutput> generate(std::span<const std::string> prompts, const SamplingParams& params) {
    std::vector<std::vector<std::int32_t>> ids;
    ids.reserve(prompts.size());
    for (const auto& p : prompts) ids.push_back(tokenizer().encode(p));
    return generate_ids(ids, params);
  }

  /// Each conversation rendered by the model's chat template (with the assistant's turn opened).
  std::vector<RequestOutput> chat(std::span<const std::vector<ChatMessage>> conversations, const SamplingParams& params) {
    const ChatTemplate tmpl = chat_template();
    std::vector<std::vector<std::int32_t>> ids;
    for (const auto& c : conversations) ids.push_back(encode_chat(tmpl.apply(c, /*add_generation_prompt=*/true)));
    return generate_ids(ids, params);
  }

  /// Token ids of a conversation already rendered by chat_template(): special tokens parsed, no BOS added
  /// (a rendered chat starts with whatever BOS text the template writes).
  [[nodiscard]] std::vector<std::int32_t> encode_chat(std::string_view rendered) const {
    EncodeOptions opts;
    opts.add_bos = false;
    return tokenizer().encode(rendered, opts);
  }

  std::vector<RequestOutput> generate_ids(std::span<const std::vector<std::int32_t>> prompts, const SamplingParams& params) {
    return visit([&](auto& e) { return run(e, prompts, params); });
  }

  [[nodiscard]] ChatTemplate chat_template() const {
    return options_.chat_template.empty() ? ChatTemplate::from_source(tokenizer().chat_template_source())
                                          : ChatTemplate::from_name(options_.chat_template);
  }

 private:
  template <class E>
  std::vector<RequestOutput> run(E& engine, std::span<const std::vector<std::int32_t>> prompts, const SamplingParams& params) {
    const auto start = Clock::now();
    const EngineStats before = engine.stats();
    kv_peak_ = {};
    max_waste_ = 0;
    std::vector<RequestId> ids;
    ids.reserve(prompts.size());
    try {
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        try {
          ids.push_back(engine.add_request(prompts[i], params));
        } catch (const InvalidArgument& e) {
          throw InvalidArgument(detail::cat("prompt ", i, ": ", e.what()));
        }
      }
    } catch (...) {
      for (RequestId id : ids) engine.abort(id);  // nothing of a rejected batch keeps running
      while (engine.has_unfinished()) engine.step();
      throw;
    }
    std::vector<RequestOutput> results(prompts.size());
    std::size_t done = 0;
    const bool bar = options_.progress && ::isatty(STDERR_FILENO);
    while (engine.has_unfinished()) {
      for (auto& o : engine.step()) {
        if (!o.finished) continue;
        const auto index = static_cast<std::size_t>(std::lower_bound(ids.begin(), ids.end(), o.id) - ids.begin());
        if (index < ids.size() && ids[index] == o.id) {
          results[index] = std::move(o);
          ++done;
        }
      }
      if (bar) draw_progress(done, prompts.size(), engine.stats().generated_tokens - before.generated_tokens, start);
      track_kv(engine.kv_stats());
    }
    if (bar) std::fputs("\n", stderr);
    summarize(results, before, engine.stats(), start);
    return results;
  }

  static void draw_progress(std::size_t done, std::size_t total, std::int64_t tokens, Clock::time_point start) {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    constexpr int width = 30;
    const int filled = total ? static_cast<int>(width * done / total) : width;
    std::string bar(static_cast<std::size_t>(filled), '=');
    bar.resize(width, ' ');
    std::fprintf(stderr, "\r[%s] %zu/%zu requests, %.1f output tok/s", bar.c_str(), done, total,
                 s > 0 ? static_cast<double>(tokens) / s : 0.0);
    std::fflush(stderr);
  }

  void track_kv(const KvStats& kv) {
    if (kv.used_blocks > kv_peak_.used_blocks) kv_peak_ = kv;
    if (kv.live_sequences > 0)
      max_waste_ = std::max(max_waste_, static_cast<double>(kv.wasted_slots()) / kv.live_sequences);
  }

  void summarize(const std::vector<RequestOutput>& results, const EngineStats& before, const EngineStats& after,
                 Clock::time_point start) {
    summary_ = {};
    summary_.kv_at_peak = std::exchange(kv_peak_, KvStats{});
    summary_.max_wasted_slots_per_sequence = std::exchange(max_waste_, 0.0);
    summary_.requests = static_cast<std::int64_t>(results.size());
    summary_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    summary_.preemptions = after.preemptions - before.preemptions;
    double ttft = 0;
    for (const auto& r : results) {
      summary_.prompt_tokens += r.metrics.prompt_tokens;
      summary_.cached_prompt_tokens += r.metrics.cached_prompt_tokens;
      summary_.output_tokens += r.generated_tokens();
      ttft += std::max(0.0, r.metrics.ttft_s());
    }
    summary_.mean_ttft_s = results.empty() ? 0 : ttft / static_cast<double>(results.size());
    if (options_.summary)
      std::fprintf(stderr,
                   "infer: %lld requests, %lld prompt tokens (%lld from the prefix cache), %lld output tokens in "
                   "%.2f s: %.1f output tok/s, %.1f total tok/s, mean time to first token %.1f ms\n",
                   static_cast<long long>(summary_.requests), static_cast<long long>(summary_.prompt_tokens),
                   static_cast<long long>(summary_.cached_prompt_tokens), static_cast<long long>(summary_.output_tokens),
                   summary_.seconds, summary_.output_tokens_per_s(), summary_.total_tokens_per_s(),
                   summary_.mean_ttft_s * 1e3);
  }

  LlmOptions options_;
  std::unique_ptr<Engines> engine_;
  GenerationSummary summary_;
  KvStats kv_peak_;
  double max_waste_ = 0;
};

}  // namespace infer
