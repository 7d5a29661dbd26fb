// infer-generate: offline batch generation (the infer::LLM API as a program), on the GPU when one is present.
//
//   infer-generate --model MODEL "prompt one" "prompt two" [--chat] [sampling flags] [--json]
//   infer-generate --model MODEL --prompts FILE            one prompt per line, or JSONL lines
//                                                          {"prompt": "..."} / {"messages": [{"role", "content"}]},
//                                                          each with optional "priority" (int) and "tag" (string)
//   infer-generate --dummy llama3-8b --tokenizer MODEL ... a model shape with random weights, another's tokenizer
//   infer-generate --engine-file F [--model MODEL --build-if-missing | --rebuild] ...
//                                                          an engine built ahead (infer-build), built first when
//                                                          absent (or always, --rebuild) from MODEL with the flags given
// --backend cpu|cuda|auto, --engine paged|static, --block-size 8|16|32 and --quantizer auto|bf16|int8|fp8|int4 choose the
// compiled engine (engine_registry.hpp); --backend cuda on a machine without a GPU exits 2. --json prints one
// document with every request's tokens, text, finish reason and timings, the run's summary and KV statistics.
// --trace FILE writes every engine step (the plan, admissions, preemptions, blocks) as a JSON line.
//
//   mpirun -np N infer-generate --data-parallel ...        one engine per rank (a GPU each: the local rank's),
//                                                          the prompts split into N contiguous chunks, the
//                                                          results gathered at rank 0 and printed there in
//                                                          prompt order with one summary (needs a build with MPI)
//   mpirun -np N infer-generate --tensor-parallel-size N ...
//                                                          one model split over N ranks (Megatron-LM's split:
//                                                          heads, MLP and vocabulary), every rank running every
//                                                          request, rank 0 printing (CPU backend in this version)
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "data_parallel_job.hpp"
#include "tensor_parallel_job.hpp"
#include "infer/engine/llm.hpp"
#include "program_flags.hpp"

using nlohmann::json;

namespace {

struct Prompt {
  std::string text;                         // a plain prompt, or the user turn with --chat
  std::vector<infer::ChatMessage> messages;  // set for chat prompts
  std::int32_t priority = 0;                // SamplingParams::priority (lower is served earlier)
  std::string tag;                          // SamplingParams::tag
};

/// A plain text prompt; with --chat, the user turn of a conversation.
Prompt plain(std::string text, bool chat) {
  Prompt p;
  if (chat) p.messages = {{"user", text}};
  p.text = std::move(text);
  return p;
}

std::vector<Prompt> read_prompts(const std::string& path, bool chat) {
  std::ifstream in(path);
  if (!in) throw infer::IoError(infer::detail::cat("cannot read --prompts '", path, "'"));
  std::vector<Prompt> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line.front() != '{') {
      out.push_back(plain(line, chat));
      continue;
    }
    const auto where = infer::detail::cat("--prompts '", path, "' line ", n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw infer::InvalidArgument(infer::detail::cat(where, ": not valid JSON (", e.what(), ")"));
    }
    if (!j.is_object()) throw infer::InvalidArgument(where + ": expected a JSON object");
    Prompt p;
    if (j.contains("messages")) {
      if (!j["messages"].is_array()) throw infer::InvalidArgument(where + ": \"messages\" must be an array");
      for (const auto& m : j["messages"]) {
        if (!m.is_object() || !m.value("role", json()).is_string() || !m.value("content", json()).is_string())
          throw infer::InvalidArgument(where + ": each message needs string \"role\" and \"content\"");
        p.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      }
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      p = plain(j["prompt"].get<std::string>(), chat);
    } else {
      throw infer::InvalidArgument(where + ": expected {\"prompt\": string} or {\"messages\": [...]}");
    }
    if (j.contains("priority")) {
      const auto& v = j["priority"];
      if (!v.is_number_integer() || v.get<std::int64_t>() < std::numeric_limits<std::int32_t>::min() ||
          v.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
        throw infer::InvalidArgument(where + ": \"priority\" must be a 32-bit integer (lower is served earlier)");
      p.priority = v.get<std::int32_t>();
    }
    if (j.contains("tag")) {
      if (!j["tag"].is_string()) throw infer::InvalidArgument(where + ": \"tag\" must be a string");
      p.tag = j["tag"].get<std::string>();
    }
    out.push_back(std::move(p));
  }
  return out;
}

