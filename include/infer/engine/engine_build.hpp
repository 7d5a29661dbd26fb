#pragma once
/// \file
/// `build_engine_file`: what `infer-build` does, as a function. It loads a model (GGUF, an HF folder or a
/// dummy shape) through the Quantizer that `options` name, exactly as the engine would, and writes an
/// engine file (io/engine_file.hpp): what it was built for (library version, backend, architecture, engine
/// kind, block size, static shape, max_model_len, quantizer, ModelConfig, tokenizer and chat template) and
/// the weights in the Quantizer's runtime layout. Loading that file skips decoding and quantization.
///
/// `options.engine_options` is recorded as given; the run-time settings among them (KV cache size,
/// scheduler limits) are defaults that a run may change (engine_file_options).
///
/// Compiled once (kernels/cpu/engine_build.cpp). The cpu backend only so far: the CUDA weight loader does
/// not read or write parts yet (UnsupportedError).

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "infer/engine/engine_registry.hpp"
#include "infer/io/engine_file.hpp"

namespace infer {

struct EngineBuildReport {
  EngineFileInfo info;
  std::uint64_t file_bytes = 0;  ///< the engine file's size
  std::size_t parts = 0;         ///< arrays written
  double load_seconds = 0;       ///< loading the model through the Quantizer
  double write_seconds = 0;
};

/// Builds `out` from `spec` for the engine `options` name. Errors: ModelSpec::validate's, check_engine_choice's,
/// what loading throws, UnsupportedError for the cuda backend, IoError naming `out` when it cannot be written
/// (nothing is left at `out` then).
EngineBuildReport build_engine_file(const ModelSpec& spec, const LlmOptions& options, const std::filesystem::path& out);

}  // namespace infer
