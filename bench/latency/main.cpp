// infer-bench-latency: one batch of identical-length random prompts through PagedEngine, as vLLM's
// benchmark_latency: time to first token (the prefill), per-token decode latency, decode tokens/s and the
// fraction of the memory-bandwidth floor that reached (every decode step reads all weights once plus the
// batch's KV cache), and the cold start of the process (start → weights on the device → CUDA graphs
// captured → first token). Prints a table; --output-json writes the record.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "bench/support/bench_engine.hpp"
#include "infer/engine/presets.hpp"

namespace {

using namespace infer;
using bench::seconds_since;

struct LatencyFlags {
  std::int32_t batch_size = 1;
  std::int32_t input_len = 512;
  std::int32_t output_len = 128;
  std::int32_t warmup_iters = 1;
  std::int32_t iters = 3;
  double bandwidth = 4.27e12;  ///< bytes/s: the H200's measured device-to-device copy rate
};

/// One batch's timeline: TTFT of the slowest request, then the decode steps until all finish.
struct Iteration {
  double ttft_s = 0;        ///< add_request → every request has its first token
  double decode_s = 0;      ///< from there until every request finished
  double total_s = 0;
  std::vector<double> step_s;  ///< wall time of each decode step
  std::vector<double> device_s;  ///< device time of each decode step (CUDA backend)
  double ttft_device_s = 0;  ///< device time of the steps up to the first tokens (CUDA backend): TTFT minus
                             ///< this is the host's share (scheduling, launches, the copy back)
};

template <class E>
Iteration run_batch(E& engine, const LatencyFlags& f, std::mt19937_64& rng) {
  const auto vocab = engine.model().config().vocab_size;
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = f.output_len;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int32_t i = 0; i < f.batch_size; ++i)
    engine.add_request(bench::random_prompt(static_cast<std::size_t>(f.input_len), vocab, rng), p);
  Iteration it;
  std::int32_t started = 0;
  while (engine.has_unfinished()) {
    const auto s0 = std::chrono::steady_clock::now();
    const std::vector<RequestOutput> outs = engine.step();
    const double step = seconds_since(s0);
    double device = 0;
    if constexpr (requires { engine.model().last_step_device_ms(); })
      device = std::max(engine.model().last_step_device_ms(), 0.0) * 1e-3;
    if (started == f.batch_size) {
      it.step_s.push_back(step);
      it.device_s.push_back(device);
    } else {
      it.ttft_device_s += device;
    }
    for (const auto& o : outs) {
      // A failed request would make the batch look fast: the run is void (2026-12-05: FP8 GEMMs refused
      // by cuBLASLt showed as a 0 ms TTFT).
      if (!o.error.empty()) throw std::runtime_error("request " + std::to_string(o.id) + " failed: " + o.error);
      if (o.outputs.at(0).token_ids.size() == 1 && o.outputs[0].delta_token_ids.size() == 1) started++;
    }
    if (started == f.batch_size && it.ttft_s == 0) it.ttft_s = seconds_since(t0);
  }
  it.total_s = seconds_since(t0);
  it.decode_s = it.total_s - it.ttft_s;
  return it;
}

