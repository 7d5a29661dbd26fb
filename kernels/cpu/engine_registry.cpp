// make_engine (include/infer/engine/engine_registry.hpp), compiled once: the one place that instantiates an
// EngineAdapter for each engine the registry can pick, on the cpu backend and, in a CUDA build, the cuda one.
#include "infer/engine/engine_registry.hpp"

namespace infer {

std::unique_ptr<EngineHandle> make_engine(ModelSpec spec, LlmOptions options) {
  spec.validate();
  apply_engine_file(spec, options);
  if (spec.backend != "auto") check_engine_choice(spec.backend, options);  // before any device is touched
  const std::string backend = resolve_backend(spec.backend);
  if (backend == "cuda" && spec.device >= 0) use_cuda_device(spec.device);
  return with_engine_type(backend, options, [&]<class E>() -> std::unique_ptr<EngineHandle> {
    return std::make_unique<EngineAdapter<E>>(spec.open(), options.engine_options);
  });
}

}  // namespace infer
