// The cuda half of build_engine_file (include/infer/engine/engine_build.hpp): the weights loaded onto the
// GPU through the Quantizer exactly as the engine loads them (FP8, INT8 and INT4 quantized there, GGUF blocks kept), then
// the weight arena copied back and written whole, so that loading the file is one upload; and the prefill
// GEMMs' algorithm picks, timed on this GPU.
#include <memory>
#include <type_traits>
#include <vector>

#include "infer/engine/engine_build.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/model/llama_cuda_weights.hpp"

namespace infer::detail {

namespace {

template <class Q>
EngineBuildReport write_cuda_weights(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out) {
  info.quantizer_layout = std::string(Q::name);
  return write_engine_file(src, std::move(info), out, [&](EngineFileWriter& writer, EngineFileInfo& file_info) {
    const backend::cuda::Stream stream;
    const LlamaCudaWeights<Q> weights(src, stream.handle());
    stream.synchronize();
    // The prefill GEMMs' cuBLASLt picks, timed now for every layer shape and bucket of rows rather than on the
    // first steps of every run; the loaded model's Gemm takes them (LlamaModel<cuda>). Fp8's GEMMs are cuBLASLt
    // FP8, always the heuristic's pick: nothing to time. Every other quantizer multiplies bf16 above the GEMV's
    // rows (its weights, or them dequantized into the scratch).
    if constexpr (!std::is_same_v<Q, Fp8>) {
      kernels::cuda::Gemm gemm;
      const auto shapes = weights.gemm_shapes();
      gemm.tune(shapes, stream.handle());
      file_info.gemm_algorithms = gemm.measured_algorithms();
    }
    auto host = std::make_unique<std::vector<std::byte>>();
    weights.save(src.config(), writer, *host);
    return host;  // the part "arena" borrows it; the device copy is freed here
  });
}

}  // namespace

EngineBuildReport build_cuda_engine_file(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out) {
  if (info.quantizer == "fp8") return write_cuda_weights<Fp8>(src, std::move(info), out);
  if (info.quantizer == "int8") return write_cuda_weights<Int8WeightOnly>(src, std::move(info), out);
  if (info.quantizer == "int4") return write_cuda_weights<Int4>(src, std::move(info), out);
  if (info.quantizer == "bf16") return write_cuda_weights<Bf16>(src, std::move(info), out);
  return write_cuda_weights<GgufInPlace>(src, std::move(info), out);
}

}  // namespace infer::detail