template <class E>
int run(const bench::ModelFlags& mf, const LatencyFlags& f) {
  const double t_main = seconds_since(bench::kProcessStart);
  std::mt19937_64 rng(1234);
  const auto t_engine = std::chrono::steady_clock::now();
  E engine(mf.source(), mf.options(f.input_len + f.output_len));
  const double engine_s = seconds_since(t_engine);
  const double ready_s = seconds_since(bench::kProcessStart);
  double weights_s = 0, graphs_s = 0, weight_bytes = 0, graphs = 0;
  if constexpr (requires { engine.model().load_times(); }) {
    const auto& lt = engine.model().load_times();
    weights_s = lt.weights_s;
    graphs_s = lt.graphs_s;
    weight_bytes = static_cast<double>(lt.weight_bytes);
    graphs = static_cast<double>(lt.graphs);
  }
  if constexpr (requires { engine.model().set_step_timing(true); }) engine.model().set_step_timing(true);
  const ModelConfig& c = engine.model().config();
  const double kv_per_token = static_cast<double>(engine.model().kv_bytes_per_token(engine.options().kv_cache_dtype));

  std::vector<Iteration> runs;
  double first_token_s = 0;
  for (std::int32_t i = 0; i < f.warmup_iters + f.iters; ++i) {
    Iteration it = run_batch(engine, f, rng);
    if (i == 0) first_token_s = ready_s + it.ttft_s;
    if (i >= f.warmup_iters) runs.push_back(std::move(it));
    const KvStats kv = engine.kv_stats();
    if (kv.free_blocks != kv.total_blocks) {
      std::fprintf(stderr, "infer-bench-latency: %d KV blocks still in use after a batch\n", kv.total_blocks - kv.free_blocks);
      return 1;
    }
  }
  std::vector<double> ttft, ttft_device, decode_tps, per_token, total;
  for (const auto& it : runs) {
    ttft.push_back(it.ttft_s);
    ttft_device.push_back(it.ttft_device_s);
    const double steps = f.output_len - 1;
    per_token.push_back(steps > 0 ? it.decode_s / steps : 0);
    decode_tps.push_back(steps > 0 ? f.batch_size * steps / it.decode_s : 0);
    total.push_back(it.total_s);
  }
  const double med_ttft = bench::percentile(ttft, 0.5), med_tpot = bench::percentile(per_token, 0.5);
  const double med_tps = bench::percentile(decode_tps, 0.5), med_total = bench::percentile(total, 0.5);
  // The floor of a decode step: all weights plus the batch's KV (at the mean context) read once.
  const double mean_ctx = f.input_len + f.output_len / 2.0;
  const double step_bytes = weight_bytes + f.batch_size * mean_ctx * kv_per_token;
  const double floor_tps = weight_bytes > 0 ? f.batch_size / (step_bytes / f.bandwidth) : 0;
  const double prefill_tps = f.batch_size * f.input_len / med_ttft;

  std::printf("infer-bench-latency: %s on %s (%s), batch %d, %d prompt + %d new tokens, %d iterations\n",
              mf.model_label().c_str(), mf.backend().c_str(), mf.mode().c_str(),
              f.batch_size, f.input_len, f.output_len, f.iters);
  std::printf("  %-34s %10.2f ms  (%.0f prompt tok/s)\n", "time to first token (median)", med_ttft * 1e3, prefill_tps);
  const double med_ttft_device = bench::percentile(ttft_device, 0.5);
  if (med_ttft_device > 0)
    std::printf("  %-34s %10.2f ms of the TTFT (host and launch: %.2f ms)\n", "device time to first token",
                med_ttft_device * 1e3, (med_ttft - med_ttft_device) * 1e3);
  std::printf("  %-34s %10.3f ms\n", "decode latency per token (median)", med_tpot * 1e3);
  std::printf("  %-34s %10.1f tok/s\n", "decode throughput (median)", med_tps);
  if (floor_tps > 0)
    std::printf("  %-34s %10.1f tok/s  (%.1f%% reached; %.2f GB weights, %.2f TB/s)\n", "bandwidth floor", floor_tps,
                100.0 * med_tps / floor_tps, weight_bytes / 1e9, f.bandwidth / 1e12);
  const double step_wall = bench::percentile(runs.back().step_s, 0.5), step_dev = bench::percentile(runs.back().device_s, 0.5);
  if (step_dev > 0)
    std::printf("  %-34s %10.3f ms of %.3f ms wall (host and launch: %.3f ms)\n", "device time per decode step",
                step_dev * 1e3, step_wall * 1e3, (step_wall - step_dev) * 1e3);
  std::printf("  %-34s %10.2f ms\n", "end-to-end batch latency (median)", med_total * 1e3);
  std::printf("  cold start: main %.3f s, weights on device %.3f s, graphs captured %.3f s (%g graphs), engine ready "
              "%.3f s, first token %.3f s after process start\n",
              t_main, weights_s, graphs_s, graphs, ready_s, first_token_s);

  nlohmann::json doc = bench::run_identity(mf.backend());
  doc["program"] = "infer-bench-latency";
  doc["settings"] = mf.settings();
  doc["settings"]["batch_size"] = f.batch_size;
  doc["settings"]["input_len"] = f.input_len;
  doc["settings"]["output_len"] = f.output_len;
  doc["settings"]["iters"] = f.iters;
  doc["settings"]["warmup_iters"] = f.warmup_iters;
  doc["model_config"] = {{"layers", c.num_layers}, {"hidden", c.hidden_size}, {"heads", c.num_heads},
                         {"kv_heads", c.num_kv_heads}, {"vocab", c.vocab_size}};
  doc["results"] = {{"ttft_ms", med_ttft * 1e3},
                    {"ttft_s_all", ttft},  // seconds, one per measured batch
                    {"ttft_device_ms", med_ttft_device * 1e3},
                    {"prefill_tokens_per_s", prefill_tps},
                    {"decode_ms_per_token", med_tpot * 1e3},
                    {"decode_tokens_per_s", med_tps},
                    {"decode_tokens_per_s_all", decode_tps},
                    {"decode_step_ms_p50", bench::percentile(runs.back().step_s, 0.5) * 1e3},
                    {"decode_step_ms_p99", bench::percentile(runs.back().step_s, 0.99) * 1e3},
                    {"decode_step_device_ms_p50", step_dev * 1e3},
                    {"end_to_end_ms", med_total * 1e3},
                    {"weight_bytes", weight_bytes},
                    {"bandwidth_bytes_per_s", f.bandwidth},
                    {"floor_decode_tokens_per_s", floor_tps},
                    {"fraction_of_floor", floor_tps > 0 ? med_tps / floor_tps : 0.0}};
  doc["cold_start_s"] = {{"main", t_main},          {"engine_construct", engine_s}, {"weights_on_device", weights_s},
                         {"graphs_captured", graphs_s}, {"graphs", graphs},          {"engine_ready", ready_s},
                         {"first_token", first_token_s}};
  bench::write_json(mf.output_json, doc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Latency of one batch: prefill, time to first token, per-token decode, cold start", "infer-bench-latency"};
  bench::ModelFlags mf;
  LatencyFlags f;
  mf.add_to(app);
  app.add_option("--batch-size", f.batch_size, "requests in the batch")->check(CLI::PositiveNumber);
  app.add_option("--input-len", f.input_len, "prompt tokens per request")->check(CLI::PositiveNumber);
  app.add_option("--output-len", f.output_len, "generated tokens per request (EOS ignored)")->check(CLI::PositiveNumber);
  app.add_option("--num-iters-warmup", f.warmup_iters, "batches run before measuring")->check(CLI::NonNegativeNumber);
  app.add_option("--num-iters", f.iters, "batches measured (medians reported)")->check(CLI::PositiveNumber);
  app.add_option("--bandwidth", f.bandwidth, "memory bandwidth for the floor, bytes/s (H200 copy: 4.27e12)");
  CLI11_PARSE(app, argc, argv);
  return bench::with_engine("infer-bench-latency", mf, [&]<class E>() { return run<E>(mf, f); });
}
