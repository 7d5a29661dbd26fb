// build_engine_file (include/infer/engine/engine_build.hpp): the Llama-family weights through each CPU
// Quantizer, written as an engine file. The weights' layout depends on the Quantizer alone, not on the
// engine kind or attention policy, so one instantiation per Quantizer serves every engine.
#include "infer/engine/engine_build.hpp"

#include <chrono>

#include "infer/model/llama_weights.hpp"
#include "infer/version.hpp"

namespace infer {

namespace {

template <class Q>
EngineBuildReport write_weights(const ModelSource& src, EngineFileInfo info, const std::filesystem::path& out) {
  using Clock = std::chrono::steady_clock;
  EngineBuildReport report;
  const auto t0 = Clock::now();
  const LlamaWeights<Q, cpu> weights = load_llama_weights<Q, cpu>(src);
  const auto t1 = Clock::now();
  EngineFileWriter writer;
  save_llama_weights(weights, writer);
  info.quantizer_layout = std::string(Q::name);
  std::optional<TokenizerSpec> tokenizer;
  if (src.tokenizer()) tokenizer = src.tokenizer()->spec();
  report.file_bytes = writer.write(out, info, tokenizer);
  report.parts = writer.parts();
  report.load_seconds = std::chrono::duration<double>(t1 - t0).count();
  report.write_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  report.info = std::move(info);
  return report;
}

}  // namespace

EngineBuildReport build_engine_file(const ModelSpec& spec, const LlmOptions& options, const std::filesystem::path& out) {
  using detail::cat;
  spec.validate();
  options.engine_options.validate();
  const std::string backend = resolve_backend(spec.backend);
  check_engine_choice(backend, options);
  if (backend != "cpu")
    throw UnsupportedError(cat("infer-build writes engine files for the cpu backend only so far (asked: ", backend,
                               "); use --backend cpu"));
  const ModelSource src = spec.open();
  EngineFileInfo info;
  info.library_version = INFER_VERSION;
  info.backend = backend;
  info.architecture = engine_file_architecture(backend);
  info.engine = options.engine;
  info.block_size = options.block_size;
  info.quantizer = options.quantizer;
  info.engine_options = options.engine_options;
  info.config = src.config();
  info.model = src.describe();
  info.model_name = spec.name();
  if (options.quantizer == "int8") return write_weights<Int8WeightOnly>(src, std::move(info), out);
  if (options.quantizer == "fp8") return write_weights<Fp8>(src, std::move(info), out);
  if (options.quantizer == "int4") return write_weights<Int4>(src, std::move(info), out);
  return write_weights<F32>(src, std::move(info), out);
}

}  // namespace infer
