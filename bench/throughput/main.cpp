// infer-bench-throughput: N requests submitted at once to PagedEngine and run to completion, as vLLM's
// benchmark_throughput: requests/s, output tokens/s and total (prompt + output) tokens/s. Prompts are random
// token ids of --input-len (EOS ignored, exactly --output-len new tokens each) or come from a JSONL dataset:
// one object per line with "prompt" (text, tokenized by the model) or "prompt_ids", and optionally
// "output_len". Greedy by default; --temperature / --top-p / --top-k make every request draw (seeded by
// its index), on the device unless --host-sampling. On the GPU each step's device time is measured too,
// so the table shows how much of the run the device was busy and the host's time per step around it.
// Prints a table; --output-json writes the record.
#include <cstdio>
#include <stdexcept>
#include <exception>
#include <fstream>

#include "bench/support/bench_engine.hpp"
#include "infer/engine/presets.hpp"

namespace {

using namespace infer;
using bench::seconds_since;

struct ThroughputFlags {
  std::int32_t num_prompts = 1000;
  std::int32_t input_len = 512;
  std::int32_t output_len = 128;
  std::string dataset;
  bool honor_eos = false;  ///< dataset runs only: stop at EOS instead of generating output_len tokens
  float temperature = 0.0f;
  float top_p = 1.0f;
  std::int32_t top_k = 0;
  bool host_sampling = false;  ///< EngineOptions::device_sampling = false
};

/// Wall and device time of the measured steps, in all and step by step (for the JSON record: where a
/// run's time goes between prefill-heavy and decode steps).
struct StepTimes {
  std::int64_t steps = 0;
  double wall_s = 0;
  double device_s = 0;  ///< 0 when the model does not time its steps (CPU)
  nlohmann::json log = nlohmann::json::array();  ///< per step: [wall ms, device ms, tokens computed, sequences]
};

struct Request {
  std::vector<std::int32_t> prompt;
  std::int32_t output_len = 0;
};

template <class E>
std::vector<Request> make_requests(const E& engine, const ThroughputFlags& f) {
  std::vector<Request> reqs;
  if (f.dataset.empty()) {
    std::mt19937_64 rng(4321);
    for (std::int32_t i = 0; i < f.num_prompts; ++i)
      reqs.push_back({bench::random_prompt(static_cast<std::size_t>(f.input_len), engine.model().config().vocab_size, rng),
                      f.output_len});
    return reqs;
  }
  std::ifstream in(f.dataset);
  if (!in) throw IoError("cannot read the dataset " + f.dataset);
  std::string line;
  for (std::size_t n = 1; std::getline(in, line) && std::ssize(reqs) < f.num_prompts; ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw FormatError(detail::cat(f.dataset, " line ", n, ": not JSON (", e.what(), ")"));
    }
    Request r{{}, j.value("output_len", f.output_len)};
    if (j.contains("prompt_ids")) {
      r.prompt = j["prompt_ids"].get<std::vector<std::int32_t>>();
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      if (!engine.tokenizer()) throw InvalidArgument("text prompts need a model with a tokenizer; use prompt_ids");
      r.prompt = engine.tokenizer()->encode(j["prompt"].get<std::string>());
    } else {
      throw FormatError(detail::cat(f.dataset, " line ", n, ": needs \"prompt\" (a string) or \"prompt_ids\""));
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

template <class E>
int run(const bench::ModelFlags& mf, ThroughputFlags f) {
  // Random requests need exactly input + output positions; a dataset gets the model's context.
  EngineOptions options = mf.options(f.dataset.empty() ? f.input_len + f.output_len : 0);
  options.device_sampling = !f.host_sampling;
  E engine(mf.source(), options);
  const std::vector<Request> reqs = make_requests(engine, f);
  // A short warm-up batch picks the GEMM plans of the shapes ahead outside the measurement.
  {
    SamplingParams p;
    p.temperature = 0;
    p.ignore_eos = true;
    p.max_tokens = std::min(4, f.output_len);
    const auto len = static_cast<std::size_t>(std::min(64, f.input_len));
    std::mt19937_64 rng(1);
    for (int i = 0; i < 8; ++i) engine.add_request(bench::random_prompt(len, engine.model().config().vocab_size, rng), p);
    (void)engine.run_to_completion();
  }
  constexpr bool kTimed = requires { engine.model().set_step_timing(true); };
  if constexpr (kTimed) engine.model().set_step_timing(true);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    SamplingParams p;
    p.temperature = f.temperature;
    p.top_p = f.top_p;
    p.top_k = f.top_k;
    p.seed = i;
    p.ignore_eos = f.dataset.empty() || !f.honor_eos;
    p.max_tokens = reqs[i].output_len;
    engine.add_request(reqs[i].prompt, p);
  }
  std::vector<RequestOutput> outs;
  StepTimes times;
  while (engine.has_unfinished()) {
    const auto s0 = std::chrono::steady_clock::now();
    const std::int64_t computed = engine.stats().computed_tokens;
    const auto seqs = static_cast<std::int64_t>(engine.num_running() + engine.num_waiting());
    for (auto& o : engine.step()) {
      // A failed request finishes early and would flatter the figures: the run is void.
      if (!o.error.empty()) throw std::runtime_error("request " + std::to_string(o.id) + " failed: " + o.error);
      if (o.finished) outs.push_back(std::move(o));
    }
    const double wall = seconds_since(s0);
    double device = 0;
    if constexpr (kTimed) device = engine.model().last_step_device_ms() * 1e-3;
    times.wall_s += wall;
    times.device_s += device;
    times.steps++;
    times.log.push_back({wall * 1e3, device * 1e3, engine.stats().computed_tokens - computed, seqs});
  }
  const double elapsed = seconds_since(t0);
  double prompt_tokens = 0, output_tokens = 0;
  std::vector<double> ttft, latency;
  for (const auto& o : outs) {
    prompt_tokens += static_cast<double>(o.prompt_token_ids.size());
    output_tokens += static_cast<double>(o.outputs.at(0).token_ids.size());
    ttft.push_back(o.metrics.ttft_s());
    latency.push_back(o.metrics.latency_s());
  }
  const KvStats kv = engine.kv_stats();
  const auto& st = engine.stats();
  std::printf("infer-bench-throughput: %s on %s (%s), %zu requests (%s)\n", mf.model_label().c_str(), mf.backend().c_str(),
              mf.mode().c_str(), reqs.size(),
              f.dataset.empty() ? detail::cat(f.input_len, " in / ", f.output_len, " out").c_str() : f.dataset.c_str());
  std::printf("  %-26s %10.2f s\n", "elapsed", elapsed);
  std::printf("  %-26s %10.2f req/s\n", "requests", static_cast<double>(outs.size()) / elapsed);
  std::printf("  %-26s %10.1f tok/s\n", "output tokens", output_tokens / elapsed);
  std::printf("  %-26s %10.1f tok/s\n", "total tokens", (prompt_tokens + output_tokens) / elapsed);
  std::printf("  %-26s %10.1f ms mean, %.1f ms p99\n", "time to first token", bench::mean(ttft) * 1e3,
              bench::percentile(ttft, 0.99) * 1e3);
  if (times.device_s > 0)
    std::printf("  %-26s %10.1f %% of %lld steps' wall time; host %.2f ms per step around it\n", "device busy",
                100.0 * times.device_s / times.wall_s, static_cast<long long>(times.steps),
                (times.wall_s - times.device_s) / static_cast<double>(times.steps) * 1e3);
  std::printf("  KV pool: %d blocks, preemptions %lld; all blocks free after the run: %s\n", kv.total_blocks,
              static_cast<long long>(st.preemptions), kv.free_blocks == kv.total_blocks ? "yes" : "NO");

  nlohmann::json doc = bench::run_identity(mf.backend());
  doc["program"] = "infer-bench-throughput";
  doc["settings"] = mf.settings();
  doc["settings"]["num_prompts"] = reqs.size();
  doc["settings"]["input_len"] = f.dataset.empty() ? nlohmann::json(f.input_len) : nlohmann::json(nullptr);
  doc["settings"]["output_len"] = f.output_len;
  doc["settings"]["dataset"] = f.dataset;
  doc["settings"]["ignore_eos"] = f.dataset.empty() || !f.honor_eos;
  doc["settings"]["temperature"] = f.temperature;
  doc["settings"]["top_p"] = f.top_p;
  doc["settings"]["top_k"] = f.top_k;
  doc["settings"]["device_sampling"] = !f.host_sampling;
  doc["results"] = {{"elapsed_s", elapsed},
                    {"requests_per_s", static_cast<double>(outs.size()) / elapsed},
                    {"output_tokens_per_s", output_tokens / elapsed},
                    {"total_tokens_per_s", (prompt_tokens + output_tokens) / elapsed},
                    {"prompt_tokens", prompt_tokens},
                    {"output_tokens", output_tokens},
                    {"ttft_ms_mean", bench::mean(ttft) * 1e3},
                    {"ttft_ms_p99", bench::percentile(ttft, 0.99) * 1e3},
                    {"latency_ms_mean", bench::mean(latency) * 1e3},
                    {"steps", times.steps},
                    {"step_wall_s", times.wall_s},
                    {"step_device_s", times.device_s},
                    {"kv_blocks", kv.total_blocks},
                    {"preemptions", st.preemptions},
                    {"all_blocks_free", kv.free_blocks == kv.total_blocks}};
  doc["step_log"] = {{"columns", {"wall_ms", "device_ms", "tokens", "sequences_before"}}, {"steps", times.log}};
  bench::write_json(mf.output_json, doc);
  return kv.free_blocks == kv.total_blocks ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Offline throughput: N requests at once, run to completion", "infer-bench-throughput"};
  bench::ModelFlags mf;
  ThroughputFlags f;
  mf.add_to(app);
  app.add_option("--num-prompts", f.num_prompts, "requests")->check(CLI::PositiveNumber);
  app.add_option("--input-len", f.input_len, "prompt tokens per random request")->check(CLI::PositiveNumber);
  app.add_option("--output-len", f.output_len, "generated tokens per request (EOS ignored)")->check(CLI::PositiveNumber);
  app.add_option("--dataset", f.dataset, "JSONL: {\"prompt\": text | \"prompt_ids\": [...], \"output_len\": n}");
  app.add_flag("--honor-eos", f.honor_eos, "dataset runs: stop at EOS instead of generating output_len tokens");
  app.add_option("--temperature", f.temperature, "sampling temperature of every request (0 = greedy)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", f.top_p, "nucleus sampling mass (1 = off)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--top-k", f.top_k, "keep the k most likely tokens (0 = off)")->check(CLI::NonNegativeNumber);
  app.add_flag("--host-sampling", f.host_sampling,
               "cuda: copy the logits of sampled requests to the host and draw there (EngineOptions::device_sampling off)");
  CLI11_PARSE(app, argc, argv);
  return bench::with_engine("infer-bench-throughput", mf, [&]<class E>() { return run<E>(mf, f); });
}
