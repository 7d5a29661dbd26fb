// infer-perplexity: perplexity of a model over a text with a sliding window (engine/perplexity.hpp), the
// check llama.cpp's and vLLM's users run on a quantization.
//
//   infer-perplexity --model MODEL --file TEXT [--context 512] [--stride 256] [--limit N] [--quantizer Q] [--json]
//   infer-perplexity --engine-file F --file TEXT ...
//
// --limit scores only the text's first N tokens (0: all of it). Prints the perplexity, the mean negative
// log-likelihood, the tokens scored and the windows; --json the same as one document.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "infer/engine/llm.hpp"
#include "infer/engine/perplexity.hpp"
#include "program_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Perplexity of a model over a text (sliding window)", "infer-perplexity"};
  infer::ModelSpec spec;
  spec.backend = "auto";
  infer::LlmOptions opt;
  opt.progress = false;
  opt.summary = false;
  infer::programs::EngineFileFlags engine_file;
  std::string text_file, kv_memory;
  std::int64_t context = 512, stride = 0, limit = 0;
  bool as_json = false;
  infer::programs::add_model_flags(app, spec);
  infer::programs::add_engine_file_flags(app, engine_file);
  app.add_option("--file,-f", text_file, "the text (UTF-8)")->required();
  app.add_option("--context", context, "tokens per window")->capture_default_str();
  app.add_option("--stride", stride, "tokens between window starts (default: half the context)");
  app.add_option("--limit", limit, "score only the text's first N tokens (0: all)");
  app.add_option("--quantizer", opt.quantizer, "int8, fp8 or int4 on either backend; cuda: auto or bf16; cpu: auto (f32)")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8", "int4"}));
  app.add_option("--engine", opt.engine, "paged or static")->check(CLI::IsMember({"paged", "static"}));
  app.add_option("--kv-cache-memory", kv_memory, "KV cache size, e.g. 512M, 2G");
  infer::programs::add_kv_cache_dtype_flag(app, opt.engine_options.kv_cache_dtype);
  app.add_flag("--json", as_json, "print one JSON document");
  CLI11_PARSE(app, argc, argv);
  if (stride == 0) stride = std::max<std::int64_t>(1, context / 2);

  if (const auto code = infer::programs::prepare_engine_file("infer-perplexity", engine_file, spec, opt)) return *code;
  if (const auto code = infer::programs::resolve_backend_or_exit("infer-perplexity", spec.backend)) return *code;
  try {
    spec.validate();
    if (!kv_memory.empty()) opt.engine_options.kv_cache_bytes = infer::parse_memory_size(kv_memory);
    // A window and its one generated token must fit; an engine file fixes this itself.
    if (engine_file.file.empty() && opt.engine_options.max_model_len == 0)
      opt.engine_options.max_model_len = static_cast<std::int32_t>(context + 1);
    if (opt.engine == "static" && engine_file.file.empty())
      opt.engine_options.static_shape = infer::Shape{.max_batch = 8, .max_input = static_cast<std::int32_t>(context), .max_output = 1};
    std::ifstream in(text_file, std::ios::binary);
    if (!in) throw infer::IoError(infer::detail::cat("cannot read --file '", text_file, "'"));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

    const auto t0 = std::chrono::steady_clock::now();
    infer::LLM llm(spec, opt);
    std::vector<std::int32_t> ids = llm.tokenizer().encode(text);
    const auto text_tokens = static_cast<std::int64_t>(ids.size());
    if (limit > 0 && limit < text_tokens) ids.resize(static_cast<std::size_t>(limit));
    const auto windows = infer::perplexity_windows(static_cast<std::int64_t>(ids.size()), context, stride);
    std::vector<std::vector<std::int32_t>> prompts;
    for (const auto& w : windows) prompts.emplace_back(ids.begin() + w.begin, ids.begin() + w.end);
    infer::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 1;
    sp.ignore_eos = true;
    sp.prompt_logprobs = 0;
    const auto t1 = std::chrono::steady_clock::now();
    const auto outputs = llm.generate_ids(prompts, sp);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const infer::PerplexityResult r = infer::perplexity_of(windows, outputs);
    const double load_s = std::chrono::duration<double>(t1 - t0).count();
    std::int64_t computed = 0;
    for (const auto& p : prompts) computed += static_cast<std::int64_t>(p.size());

    if (as_json) {
      const nlohmann::json doc{{"model", spec.model.string()}, {"file", text_file}, {"engine", opt.engine},
                               {"quantizer", opt.quantizer},   {"backend", spec.backend},
                               {"perplexity", r.perplexity()}, {"mean_nll", r.mean_nll()},
                               {"scored_tokens", r.scored},    {"text_tokens", text_tokens},
                               {"windows", windows.size()},    {"context", context}, {"stride", stride},
                               {"seconds", seconds},           {"load_seconds", load_s},
                               {"tokens_per_s", seconds > 0 ? static_cast<double>(computed) / seconds : 0.0}};
      fmt::print("{}\n", doc.dump(1));
      return 0;
    }
    fmt::print("perplexity {:.4f} (mean NLL {:.5f} nats) over {} tokens of {} ({} windows of {} tokens, stride {})\n",
               r.perplexity(), r.mean_nll(), r.scored, text_file, windows.size(), context, stride);
    fmt::print("  {} engine, quantizer {}, backend {}: {:.1f} s ({:.0f} tokens/s computed), loading {:.1f} s\n",
               opt.engine, opt.quantizer, spec.backend, seconds, seconds > 0 ? static_cast<double>(computed) / seconds : 0.0,
               load_s);
    return 0;
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-perplexity: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-perplexity: error: {}\n", e.what());
    return 1;
  }
}
