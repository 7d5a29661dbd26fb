// infer-build: a model built ahead into an engine file (TensorRT-LLM's trtllm-build), loaded later by every
// program's --engine-file with no decoding or quantization.
//
//   infer-build --model MODEL --output F [--backend cpu|cuda] [--engine paged|static] [--block-size N] [--quantizer Q]
//               [--max-batch B --max-input I --max-output O] [--max-model-len L] [--gpu-memory-utilization U]
//   infer-build --dummy llama3-8b --tokenizer MODEL --output F ...    a shape with seeded random weights
//   infer-build --tensor-parallel-size N --output F ...    one file per rank of an N-way tensor-parallel split
//               (F.tp<N>-rank<r> before F's extension, as trtllm-build writes rank<r>.engine), built in turn by
//               this one process; `mpirun -np N PROGRAM --tensor-parallel-size N --engine-file F` loads them
//
// Prints what it built (and --json: the same as one JSON document). Exit 1 with a typed error when the
// model cannot be loaded or the file cannot be written, 2 when the backend asked for is not there.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "program_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Build an engine file from a model", "infer-build"};
  infer::ModelSpec spec;
  spec.backend = "cpu";
  infer::LlmOptions opt;
  std::filesystem::path output;
  bool as_json = false;
  int tp_size = 1;
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
  app.add_option("--tensor-parallel-size", tp_size,
                 "split the model over N ranks: one engine file per rank, all built here (no mpirun)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--json", as_json, "print what was built as one JSON document");
  CLI11_PARSE(app, argc, argv);

  // Every rank's file is built by this one process: under mpirun each rank would build (and write) them all.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* n = std::getenv(var); n != nullptr && std::atoi(n) > 1) {
      fmt::print(stderr, "infer-build: run it as one process (not under mpirun): --tensor-parallel-size N builds every "
                         "rank's engine file here\n");
      return 2;
    }
  if (const auto code = infer::programs::resolve_backend_or_exit("infer-build", spec.backend)) return *code;
  try {
    nlohmann::json files = nlohmann::json::array();
    for (int rank = 0; rank < tp_size; ++rank) {
      const infer::TensorParallel place{rank, tp_size};
      const std::filesystem::path file = infer::tensor_parallel_engine_path(output, place);
      const infer::EngineBuildReport r = infer::build_engine_file(spec, opt, file, place);
      const auto& i = r.info;
      if (as_json) {
        files.push_back({{"engine_file", file.string()}, {"bytes", r.file_bytes}, {"parts", r.parts},
                         {"model", i.model},                {"backend", i.backend}, {"architecture", i.architecture},
                         {"engine", i.engine},              {"quantizer", i.quantizer},
                         {"quantizer_layout", i.quantizer_layout}, {"library_version", i.library_version},
                         {"tensor_parallel", {{"rank", rank}, {"size", tp_size}}},
                         {"load_seconds", r.load_seconds},  {"write_seconds", r.write_seconds}});
        continue;
      }
      fmt::print("built {} ({:.1f} MB, {} arrays) from {}\n", file.string(), static_cast<double>(r.file_bytes) / 1e6,
                 r.parts, i.model);  // a shard's model says its rank
      fmt::print("  {} engine{}, quantizer {} ({}), backend {} ({}), infer {}\n", i.engine,
                 i.engine == "paged" ? fmt::format(", block size {}", i.block_size)
                                     : fmt::format(", shape {}x({}+{})", i.engine_options.static_shape.max_batch,
                                                   i.engine_options.static_shape.max_input,
                                                   i.engine_options.static_shape.max_output),
                 i.quantizer, i.quantizer_layout, i.backend, i.architecture, i.library_version);
      fmt::print("  loading through the quantizer {:.2f} s, writing {:.2f} s\n", r.load_seconds, r.write_seconds);
    }
    if (as_json) fmt::print("{}\n", (tp_size == 1 ? files.at(0) : nlohmann::json{{"engine_files", files}}).dump(1));
    return 0;
  } catch (const infer::Error& e) {
    fmt::print(stderr, "infer-build: {} error: {}\n", infer::to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "infer-build: error: {}\n", e.what());
    return 1;
  }
}
