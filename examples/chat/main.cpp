// infer-chat: an interactive chat in the terminal, streaming the reply token by token.
//
//   infer-chat --model MODEL [--system TEXT] [--temperature T] [--max-tokens N] [--seed S] [--backend cpu|cuda|auto]
// Type a message and press enter; /reset starts a new conversation, /exit (or end of input) quits.
// Each turn re-renders the whole conversation with the model's chat template; the paged engine's prefix
// cache finds the earlier turns' KV blocks, so only the new turn is computed.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "infer/engine/engine_registry.hpp"
#include "infer/tokenizer/chat_template.hpp"
#include "program_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Chat with a model in the terminal", "infer-chat"};
  std::string system, chat_template;
  infer::ModelSpec spec;
  spec.backend = "auto";
  infer::LlmOptions opt;
  infer::SamplingParams sp;
  sp.temperature = 0.7f;
  sp.top_p = 0.9f;
  sp.max_tokens = 256;
  std::optional<std::uint64_t> seed;
  infer::programs::add_model_flags(app, spec);
  infer::programs::EngineFileFlags engine_file;
  infer::programs::add_engine_file_flags(app, engine_file);
  app.add_option("--gpu-memory-utilization", opt.engine_options.gpu_memory_utilization,
                 "cuda: fraction of the device this engine may use")
      ->check(CLI::Range(0.01, 1.0));
  infer::programs::add_kv_cache_dtype_flag(app, opt.engine_options.kv_cache_dtype);
  app.add_option("--system", system, "a system message opening the conversation");
  app.add_option("--chat-template", chat_template, "built-in template instead of the model's: chatml, llama3, llama3.1, mistral");
  app.add_option("--temperature", sp.temperature);
  app.add_option("--top-p", sp.top_p);
  app.add_option("--max-tokens", sp.max_tokens, "reply length at most");
  app.add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);
  sp.seed = seed;
  const bool tty = ::isatty(STDIN_FILENO);

  if (const auto code = infer::programs::prepare_engine_file("infer-chat", engine_file, spec, opt)) return *code;
  if (const auto code = infer::programs::resolve_backend_or_exit("infer-chat", spec.backend)) return *code;
  try {
    sp.validate();
    // The paged engine: its prefix cache finds the earlier turns of the conversation.
    const auto engine = infer::make_engine(spec, opt);
    const infer::Tokenizer* tok = engine->tokenizer();
    infer::require<infer::InvalidArgument>(tok != nullptr, "the model has no tokenizer");
    const auto tmpl = chat_template.empty() ? infer::ChatTemplate::from_source(tok->chat_template_source())
                                            : infer::ChatTemplate::from_name(chat_template);
    std::vector<infer::ChatMessage> history;
    if (!system.empty()) history.push_back({"system", system});
    if (tty)
      fmt::print("infer-chat: {} on {} — /reset for a new conversation, /exit to quit\n", spec.name(), spec.backend);

    std::string line;
    while (true) {
      if (tty) fmt::print("\n> ");
      std::fflush(stdout);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line == "/reset") {
        history.resize(system.empty() ? 0 : 1);
        fmt::print("(new conversation)\n");
        continue;
      }
      if (line.empty()) continue;
      history.push_back({"user", line});
      infer::EncodeOptions opts;
      opts.add_bos = false;
      const auto prompt = tok->encode(tmpl.apply(history, /*add_generation_prompt=*/true), opts);
      std::string reply;
      try {
        engine->add_request(prompt, sp);
      } catch (const infer::InvalidArgument& e) {
        fmt::print(stderr, "infer-chat: {}\n", e.what());  // e.g. the conversation outgrew the context
        history.pop_back();
        continue;
      }
      while (engine->has_unfinished()) {
        for (const auto& out : engine->step()) {
          fmt::print("{}", out.outputs[0].delta_text);
          std::fflush(stdout);
          reply += out.outputs[0].delta_text;
        }
      }
      fmt::print("\n");
      history.push_back({"assistant", reply});
    }
    return 0;
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-chat: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  }
}