json kv_json(const infer::KvStats& k) {
  return {{"block_size", k.block_size},         {"total_blocks", k.total_blocks},
          {"free_blocks", k.free_blocks},       {"cached_blocks", k.cached_blocks},
          {"used_blocks", k.used_blocks},       {"tokens_stored", k.tokens_stored},
          {"live_sequences", k.live_sequences}, {"wasted_slots", k.wasted_slots()},
          {"prefix_queried_tokens", k.prefix_queried_tokens}, {"prefix_hit_tokens", k.prefix_hit_tokens},
          {"evictions", k.evictions}};
}

/// A run's summary as the --json document prints it.
json summary_json(const infer::GenerationSummary& sum) {
  return {{"requests", sum.requests}, {"prompt_tokens", sum.prompt_tokens},
          {"cached_prompt_tokens", sum.cached_prompt_tokens}, {"output_tokens", sum.output_tokens},
          {"seconds", sum.seconds}, {"output_tokens_per_s", sum.output_tokens_per_s()},
          {"total_tokens_per_s", sum.total_tokens_per_s()}, {"mean_ttft_ms", sum.mean_ttft_s * 1e3},
          {"preemptions", sum.preemptions}};
}

/// The ranks' summaries as one: counts added, the job's time the slowest rank's, TTFT weighted by requests.
json merge_summaries(const std::vector<json>& ranks) {
  std::int64_t requests = 0, prompt = 0, cached = 0, output = 0, preemptions = 0;
  double seconds = 0, ttft_sum = 0;
  for (const json& r : ranks) {
    const json& s = r.at("summary");
    requests += s.at("requests").get<std::int64_t>();
    prompt += s.at("prompt_tokens").get<std::int64_t>();
    cached += s.at("cached_prompt_tokens").get<std::int64_t>();
    output += s.at("output_tokens").get<std::int64_t>();
    preemptions += s.at("preemptions").get<std::int64_t>();
    seconds = std::max(seconds, s.at("seconds").get<double>());
    ttft_sum += s.at("mean_ttft_ms").get<double>() * static_cast<double>(s.at("requests").get<std::int64_t>());
  }
  const auto per_s = [&](std::int64_t n) { return seconds > 0 ? static_cast<double>(n) / seconds : 0.0; };
  return {{"requests", requests}, {"prompt_tokens", prompt}, {"cached_prompt_tokens", cached},
          {"output_tokens", output}, {"seconds", seconds}, {"output_tokens_per_s", per_s(output)},
          {"total_tokens_per_s", per_s(prompt + output)},
          {"mean_ttft_ms", requests > 0 ? ttft_sum / static_cast<double>(requests) : 0.0}, {"preemptions", preemptions}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generate completions for a batch of prompts", "infer-generate"};
  std::string prompts_file, kv_memory, trace_file;
  infer::ModelSpec spec;
  spec.backend = "auto";
  std::vector<std::string> prompt_args;
  bool chat = false, as_json = false, no_prefix_caching = false;
  infer::LlmOptions opt;
  infer::SamplingParams sp;
  sp.max_tokens = 64;
  std::optional<std::uint64_t> seed;
  infer::programs::add_model_flags(app, spec);
  infer::programs::EngineFileFlags engine_file;
  infer::programs::add_engine_file_flags(app, engine_file);
  app.add_option("--quantizer", opt.quantizer, "int8 (W8A16 per channel), fp8 (W8A8 e4m3) or int4 (W4A16, groups of 128) on either backend; cuda: auto (GGUF blocks used in place) or bf16; cpu: auto (f32)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8", "int4"}));
  app.add_option("--gpu-memory-utilization", opt.engine_options.gpu_memory_utilization,
                 "cuda: fraction of the device this engine may use (weights, activations, KV cache)")
      ->check(CLI::Range(0.01, 1.0));
  app.add_flag("--enforce-eager", opt.engine_options.enforce_eager, "cuda: run every step eagerly (no CUDA graphs)");
  infer::programs::add_kv_cache_dtype_flag(app, opt.engine_options.kv_cache_dtype);
  app.add_option("prompts", prompt_args, "prompts (or use --prompts FILE)");
  app.add_option("--prompts", prompts_file, "a file: one prompt per line, or JSONL {\"prompt\"} / {\"messages\"}");
  app.add_flag("--chat", chat, "wrap each plain prompt as a user turn of the model's chat template");
  app.add_option("--chat-template", opt.chat_template, "built-in template to use instead of the model's");
  app.add_option("--engine", opt.engine, "paged (continuous batching) or static (fixed shape)")
      ->check(CLI::IsMember({"paged", "static"}));
  app.add_option("--block-size", opt.block_size, "paged engine: tokens per KV block (8, 16, 32)");
  infer::programs::add_shape_flags(app, opt.engine_options.static_shape);
  app.add_option("--kv-cache-memory", kv_memory, "KV cache size, e.g. 512M, 2G (default: 512M paged; the shape's need, static)");
  app.add_option("--max-model-len", opt.engine_options.max_model_len, "longest prompt + output (0 = the model's)");
  app.add_option("--max-num-seqs", opt.engine_options.scheduler.max_num_seqs, "sequences per step at most");
  app.add_option("--max-num-batched-tokens", opt.engine_options.scheduler.max_num_batched_tokens, "tokens per step at most");
  app.add_flag("--no-prefix-caching", no_prefix_caching, "do not reuse KV blocks of identical prompt prefixes");
  app.add_option("--max-tokens", sp.max_tokens, "tokens to generate at most");
  app.add_option("--min-tokens", sp.min_tokens, "tokens to generate before EOS/stop may end");
  app.add_option("--temperature", sp.temperature, "0 = greedy");
  app.add_option("--top-p", sp.top_p);
  app.add_option("--top-k", sp.top_k);
  app.add_option("--min-p", sp.min_p);
  app.add_option("--repetition-penalty", sp.repetition_penalty);
  app.add_option("--presence-penalty", sp.presence_penalty);
  app.add_option("--frequency-penalty", sp.frequency_penalty);
  app.add_option("--seed", seed, "per-request seed: same seed, same output");
  app.add_option("--n", sp.n, "samples per prompt");
  app.add_option("--stop", sp.stop, "stop string (repeatable)");
  app.add_option("--stop-token-ids", sp.stop_token_ids, "token ids that end generation");
  app.add_flag("--ignore-eos", sp.ignore_eos, "keep generating past EOS");
  app.add_flag("--json", as_json, "print one JSON document");
  app.add_option("--trace", trace_file, "write every engine step (plan, admissions, preemptions, blocks) as JSONL");
  bool data_parallel = false;
  app.add_flag("--data-parallel", data_parallel,
               "under mpirun -np N: one engine per rank (the local rank's GPU), the prompts split across the ranks, "
               "the results printed by rank 0 in prompt order");
  int tp_size = 1;
  app.add_option("--tensor-parallel-size", tp_size,
                 "under mpirun -np N: the model split over N ranks, each holding 1/N of its heads, MLP and vocabulary "
                 "(cpu, or cuda over NCCL: one GPU a rank), rank 0 printing")
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  if (data_parallel && tp_size > 1) {
    fmt::print(stderr, "infer-generate: give --data-parallel or --tensor-parallel-size, not both\n");
    return 2;
  }
  // MPI starts before anything touches CUDA, so that each rank sees only its own GPU.
  infer::programs::DataParallelJob job("infer-generate", data_parallel);
  if (!job.ok()) return 2;
  infer::programs::TensorParallelJob tp("infer-generate", tp_size);
  if (!tp.ok()) return tp.fail(2);
  spec.tensor_parallel = tp.group();
  const int rank = job.rank() + tp.rank();  // one of them is 0
  const auto fail = [&](int code) { return tp.group() ? tp.fail(code) : job.fail(code); };
  const auto who = [&] { return tp.group() ? tp.who() : job.who(); };
  // Every tensor-parallel rank must sample the same tokens: unseeded requests take seeds from rank 0's.
  const bool derive_seeds = tp.group() != nullptr && !seed;
  const std::uint64_t tp_seed = derive_seeds ? tp.common_seed() : 0;
  sp.seed = seed;
  opt.engine_options.enable_prefix_caching = !no_prefix_caching;

  if (const auto code = infer::programs::prepare_engine_file("infer-generate", engine_file, spec, opt,
                                                             tp.place()))
    return fail(*code);
  if (const auto code = infer::programs::resolve_backend_or_exit("infer-generate", spec.backend)) return *code;
  if (!tp.attach("infer-generate", spec)) return fail(2);
  try {
    spec.validate();
    if (!kv_memory.empty()) opt.engine_options.kv_cache_bytes = infer::parse_memory_size(kv_memory);
    std::vector<Prompt> prompts;
    for (const auto& p : prompt_args)
      prompts.push_back(plain(p, chat));
    if (!prompts_file.empty()) {
      auto more = read_prompts(prompts_file, chat);
      prompts.insert(prompts.end(), more.begin(), more.end());
    }
    if (prompts.empty()) {
      fmt::print(stderr, "infer-generate: no prompts: give them as arguments or with --prompts FILE\n");
      return fail(2);
    }
    const infer::dist::ItemRange mine = job.share(prompts.size());
    sp.validate();
    if (job.parallel()) {  // one progress bar (rank 0's share) and one summary (the job's, below) for the job
      opt.progress = rank == 0;
      opt.summary = false;
    }
    if (tp.group()) {  // every rank runs the whole job; rank 0 speaks for it
      opt.progress = opt.progress && rank == 0;
      opt.summary = opt.summary && rank == 0;
    }
    infer::LLM llm(spec, opt);
    if (!trace_file.empty()) llm.set_step_observer(infer::JsonlTraceWriter(std::filesystem::path(trace_file)));

    // Render chat prompts, tokenize everything, then run the whole batch at once.
    std::vector<std::vector<std::int32_t>> ids;
    std::vector<std::string> shown;
    std::vector<infer::SamplingParams> params;
    for (std::size_t i = mine.begin; i < mine.end; ++i) {  // this rank's prompts (all of them without DP)
      const Prompt& p = prompts[i];
      params.push_back(sp);
      if (derive_seeds) params.back().seed = tp_seed + i;
      params.back().priority = p.priority;
      params.back().tag = p.tag;
      if (p.messages.empty()) {
        shown.push_back(p.text);
        ids.push_back(llm.tokenizer().encode(p.text));
      } else {
        shown.push_back(llm.chat_template().apply(p.messages, /*add_generation_prompt=*/true));
        ids.push_back(llm.encode_chat(shown.back()));
      }
    }
    const auto results = ids.empty() ? std::vector<infer::RequestOutput>{} : llm.generate_ids(ids, params);
    const auto& sum = llm.last_summary();

    json items = json::array();
    for (std::size_t j = 0; j < results.size(); ++j) {
      const auto& r = results[j];
      const std::size_t i = mine.begin + j;  // the prompt's index in the whole list
      json outs = json::array();
      for (const auto& o : r.outputs)
        outs.push_back({{"index", o.index}, {"text", o.text}, {"token_ids", o.token_ids},
                        {"finish_reason", std::string(infer::to_string(o.finish_reason))}});
      items.push_back({{"index", i}, {"prompt", shown[j]}, {"prompt_token_ids", r.prompt_token_ids}, {"outputs", outs},
                       {"priority", prompts[i].priority}, {"tag", prompts[i].tag},
                       {"metrics", {{"prompt_tokens", r.metrics.prompt_tokens},
                                    {"cached_prompt_tokens", r.metrics.cached_prompt_tokens},
                                    {"output_tokens", r.generated_tokens()},
                                    {"preemptions", r.metrics.preemptions},
                                    {"ttft_ms", r.metrics.ttft_s() * 1e3},
                                    {"latency_ms", r.metrics.latency_s() * 1e3}}}});
    }
    if (tp.group() && rank != 0) return 0;  // rank 0 prints the job's results
    const auto st = llm.stats();
    json run{{"rank", rank}, {"prompts", {mine.begin, mine.end}}, {"summary", summary_json(sum)},
             {"kv_cache", {{"at_peak", kv_json(sum.kv_at_peak)},
                           {"max_wasted_slots_per_sequence", sum.max_wasted_slots_per_sequence},
                           {"after_run", kv_json(llm.kv_stats())}}},
             {"engine_stats", {{"steps", st.steps}, {"computed_tokens", st.computed_tokens},
                               {"generated_tokens", st.generated_tokens}, {"preemptions", st.preemptions}}}};
    std::vector<json> per_rank;
    if (job.parallel()) {
      // Each rank's items and run to rank 0: rank order is prompt order (split_evenly).
      const std::vector<json> parts = job.gather(json{{"items", items}, {"run", run}});
      if (rank != 0) return 0;  // rank 0 prints the job's results
      items = json::array();
      for (const json& part : parts) {
        for (const json& item : part.at("items")) items.push_back(item);
        per_rank.push_back(part.at("run"));
      }
      const json sum_all = merge_summaries(per_rank);
      fmt::print(stderr,
                 "infer: data parallel over {} ranks: {} requests, {} prompt tokens ({} from the prefix cache), {} output "
                 "tokens in {:.2f} s: {:.1f} output tok/s, {:.1f} total tok/s, mean time to first token {:.1f} ms\n",
                 job.ranks(), sum_all.at("requests").get<std::int64_t>(), sum_all.at("prompt_tokens").get<std::int64_t>(),
                 sum_all.at("cached_prompt_tokens").get<std::int64_t>(), sum_all.at("output_tokens").get<std::int64_t>(),
                 sum_all.at("seconds").get<double>(), sum_all.at("output_tokens_per_s").get<double>(),
                 sum_all.at("total_tokens_per_s").get<double>(), sum_all.at("mean_ttft_ms").get<double>());
    }

    if (!as_json) {
      for (const json& item : items) {
        fmt::print("=== prompt {} ===\n{}\n", item.at("index").get<std::size_t>(), item.at("prompt").get<std::string>());
        for (const json& o : item.at("outputs"))
          fmt::print("--- completion {} ({}) ---\n{}\n", o.at("index").get<int>(), o.at("finish_reason").get<std::string>(),
                     o.at("text").get<std::string>());
      }
      return 0;
    }
    json doc{{"model", spec.dummy.empty() ? spec.model.string() : "dummy:" + spec.dummy},
             {"backend", spec.backend},
             {"engine", opt.engine},
             {"block_size", opt.engine == "paged" ? json(opt.block_size) : json(nullptr)},
             {"static_shape", opt.engine == "static" ? json{{"max_batch", llm.info().max_num_seqs},
                                                           {"max_input", llm.info().max_input},
                                                           {"max_output", llm.info().max_output}}
                                                     : json(nullptr)},
             {"results", items}};
    if (per_rank.empty()) {
      doc["summary"] = run.at("summary");
      doc["kv_cache"] = run.at("kv_cache");
      doc["engine_stats"] = run.at("engine_stats");
    } else {  // data parallel: the job's summary, and each rank's run (its prompts, summary, KV cache, steps)
      doc["data_parallel"] = job.ranks();
      doc["summary"] = merge_summaries(per_rank);
      doc["ranks"] = per_rank;
    }
    fmt::print("{}\n", doc.dump(1));
    return 0;
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-generate: {}{} error: {}\n", who(), infer::to_string(e.code()), e.what());
    return fail(1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-generate: {}error: {}\n", who(), e.what());
    return fail(1);
  }
}
