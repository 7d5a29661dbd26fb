// infer-build: a model built ahead into an engine file (TensorRT-LLM's trtllm-build), loaded later by every
// program's --engine-file with no decoding or quantization.
//
//   infer-build --model MODEL --output F [--backend cpu|cuda] [--engine paged|static] [--block-size N] [--quantizer Q]
//               [--max-batch B --max-input I --max-output O] [--max-model-len L] [--gpu-memory-utilization U]
//   infer-build --dummy llama3-8b --tokenizer MODEL --output F ...    a shape with seeded random weights
//
// Prints what it built (and --json: the same as one JSON document). Exit 1 with a typed error when the
// model cannot be loaded or the file cannot be written, 2 when the backend asked for is not there.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "program_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Build an engine file from a model", "infer-build"};
  infer::ModelSpec spec;
  spec.backend = "cpu";
  infer::LlmOptions opt;
  std::filesystem::path output;
  bool as_json = false;
  infer::programs::add_model_flags(app, spec);
  app.add_option("--output,-o", output, "the engine file to write")->required();
  app.add_option("--engine", opt.engine, "paged (continuous batching) or static (fixed shape)")
      ->check(CLI::IsMember({"paged", "static"}))
      ->capture_default_str();
  app.add_option("--block-size", opt.block_size, "paged engine: tokens per KV block (8, 16, 32)")->capture_default_str();
  app.add_option("--quantizer", opt.quantizer, "int8 (W8A16 per channel), fp8 (W8A8 e4m3) or int4 (W4A16, groups of 128) on either "
                 "backend; cpu: auto (f32); cuda: auto (GGUF blocks kept) or bf16")
      ->check(CLI::IsMember({"auto", "bf16", "int8", "fp8", "int4"}))
      ->capture_default_str();
  infer::programs::add_shape_flags(app, opt.engine_options.static_shape);
  app.add_option("--max-model-len", opt.engine_options.max_model_len, "longest prompt + output (0 = the model's)");
  app.add_option("--gpu-memory-utilization", opt.engine_options.gpu_memory_utilization,
                 "cuda: fraction of the device the engine may use")
      ->check(CLI::Range(0.01, 1.0));
  app.add_flag("--json", as_json, "print what was built as one JSON document");
  CLI11_PARSE(app, argc, argv);

  if (const auto code = infer::programs::resolve_backend_or_exit("infer-build", spec.backend)) return *code;
  try {
    const infer::EngineBuildReport r = infer::build_engine_file(spec, opt, output);
    const auto& i = r.info;
    if (as_json) {
      nlohmann::json doc{{"engine_file", output.string()}, {"bytes", r.file_bytes}, {"parts", r.parts},
                         {"model", i.model},                {"backend", i.backend}, {"architecture", i.architecture},
                         {"engine", i.engine},              {"quantizer", i.quantizer},
                         {"quantizer_layout", i.quantizer_layout}, {"library_version", i.library_version},
                         {"load_seconds", r.load_seconds},  {"write_seconds", r.write_seconds}};
      fmt::print("{}\n", doc.dump(1));
      return 0;
    }
    fmt::print("built {} ({:.1f} MB, {} arrays) from {}\n", output.string(), static_cast<double>(r.file_bytes) / 1e6,
               r.parts, i.model);
    fmt::print("  {} engine{}, quantizer {} ({}), backend {} ({}), infer {}\n", i.engine,
               i.engine == "paged" ? fmt::format(", block size {}", i.block_size)
                                   : fmt::format(", shape {}x({}+{})", i.engine_options.static_shape.max_batch,
                                                 i.engine_options.static_shape.max_input,
                                                 i.engine_options.static_shape.max_output),
               i.quantizer, i.quantizer_layout, i.backend, i.architecture, i.library_version);
    fmt::print("  loading through the quantizer {:.2f} s, writing {:.2f} s\n", r.load_seconds, r.write_seconds);
    return 0;
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-build: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-build: error: {}\n", e.what());
    return 1;
  }
}
