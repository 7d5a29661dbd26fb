// infer-offline-batch: the offline batch job a vLLM user runs first (its offline inference example), on
// either engine and either backend: 50 prompts — 25 of one question, 25 of another — sampled at
// temperature 0.7, top-p 0.8, up to 256 tokens each, with a progress bar; then the number of requests, the
// elapsed time, the generated tokens, tokens/s, and the first 3 answers.
//
//   infer-offline-batch --model MODEL [--backend cpu|cuda|auto] [--engine paged|static] [--prompts N]
//   infer-offline-batch --dummy qwen2.5-7b --tokenizer MODEL --backend cuda    (a 7B shape, random weights)
//   infer-offline-batch --dummy qwen2.5-7b --tokenizer tokenizer.json --chat-template chatml
//     (a bare tokenizer.json carries no chat template: name a built-in one)
//   mpirun -np N infer-offline-batch --data-parallel ...   the classic Ray + vLLM job without Ray: one engine
//     per rank (the local rank's GPU), the prompts split into N chunks, one summary and the answers at rank 0
//   mpirun -np N infer-offline-batch --tensor-parallel-size N ...   one model split over N ranks (cpu; cuda over NCCL)
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data_parallel_job.hpp"
#include "tensor_parallel_job.hpp"
#include "infer/engine/llm.hpp"
#include "program_flags.hpp"

using nlohmann::json;

