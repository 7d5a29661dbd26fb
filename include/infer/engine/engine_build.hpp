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
/// Compiled once (kernels/cpu/engine_build.cpp; the cuda backend's weights in kernels/cuda/engine_build.cpp,
/// which loads them onto the GPU through the Quantizer, as the engine would, and writes its weight arena).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>

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

/// Builds `out` from `spec` for the engine `options` name: the whole model, or with `place` split (or
/// `spec.tensor_parallel`'s rank, when place is {0, 1}) that rank's shard, which only that rank of a job of that
/// size loads (EngineFileInfo::tensor_parallel; tensor_parallel_engine_path names the ranks' files). A shard is
/// built without its group: no collective runs. Errors: ModelSpec::validate's, check_engine_choice's, what
/// loading throws, ModelSource::shard's, DeviceError for the cuda backend in a build without it, IoError naming
/// `out` when it cannot be written (nothing is left at `out` then).
EngineBuildReport build_engine_file(const ModelSpec& spec, const LlmOptions& options, const std::filesystem::path& out,
                                    TensorParallel place = {});

namespace detail {

/// The file's writing, shared by the backends: `fill(writer, info)` loads the weights, adds their parts, may
/// complete `info` (the cuda backend's GEMM picks) and returns what owns the arrays those parts borrow (kept
/// until the file is written); its time is the report's load_seconds.
template <class Fill>
EngineBuildReport write_engine_file(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out,
                                    Fill&& fill) {
  using Clock = std::chrono::steady_clock;
  EngineBuildReport report;
  const auto t0 = Clock::now();
  EngineFileWriter writer;
  const auto owner = fill(writer, info);
  const auto t1 = Clock::now();
  std::optional<TokenizerSpec> tokenizer;
  if (src.tokenizer()) tokenizer = src.tokenizer()->spec();
  report.file_bytes = writer.write(out, info, tokenizer);
  report.parts = writer.parts();
  report.load_seconds = std::chrono::duration<double>(t1 - t0).count();
  report.write_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  report.info = std::move(info);
  return report;
}

#if defined(INFER_HAVE_CUDA)
/// The cuda half of build_engine_file: `info` filled in but for quantizer_layout, which the Quantizer that
/// `info.quantizer` names sets (auto: GgufInPlace, bf16: Bf16, fp8: Fp8, int8: Int8WeightOnly, int4: Int4).
EngineBuildReport build_cuda_engine_file(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out);
#endif

}  // namespace detail

}  // namespace infer
