// infer-bench-throughput: N requests submitted at once to PagedEngine and run to completion, as vLLM's
// benchmark_throughput: requests/s, output tokens/s and total (prompt + output) tokens/s. Prompts are random
// token ids of --input-len (EOS ignored, exactly --output-len new tokens each) or come from a JSONL dataset:
// one object per line with "prompt" (text, tokenized by the model) or "prompt_ids", and optionally
// "output_len". Prints a table; --output-json writes the record.
#include <cstdio>
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
  E engine(mf.source(), mf.options(f.dataset.empty() ? f.input_len + f.output_len : 0));
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
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& r : reqs) {
    SamplingParams p;
    p.temperature = 0;
    p.ignore_eos = f.dataset.empty() || !f.honor_eos;
    p.max_tokens = r.output_len;
    engine.add_request(r.prompt, p);
  }
  const std::vector<RequestOutput> outs = engine.run_to_completion();
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
  std::printf("infer-bench-throughput: %s on %s (%s), %zu requests (%s)\n", mf.model_label().c_str(), mf.backend.c_str(),
              mf.mode().c_str(), reqs.size(),
              f.dataset.empty() ? detail::cat(f.input_len, " in / ", f.output_len, " out").c_str() : f.dataset.c_str());
  std::printf("  %-26s %10.2f s\n", "elapsed", elapsed);
  std::printf("  %-26s %10.2f req/s\n", "requests", static_cast<double>(outs.size()) / elapsed);
  std::printf("  %-26s %10.1f tok/s\n", "output tokens", output_tokens / elapsed);
  std::printf("  %-26s %10.1f tok/s\n", "total tokens", (prompt_tokens + output_tokens) / elapsed);
  std::printf("  %-26s %10.1f ms mean, %.1f ms p99\n", "time to first token", bench::mean(ttft) * 1e3,
              bench::percentile(ttft, 0.99) * 1e3);
  std::printf("  KV pool: %d blocks, preemptions %lld; all blocks free after the run: %s\n", kv.total_blocks,
              static_cast<long long>(st.preemptions), kv.free_blocks == kv.total_blocks ? "yes" : "NO");

  nlohmann::json doc = bench::run_identity(mf.backend);
  doc["program"] = "infer-bench-throughput";
  doc["settings"] = mf.settings();
  doc["settings"]["num_prompts"] = reqs.size();
  doc["settings"]["input_len"] = f.dataset.empty() ? nlohmann::json(f.input_len) : nlohmann::json(nullptr);
  doc["settings"]["output_len"] = f.output_len;
  doc["settings"]["dataset"] = f.dataset;
  doc["settings"]["ignore_eos"] = f.dataset.empty() || !f.honor_eos;
  doc["results"] = {{"elapsed_s", elapsed},
                    {"requests_per_s", static_cast<double>(outs.size()) / elapsed},
                    {"output_tokens_per_s", output_tokens / elapsed},
                    {"total_tokens_per_s", (prompt_tokens + output_tokens) / elapsed},
                    {"prompt_tokens", prompt_tokens},
                    {"output_tokens", output_tokens},
                    {"ttft_ms_mean", bench::mean(ttft) * 1e3},
                    {"ttft_ms_p99", bench::percentile(ttft, 0.99) * 1e3},
                    {"latency_ms_mean", bench::mean(latency) * 1e3},
                    {"kv_blocks", kv.total_blocks},
                    {"preemptions", st.preemptions},
                    {"all_blocks_free", kv.free_blocks == kv.total_blocks}};
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
  CLI11_PARSE(app, argc, argv);
  return bench::with_engine("infer-bench-throughput", mf, [&]<class E>() { return run<E>(mf, f); });
}
