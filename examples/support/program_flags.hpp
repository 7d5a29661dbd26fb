#pragma once
/// \file
/// The flags every program that loads a model shares (infer-generate, infer-chat, infer-offline-batch,
/// infer-serve, the bench programs), so that each means the same everywhere: what to load and where
/// (`ModelSpec`: --model or --dummy with --tokenizer, --backend), the static engine's shape, and the
/// rule that a backend that is not there ends the program with exit code 2 and a message.

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "infer/engine/engine_build.hpp"
#include "infer/engine/engine_registry.hpp"

namespace infer::programs {

/// --model / --dummy (one of them), --dummy-seed, --tokenizer, --backend cpu|cuda|auto into `spec`.
inline void add_model_flags(CLI::App& app, ModelSpec& spec) {
  auto* model = app.add_option("--model,-m", spec.model, "a .gguf file or a Hugging Face model folder");
  auto* dummy = app.add_option("--dummy", spec.dummy,
                               std::string("or a model shape with seeded random weights (vLLM's --load-format dummy): ") +
                                   std::string(kDummyPresets) + ", or a config.json");
  model->excludes(dummy);
  app.add_option("--dummy-seed", spec.dummy_seed, "seed of the dummy weights");
  app.add_option("--tokenizer", spec.tokenizer,
                 "--dummy: a model file (its tokenizer) or an HF tokenizer.json that turns text into ids");
  app.add_option("--backend", spec.backend, "cpu, cuda, or auto (the GPU when one is present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
}

/// --max-batch, --max-input, --max-output: the static engine's shape.
inline void add_shape_flags(CLI::App& app, Shape& shape) {
  app.add_option("--max-batch", shape.max_batch, "static engine: slots (sequences at once)")->capture_default_str();
  app.add_option("--max-input", shape.max_input, "static engine: longest prompt")->capture_default_str();
  app.add_option("--max-output", shape.max_output, "static engine: most tokens generated")->capture_default_str();
}

/// --kv-cache-dtype auto|fp8|fp8_e4m3 (vLLM's flag): what the KV cache stores (kv_dtype.hpp).
inline void add_kv_cache_dtype_flag(CLI::App& app, KvCacheDtype& dtype) {
  app.add_option_function<std::string>(
         "--kv-cache-dtype", [&dtype](const std::string& s) { dtype = parse_kv_cache_dtype(s); },
         "auto (the model's type: f32 on the CPU, bf16 on the GPU) or fp8 (e4m3 codes, half of bf16's bytes)")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3"}));
}

/// --engine-file, --build-if-missing, --rebuild: TensorRT-LLM's build-once flow.
struct EngineFileFlags {
  std::filesystem::path file;
  bool build_if_missing = false;
  bool rebuild = false;
};

inline void add_engine_file_flags(CLI::App& app, EngineFileFlags& f) {
  app.add_option("--engine-file", f.file,
                 "an engine file built ahead by infer-build (it fixes the engine, quantizer and shape it was built for)");
  app.add_flag("--build-if-missing", f.build_if_missing,
               "with --engine-file and --model/--dummy: build the engine file first when it does not exist, with the "
               "engine, quantizer and shape flags given");
  app.add_flag("--rebuild", f.rebuild, "with --engine-file and --model/--dummy: build the engine file even when it exists");
}

/// With --engine-file: builds the file when asked (--rebuild, or --build-if-missing and it is absent) from
/// `spec` with `options`, saying so on stderr, then points `spec` at it (the model, dummy shape and tokenizer
/// flags only say what to build from). In a tensor-parallel job (`place`: this process's rank) the file is the
/// rank's (tensor_parallel_engine_path: "F" -> "F.tp<N>-rank<r>" before the extension), as infer-build
/// --tensor-parallel-size writes them, and a build builds this rank's shard. InvalidArgument when the file is
/// missing and no build was asked for, or a build was asked for without a model. Nothing happens without
/// --engine-file.
inline void use_engine_file(const char* program, const EngineFileFlags& f, ModelSpec& spec, const LlmOptions& options,
                            TensorParallel place = {}) {
  using detail::cat;
  if (f.file.empty()) {
    if (f.build_if_missing || f.rebuild)
      throw InvalidArgument("--build-if-missing and --rebuild build an engine file: give --engine-file FILE");
    return;
  }
  const std::filesystem::path file = tensor_parallel_engine_path(f.file, place);
  std::error_code ec;
  const bool exists = std::filesystem::exists(file, ec);
  if (f.rebuild || (!exists && f.build_if_missing)) {
    if (spec.model.empty() && spec.dummy.empty())
      throw InvalidArgument(cat("building engine file '", file.string(), "' needs the model to build it from: ",
                                "give --model PATH or --dummy SHAPE"));
    const auto t0 = std::chrono::steady_clock::now();
    const EngineBuildReport r = build_engine_file(spec, options, file, place);
    std::fprintf(stderr, "%s: built engine file '%s' from %s (%s engine, quantizer %s, %.1f MB) in %.1f s\n", program,
                 file.string().c_str(), r.info.model.c_str(), r.info.engine.c_str(), r.info.quantizer.c_str(),
                 static_cast<double>(r.file_bytes) / 1e6,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else if (!exists) {
    if (place.split())
      throw InvalidArgument(cat("engine file '", file.string(), "' (", place.describe(), " of '", f.file.string(),
                                "') does not exist: build the ranks' files with infer-build --tensor-parallel-size ",
                                place.size, " --output ", f.file.string(), ", or add --build-if-missing with --model"));
    throw InvalidArgument(cat("engine file '", file.string(), "' does not exist: build it with infer-build, or add ",
                              "--build-if-missing with --model"));
  }
  spec.model = file;
  spec.dummy.clear();
  spec.tokenizer.clear();
}

/// use_engine_file, then the file's engine settings into `options` and its backend into `spec`
/// (apply_engine_file). Prints "program: error" and returns exit code 1 on failure; call it before
/// resolve_backend_or_exit, so "auto" takes the file's backend.
inline std::optional<int> prepare_engine_file(const char* program, const EngineFileFlags& f, ModelSpec& spec,
                                              LlmOptions& options, TensorParallel place = {}) {
  try {
    use_engine_file(program, f, spec, options, place);
    apply_engine_file(spec, options);
    return std::nullopt;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s error: %s\n", program, std::string(to_string(e.code())).c_str(), e.what());
    return 1;
  }
}

/// Resolves `backend` ("auto" → cpu or cuda) in place; when the backend asked for is not there, prints
/// "program: why" and returns the exit code 2.
inline std::optional<int> resolve_backend_or_exit(const char* program, std::string& backend) {
  try {
    backend = resolve_backend(backend);
    return std::nullopt;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
}

}  // namespace infer::programs
