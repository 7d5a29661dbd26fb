// The cuda half of build_engine_file (include/infer/engine/engine_build.hpp): the weights loaded onto the
// GPU through the Quantizer exactly as the engine loads them (FP8, INT8 and INT4 quantized there, GGUF blocks kept), then
// the weight arena copied back and written whole, so that loading the file is one upload.
#include <memory>
#include <vector>

#include "infer/engine/engine_build.hpp"
#include "infer/model/llama_cuda_weights.hpp"

namespace infer::detail {

namespace {

template <class Q>
EngineBuildReport write_cuda_weights(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out) {
  info.quantizer_layout = std::string(Q::name);
  return write_engine_file(src, std::move(info), out, [&](EngineFileWriter& writer) {
    const backend::cuda::Stream stream;
    const LlamaCudaWeights<Q> weights(src, stream.handle());
    stream.synchronize();
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
