// build_engine_file (include/infer/engine/engine_build.hpp): the Llama-family weights through each CPU
// Quantizer, written as an engine file (the cuda backend's weights: kernels/cuda/engine_build.cpp). The
// weights' layout depends on the Quantizer alone, not on the engine kind or attention policy, so one
// instantiation per Quantizer serves every engine.
#include "infer/engine/engine_build.hpp"

#include <memory>

#include "infer/dist/communicator.hpp"
#include "infer/model/llama_weights.hpp"
#include "infer/version.hpp"

namespace infer {

namespace {

template <class Q>
EngineBuildReport write_weights(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out) {
  info.quantizer_layout = std::string(Q::name);
  return detail::write_engine_file(src, std::move(info), out, [&](EngineFileWriter& writer, EngineFileInfo&) {
    auto weights = std::make_unique<const LlamaWeights<Q, cpu>>(load_llama_weights<Q, cpu>(src));
    save_llama_weights(*weights, writer);
    return weights;
  });
}

}  // namespace

EngineBuildReport build_engine_file(const ModelSpec& spec, const LlmOptions& options, const std::filesystem::path& out,
                                    TensorParallel place) {
  using detail::cat;
  spec.validate();
  options.engine_options.validate();
  require<InvalidArgument>(place.valid(), "build_engine_file: rank ", place.rank, " of a group of ", place.size);
  const std::string backend = resolve_backend(spec.backend);
  check_engine_choice(backend, options);
  if (!place.split() && spec.tensor_parallel != nullptr) place = {spec.tensor_parallel->rank(), spec.tensor_parallel->size()};
  ModelSpec whole = spec;  // the shard is cut from the whole model here, with no group: nothing is exchanged
  whole.tensor_parallel = nullptr;
  whole.tensor_parallel_device = nullptr;
  const ModelSource src = place.split() ? ModelSource::shard(whole.open(), place) : whole.open();
  EngineFileInfo info;
  info.library_version = INFER_VERSION;
  info.backend = backend;
  info.architecture = engine_file_architecture(backend);
  info.engine = options.engine;
  info.block_size = options.block_size;
  info.quantizer = options.quantizer;
  info.engine_options = options.engine_options;
  info.config = src.config();  // a shard's: its heads and MLP width
  info.tensor_parallel = src.tensor_parallel();
  info.model = src.describe();
  info.model_name = spec.name();
  // The FP8 KV-cache scales the checkpoint ships, for an engine that runs with --kv-cache-dtype fp8 later.
  for (std::int64_t l = 0; l < info.config.num_layers; ++l)
    if (const auto s = src.kv_cache_scales(l)) {
      if (info.kv_cache_scales.empty()) info.kv_cache_scales.resize(static_cast<std::size_t>(info.config.num_layers), {1.0f, 1.0f});
      info.kv_cache_scales[static_cast<std::size_t>(l)] = {s->k, s->v};
    }
  if (backend == "cuda") {
#if defined(INFER_HAVE_CUDA)
    return detail::build_cuda_engine_file(src, std::move(info), out);
#else
    throw DeviceError("infer-build --backend cuda: this build has no CUDA backend; use --backend cpu");
#endif
  }
  if (options.quantizer == "int8") return write_weights<Int8WeightOnly>(src, std::move(info), out);
  if (options.quantizer == "fp8") return write_weights<Fp8>(src, std::move(info), out);
  if (options.quantizer == "int4") return write_weights<Int4>(src, std::move(info), out);
  return write_weights<F32>(src, std::move(info), out);
}

}  // namespace infer
