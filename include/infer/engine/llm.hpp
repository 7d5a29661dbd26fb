#pragma once
/// \file
/// `infer::LLM`: the offline API (vLLM's `LLM.generate` is the model users know). It runs one of the
/// compiled engines (engine_registry.hpp: backend cpu, cuda or auto; engine paged or static), runs a whole
/// batch of prompts or conversations to completion, draws a progress bar on a terminal, and returns
/// per-request text, token ids, finish reasons and timings, with a summary of the run.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/engine/engine_registry.hpp"
#include "infer/engine/llm_options.hpp"
#include "infer/tokenizer/chat_template.hpp"

namespace infer {

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
 public:
  /// The model at `model` on the GPU when one is present (backend "auto"), else on the CPU.
  explicit LLM(const std::filesystem::path& model, LlmOptions options = {})
      : LLM(ModelSpec{.model = model, .backend = "auto"}, std::move(options)) {}

  /// A model file, an engine file (infer-build: the engine it was built for) or a dummy shape, on the
  /// backend `spec` names. Errors as make_engine.
  LLM(const ModelSpec& spec, LlmOptions options)
      : options_(with_engine_file(spec, std::move(options))), engine_(make_engine(spec, options_)) {}

  /// An engine type of your own (`std::in_place_type<MyEngine>`), built as make_engine<E> builds it: from
  /// `spec`, `options.engine_options` and `engine_args` (e.g. a scheduler instance).
  template <class E, class... Args>
  LLM(std::in_place_type_t<E>, const ModelSpec& spec, LlmOptions options, Args&&... engine_args)
      : options_(std::move(options)), engine_(make_engine<E>(spec, options_, std::forward<Args>(engine_args)...)) {}

  [[nodiscard]] const Tokenizer& tokenizer() const {
    const Tokenizer* t = engine_->tokenizer();
    require<InvalidArgument>(t != nullptr, "this model has no tokenizer");
    return *t;
  }
  [[nodiscard]] const ModelConfig& config() const { return engine_->config(); }
  [[nodiscard]] KvStats kv_stats() const { return engine_->kv_stats(); }
  [[nodiscard]] EngineStats stats() const { return engine_->stats(); }
  [[nodiscard]] const GenerationSummary& last_summary() const noexcept { return summary_; }
  /// Which engine runs, on which backend, with which limits.
  [[nodiscard]] EngineInfo info() const { return engine_->info(); }
  /// Engine::set_step_observer: `observer` sees every step of the runs that follow (e.g. a
  /// JsonlTraceWriter); an empty function stops it.
  void set_step_observer(std::function<void(const StepTrace&)> observer) {
    engine_->set_step_observer(std::move(observer));
  }

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
    return run(*engine_, prompts, [&](std::size_t) -> const SamplingParams& { return params; });
  }

  /// One SamplingParams per prompt (e.g. each with its own priority or tag). InvalidArgument when the
  /// counts differ.
  std::vector<RequestOutput> generate_ids(std::span<const std::vector<std::int32_t>> prompts,
                                          std::span<const SamplingParams> params) {
    require<InvalidArgument>(params.size() == prompts.size(), "generate_ids: ", prompts.size(), " prompts but ",
                             params.size(), " SamplingParams; give one per prompt");
    return run(*engine_, prompts, [&](std::size_t i) -> const SamplingParams& { return params[i]; });
  }

  [[nodiscard]] ChatTemplate chat_template() const {
    return options_.chat_template.empty() ? ChatTemplate::from_source(tokenizer().chat_template_source())
                                          : ChatTemplate::from_name(options_.chat_template);
  }

 private:
  static LlmOptions with_engine_file(ModelSpec spec, LlmOptions options) {
    apply_engine_file(spec, options);
    return options;
  }

  using Clock = std::chrono::steady_clock;

  /// Runs every prompt, `params_of(i)` being prompt i's parameters.
  template <class ParamsOf>
  std::vector<RequestOutput> run(EngineHandle& engine, std::span<const std::vector<std::int32_t>> prompts,
                                 ParamsOf params_of) {
    const auto start = Clock::now();
    const EngineStats before = engine.stats();
    kv_peak_ = {};
    max_waste_ = 0;
    std::vector<RequestId> ids;
    ids.reserve(prompts.size());
    try {
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        try {
          ids.push_back(engine.add_request(prompts[i], params_of(i)));
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
  std::unique_ptr<EngineHandle> engine_;
  GenerationSummary summary_;
  KvStats kv_peak_;
  double max_waste_ = 0;
};

}  // namespace infer
