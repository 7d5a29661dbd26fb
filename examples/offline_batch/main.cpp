// infer-offline-batch: the offline batch job a vLLM user runs first (its offline inference example), on
// either engine and either backend: 50 prompts — 25 of one question, 25 of another — sampled at
// temperature 0.7, top-p 0.8, up to 256 tokens each, with a progress bar; then the number of requests, the
// elapsed time, the generated tokens, tokens/s, and the first 3 answers.
//
//   infer-offline-batch --model MODEL [--backend cpu|cuda|auto] [--engine paged|static] [--prompts N]
//   infer-offline-batch --dummy qwen2.5-7b --tokenizer MODEL --backend cuda    (a 7B shape, random weights)
//   infer-offline-batch --dummy qwen2.5-7b --tokenizer tokenizer.json --chat-template chatml
//     (a bare tokenizer.json carries no chat template: name a built-in one)
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <string>
#include <vector>

#include "infer/engine/llm.hpp"
#include "program_flags.hpp"

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
  CLI11_PARSE(app, argc, argv);

  if (const auto code = infer::programs::prepare_engine_file("infer-offline-batch", engine_file, spec, opt)) return *code;
  if (const auto code = infer::programs::resolve_backend_or_exit("infer-offline-batch", spec.backend)) return *code;
  try {
    spec.validate();
    sp.validate();
    opt.summary = false;  // the program prints its own
    infer::LLM llm(spec, opt);
    const std::vector<std::string> questions = {"What is the capital of France?",
                                                "Explain what a large language model is in one paragraph."};
    std::vector<std::vector<infer::ChatMessage>> conversations;
    for (int i = 0; i < num_prompts; ++i)
      conversations.push_back({{"user", questions[static_cast<std::size_t>(i * 2 / num_prompts)]}});
    const auto results = llm.chat(conversations, sp);
    const auto& s = llm.last_summary();
    const auto info = llm.info();
    fmt::print("{} requests on the {} engine ({}), {:.2f} s: {} tokens generated, {:.1f} tokens/s\n", s.requests,
               info.kind, info.backend, s.seconds, s.output_tokens, s.output_tokens_per_s());
    for (int i = 0; i < shown && i < num_prompts; ++i) {
      const auto& c = conversations[static_cast<std::size_t>(i)];
      fmt::print("\n--- {} ---\n{}\n", c.back().content, results[static_cast<std::size_t>(i)].outputs.at(0).text);
    }
    return 0;
  } catch (const infer::ChatTemplateError& e) {
    fmt::print(stderr, "infer-offline-batch: {}; here: --chat-template chatml|llama3|llama3.1|mistral\n", e.what());
    return 1;
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-offline-batch: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  }
}