int main(int argc, char** argv) {
  CLI::App app{"The offline batch job: 50 prompts, sampled, with a summary and the first answers", "infer-offline-batch"};
  infer::ModelSpec spec;
  spec.backend = "auto";
  infer::LlmOptions opt;
  int num_prompts = 50, shown = 3;
  infer::SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_p = 0.8f;
  sp.max_tokens = 256;
  infer::programs::add_model_flags(app, spec);
  infer::programs::EngineFileFlags engine_file;
  infer::programs::add_engine_file_flags(app, engine_file);
  app.add_option("--engine", opt.engine, "paged (continuous batching) or static (fixed shape)")
      ->check(CLI::IsMember({"paged", "static"}));
  infer::programs::add_shape_flags(app, opt.engine_options.static_shape);
  infer::programs::add_kv_cache_dtype_flag(app, opt.engine_options.kv_cache_dtype);
  app.add_option("--prompts", num_prompts, "prompts in all, half of each question")->check(CLI::Range(2, 100000));
  app.add_option("--max-tokens", sp.max_tokens, "tokens per answer at most");
  app.add_option("--chat-template", opt.chat_template,
                 "built-in template instead of the model's: chatml, llama3, llama3.1, mistral");
  app.add_option("--show", shown, "answers to print")->check(CLI::NonNegativeNumber);
  bool data_parallel = false;
  app.add_flag("--data-parallel", data_parallel,
               "under mpirun -np N: one engine per rank (the local rank's GPU), the prompts split across the ranks, "
               "one summary and the answers at rank 0");
  int tp_size = 1;
  app.add_option("--tensor-parallel-size", tp_size,
                 "under mpirun -np N: the model split over N ranks (cpu, or cuda over NCCL: one GPU a rank), rank 0 printing")
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  if (data_parallel && tp_size > 1) {
    fmt::print(stderr, "infer-offline-batch: give --data-parallel or --tensor-parallel-size, not both\n");
    return 2;
  }
  infer::programs::DataParallelJob job("infer-offline-batch", data_parallel);  // before anything touches CUDA
  if (!job.ok()) return 2;
  infer::programs::TensorParallelJob tp("infer-offline-batch", tp_size);
  if (!tp.ok()) return tp.fail(2);
  spec.tensor_parallel = tp.group();
  const auto fail = [&](int code) { return tp.group() ? tp.fail(code) : job.fail(code); };
  const auto who = [&] { return tp.group() ? tp.who() : job.who(); };
  // Tensor-parallel ranks must sample the same tokens: each request's seed derives from rank 0's.
  const std::uint64_t tp_seed = tp.group() ? tp.common_seed() : 0;

  if (const auto code = infer::programs::prepare_engine_file("infer-offline-batch", engine_file, spec, opt,
                                                             tp.place()))
    return fail(*code);
  if (const auto code = infer::programs::resolve_backend_or_exit("infer-offline-batch", spec.backend)) return *code;
  if (!tp.attach("infer-offline-batch", spec)) return fail(2);
  try {
    spec.validate();
    sp.validate();
    opt.summary = false;  // the program prints its own
    opt.progress = job.rank() == 0 && tp.rank() == 0;  // one bar (rank 0's share, or rank 0's run)
    infer::LLM llm(spec, opt);
    const std::vector<std::string> questions = {"What is the capital of France?",
                                                "Explain what a large language model is in one paragraph."};
    std::vector<std::vector<infer::ChatMessage>> conversations;
    for (int i = 0; i < num_prompts; ++i)
      conversations.push_back({{"user", questions[static_cast<std::size_t>(i * 2 / num_prompts)]}});
    const infer::dist::ItemRange mine = job.share(conversations.size());
    const std::vector<std::vector<infer::ChatMessage>> my_conversations(
        conversations.begin() + static_cast<std::ptrdiff_t>(mine.begin),
        conversations.begin() + static_cast<std::ptrdiff_t>(mine.end));
    std::vector<infer::RequestOutput> results;
    if (tp.group()) {  // one seed per request, the same on every rank
      const infer::ChatTemplate tmpl = llm.chat_template();
      std::vector<std::vector<std::int32_t>> ids;
      std::vector<infer::SamplingParams> params(my_conversations.size(), sp);
      for (std::size_t j = 0; j < my_conversations.size(); ++j) {
        ids.push_back(llm.encode_chat(tmpl.apply(my_conversations[j], /*add_generation_prompt=*/true)));
        params[j].seed = tp_seed + j;
      }
      results = llm.generate_ids(ids, params);
      if (tp.rank() != 0) return 0;  // rank 0 prints the job's results
    } else if (!my_conversations.empty()) {
      results = llm.chat(my_conversations, sp);
    }
    const auto& s = llm.last_summary();
    // This rank's counts and answers (the first `shown` of the job are all rank 0 needs), then the job's.
    json answers = json::array();
    for (std::size_t j = 0; j < results.size() && mine.begin + j < static_cast<std::size_t>(shown); ++j)
      answers.push_back(results[j].outputs.at(0).text);
    const std::vector<json> parts = job.gather(
        json{{"requests", s.requests}, {"output_tokens", s.output_tokens}, {"seconds", s.seconds}, {"answers", answers}});
    if (job.rank() != 0) return 0;
    std::int64_t requests = 0, tokens = 0;
    double seconds = 0;  // the job's: its slowest rank's
    std::vector<std::string> texts;
    for (const json& p : parts) {
      requests += p.at("requests").get<std::int64_t>();
      tokens += p.at("output_tokens").get<std::int64_t>();
      seconds = std::max(seconds, p.at("seconds").get<double>());
      for (const json& a : p.at("answers")) texts.push_back(a.get<std::string>());
    }
    const auto info = llm.info();
    const std::string ranks = job.parallel() ? fmt::format(", {} ranks", job.ranks())
                              : tp.group()   ? fmt::format(", tensor parallel over {} ranks", tp_size)
                                             : std::string();
    fmt::print("{} requests on the {} engine ({}{}), {:.2f} s: {} tokens generated, {:.1f} tokens/s\n", requests,
               info.kind, info.backend, ranks,
               seconds, tokens, seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
    for (std::size_t i = 0; i < texts.size(); ++i)
      fmt::print("\n--- {} ---\n{}\n", conversations[i].back().content, texts[i]);
    return 0;
  } catch (const infer::ChatTemplateError& e) {
    fmt::print(stderr, "infer-offline-batch: {}{}; here: --chat-template chatml|llama3|llama3.1|mistral\n", who(),
               e.what());
    return fail(1);
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-offline-batch: {}{} error: {}\n", who(), infer::to_string(e.code()), e.what());
    return fail(1);
  }
}
