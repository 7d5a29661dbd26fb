#pragma once
/// \file
/// The one place where run-time choices become compiled engines. `with_engine_type(backend, options, body)`
/// calls `body.template operator()<E>()` with the Engine type that a backend ("cpu" or "cuda") and
/// LlmOptions (engine kind, block size, quantizer) name; `make_engine` builds one behind `EngineHandle`, a
/// small virtual interface, so the offline API, the server's engine thread, its router and its tests are
/// written once for every engine. A virtual call per step or per request costs nothing next to a forward
/// pass; the engine's own hot path stays free of them.
///
/// | backend | engine   | compiled                                                              |
/// | ------- | -------- | --------------------------------------------------------------------- |
/// | cpu     | paged    | PagedEngine<cpu, 8 / 16 / 32> (F32); int8, fp8, int4: PagedEngine<cpu,|
/// |         |          | 16> with Int8WeightOnly, Fp8, Int4                                    |
/// | cpu     | static   | StaticEngine<cpu, kShapeAtRuntime> (the shape in EngineOptions), F32  |
/// |         |          | or Int8WeightOnly, Fp8, Int4                                          |
/// | cuda    | paged    | PagedEngine<cuda, 16>, quantizer auto (GgufInPlace), bf16 (Bf16), fp8 |
/// |         |          | (Fp8), int8 (Int8WeightOnly) or int4 (Int4)                           |
/// | cuda    | static   | StaticEngine<cuda, kShapeAtRuntime>, quantizer auto, bf16, fp8, int8  |
/// |         |          | or int4                                                               |
///
/// Each of these is instantiated once, in kernels/ (cpu/engines.cpp, cuda/engines.cpp), and declared
/// `extern template` here, so a program that includes this header compiles none of them again; make_engine,
/// which wraps each in an EngineAdapter, is compiled once too (cpu/engine_registry.cpp).
///
/// `ModelSpec` says what is loaded and where: a model file, or a `dummy` shape (seeded random weights, as
/// vLLM's `--load-format dummy`) with a borrowed tokenizer, on backend "cpu", "cuda" or "auto" (the GPU
/// when this build has CUDA and a device is present, as vLLM picks its platform).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/engine/engine_file_options.hpp"
#include "infer/engine/llm_options.hpp"
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/model_source.hpp"

namespace infer {

/// What a caller needs to know about a loaded engine, fixed after loading.
struct EngineInfo {
  std::string kind;                 ///< "paged" or "static"
  std::string backend;              ///< "cpu" or "cuda"
  std::int32_t block_size = 0;      ///< paged: tokens per KV block
  std::int32_t max_model_len = 0;   ///< longest prompt + output
  std::int32_t max_input = 0;       ///< longest prompt (a static slot's max_input; max_model_len when paged)
  std::int32_t max_output = 0;      ///< most tokens one request can generate (a static slot's max_output)
  std::int64_t vocab_size = 0;
  std::int32_t max_num_seqs = 0;    ///< requests that run at once
};

/// One engine of any compiled type.
class EngineHandle {
 public:
  virtual ~EngineHandle() = default;
  virtual RequestId add_request(std::vector<std::int32_t> prompt, SamplingParams params) = 0;
  virtual void abort(RequestId id) = 0;
  virtual std::vector<RequestOutput> step() = 0;
  [[nodiscard]] virtual bool has_unfinished() const = 0;
  [[nodiscard]] virtual std::size_t num_waiting() const = 0;
  [[nodiscard]] virtual std::size_t num_running() const = 0;
  [[nodiscard]] virtual KvStats kv_stats() const = 0;
  [[nodiscard]] virtual EngineStats stats() const = 0;
  [[nodiscard]] virtual const ModelConfig& config() const = 0;
  /// The model's tokenizer (nullptr when it has none). Tokenizer is immutable and thread-safe.
  [[nodiscard]] virtual const Tokenizer* tokenizer() const = 0;
  [[nodiscard]] virtual EngineInfo info() const = 0;
  /// Engine::set_step_observer. Every EngineAdapter has it; a handle that cannot trace its steps (a test's
  /// stand-in engine) says so with UnsupportedError rather than dropping the observer.
  virtual void set_step_observer(std::function<void(const StepTrace&)> /*observer*/) {
    throw UnsupportedError("this engine handle does not report its steps (set_step_observer)");
  }
};

template <class E>
class EngineAdapter final : public EngineHandle {
 public:
  template <class... Args>
  explicit EngineAdapter(Args&&... args) : engine_(std::forward<Args>(args)...) {}

  RequestId add_request(std::vector<std::int32_t> prompt, SamplingParams params) override {
    return engine_.add_request(std::move(prompt), std::move(params));
  }
  void abort(RequestId id) override { engine_.abort(id); }
  std::vector<RequestOutput> step() override { return engine_.step(); }
  [[nodiscard]] bool has_unfinished() const override { return engine_.has_unfinished(); }
  [[nodiscard]] std::size_t num_waiting() const override { return engine_.num_waiting(); }
  [[nodiscard]] std::size_t num_running() const override { return engine_.num_running(); }
  [[nodiscard]] KvStats kv_stats() const override { return engine_.kv_stats(); }
  [[nodiscard]] EngineStats stats() const override { return engine_.stats(); }
  [[nodiscard]] const ModelConfig& config() const override { return engine_.config(); }
  [[nodiscard]] const Tokenizer* tokenizer() const override { return engine_.tokenizer(); }
  [[nodiscard]] EngineInfo info() const override {
    using A = typename E::allocator_type;
    EngineInfo i;
    i.backend = std::is_same_v<typename E::backend, cuda> ? "cuda" : "cpu";
    i.max_model_len = engine_.max_model_len();
    i.vocab_size = static_cast<std::int64_t>(engine_.config().vocab_size);
    if constexpr (requires(const A& a) { a.shape(); }) {
      const Shape shape = engine_.allocator().shape();
      i.kind = "static";
      i.max_input = shape.max_input;
      i.max_output = shape.max_output;
      i.max_num_seqs = shape.max_batch;
    } else {
      i.kind = "paged";
      i.block_size = engine_.kv_stats().block_size;
      i.max_input = i.max_output = i.max_model_len;
      i.max_num_seqs = engine_.step_bounds().max_sequences;
    }
    return i;
  }
  void set_step_observer(std::function<void(const StepTrace&)> observer) override {
    engine_.set_step_observer(std::move(observer));
  }
  [[nodiscard]] E& engine() noexcept { return engine_; }

 private:
  E engine_;
};

/// Whether this build has the CUDA backend.
inline constexpr bool kHaveCuda =
#if defined(INFER_HAVE_CUDA)
    true;
#else
    false;
#endif

/// CUDA devices present (0 in a build without CUDA).
inline int cuda_devices() noexcept {
#if defined(INFER_HAVE_CUDA)
  return backend::cuda::device_count();
#else
  return 0;
#endif
}

/// Makes CUDA device `device` the calling thread's current one. InvalidArgument naming the count when there is
/// no such device (a replica per GPU asked of a machine with fewer); nothing in a build without CUDA.
inline void use_cuda_device([[maybe_unused]] int device) {
#if defined(INFER_HAVE_CUDA)
  const int n = backend::cuda::device_count();
  if (device < 0 || device >= n)
    throw InvalidArgument(detail::cat("CUDA device ", device, " does not exist: this machine has ", n,
                                      n == 1 ? " device" : " devices"));
  backend::cuda::check(cudaSetDevice(device), "cudaSetDevice");
#endif
}

/// "cpu", "cuda" or "auto" → the backend to run on: "auto" is "cuda" when this build has CUDA and a
/// device is present, else "cpu". InvalidArgument for an unknown name; DeviceError when "cuda" is asked
/// of a build without CUDA or a machine without a device (programs exit 2 on it).
inline std::string resolve_backend(std::string_view asked) {
  using detail::cat;
  if (asked != "cpu" && asked != "cuda" && asked != "auto")
    throw InvalidArgument(cat("backend '", asked, "' is unknown; choose cpu, cuda or auto"));
  if (asked == "cpu") return "cpu";
  if (cuda_devices() > 0) return "cuda";
  if (asked == "cuda")
    throw DeviceError(kHaveCuda ? "backend cuda: no CUDA device is present on this machine; use --backend cpu"
                                : "backend cuda: this build has no CUDA backend (nvcc was not found when it was "
                                  "configured); use --backend cpu");
  return "cpu";
}

struct ModelSpec {
  std::filesystem::path model{};
  std::string dummy{};
  std::uint64_t dummy_seed = 0;
  std::filesystem::path tokenizer{};
  std::string backend = "cpu";  ///< "cpu", "cuda" or "auto" (resolve_backend)
  /// A tensor-parallel group this process is one rank of: open() gives its shard (ModelSource::shard). Null:
  /// the whole model. The group must outlive the engines made from this spec.
  dist::Group* tensor_parallel = nullptr;
  /// cuda: the same group's collectives over device memory (dist::Nccl), which the CUDA decoder needs for a shard.
  dist::DeviceGroup* tensor_parallel_device = nullptr;
  /// cuda: the device the engine runs on (make_engine makes it the calling thread's current device, so that
  /// thread must be the one that runs the engine: a server's engine thread); -1: the thread's current one.
  int device = -1;

  /// The model's name as clients see it by default.
  [[nodiscard]] std::string name() const { return dummy.empty() ? model.filename().string() : "dummy-" + dummy; }

  /// InvalidArgument for a combination that cannot load, before anything is read.
  void validate() const {
    using detail::cat;
    if (model.empty() == dummy.empty()) throw InvalidArgument("give one of --model PATH or --dummy SHAPE");
    if (!tokenizer.empty() && dummy.empty())
      throw InvalidArgument("--tokenizer is for --dummy models; a model file brings its own tokenizer");
    if (backend != "cpu" && backend != "cuda" && backend != "auto")
      throw InvalidArgument(cat("backend '", backend, "' is unknown; choose cpu, cuda or auto"));
    if (!kHaveCuda && backend == "cuda")
      throw InvalidArgument("this build has no CUDA backend (nvcc was not found); use --backend cpu");
  }

  [[nodiscard]] ModelSource open() const {
    ModelSource whole = open_whole();
    if (tensor_parallel == nullptr) return whole;
    return ModelSource::shard(std::move(whole), *tensor_parallel, tensor_parallel_device);
  }

 private:
  [[nodiscard]] ModelSource open_whole() const {
    if (dummy.empty()) return ModelSource::open(model);
    std::optional<Tokenizer> tok;
    if (tokenizer.extension() == ".json") {
      tok.emplace(Tokenizer::from_hf_json(tokenizer));
    } else if (!tokenizer.empty()) {
      const ModelSource donor = ModelSource::open(tokenizer);
      if (!donor.tokenizer()) throw InvalidArgument(detail::cat(donor.describe(), " has no tokenizer"));
      tok.emplace(*donor.tokenizer());  // shares its tables; outlives the donor
    }
    return ModelSource::dummy(dummy_config(dummy), dummy_seed, dummy, std::move(tok));
  }
};

/// InvalidArgument naming the choice when `options` ask for an engine that is not compiled for `backend`
/// ("cpu" or "cuda"); touches no device.
inline void check_engine_choice(std::string_view backend, const LlmOptions& options) {
  using detail::cat;
  if (options.engine != "paged" && options.engine != "static")
    throw InvalidArgument(cat("engine '", options.engine, "' is unknown; choose paged or static"));
  // One block size compiled for these.
  const bool paged_16 = options.quantizer == "int8" || options.quantizer == "int4" || options.quantizer == "fp8";
  if (options.quantizer != "auto" && options.quantizer != "bf16" && !paged_16)
    throw InvalidArgument(cat("quantizer '", options.quantizer, "' is unknown; choose auto, bf16, int8, fp8 or int4"));
  if (options.engine != "paged") return;
  if (backend == "cuda") {
    // One block size on CUDA: each engine instance adds minutes to the build, and 16 is what the kernels
    // are tuned for.
    if (options.block_size != 16)
      throw InvalidArgument(cat("the cuda backend runs the paged engine with block_size 16 (asked: block_size ",
                                options.block_size, ")"));
  } else if (options.block_size != 8 && options.block_size != 16 && options.block_size != 32) {
    throw InvalidArgument(cat("block_size = ", options.block_size, " is not compiled in; choose 8, 16 or 32"));
  }
  if (backend != "cuda" && options.quantizer == "bf16")
    throw InvalidArgument("quantizer bf16 is a cuda backend option; the cpu backend computes in f32");
  if (paged_16 && options.block_size != 16)
    throw InvalidArgument(cat("quantizer ", options.quantizer, " runs the paged engine with block_size 16 (asked: block_size ",
                              options.block_size, ")"));
}

/// Calls `body.template operator()<E>()` with the engine type `backend` ("cpu" or "cuda", resolved) and
/// `options` name, and returns what it returns. Errors as check_engine_choice.
template <class Body>
decltype(auto) with_engine_type(std::string_view backend, const LlmOptions& options, Body&& body) {
  check_engine_choice(backend, options);
  const bool paged = options.engine == "paged";
  if (backend == "cuda") {
#if defined(INFER_HAVE_CUDA)
    if (options.quantizer == "fp8")
      return paged ? body.template operator()<PagedEngine<cuda, 16, Fp8>>()
                   : body.template operator()<StaticEngine<cuda, kShapeAtRuntime, Fp8>>();
    if (options.quantizer == "int8")
      return paged ? body.template operator()<PagedEngine<cuda, 16, Int8WeightOnly>>()
                   : body.template operator()<StaticEngine<cuda, kShapeAtRuntime, Int8WeightOnly>>();
    if (options.quantizer == "int4")
      return paged ? body.template operator()<PagedEngine<cuda, 16, Int4>>()
                   : body.template operator()<StaticEngine<cuda, kShapeAtRuntime, Int4>>();
    const bool bf16 = options.quantizer == "bf16";
    if (!paged)
      return bf16 ? body.template operator()<StaticEngine<cuda, kShapeAtRuntime, Bf16>>()
                  : body.template operator()<StaticEngine<cuda, kShapeAtRuntime>>();
    return bf16 ? body.template operator()<PagedEngine<cuda, 16, Bf16>>() : body.template operator()<PagedEngine<cuda, 16>>();
#else
    throw DeviceError("backend cuda: this build has no CUDA backend; use --backend cpu");
#endif
  }
  if (options.quantizer == "int8")
    return paged ? body.template operator()<PagedEngine<cpu, 16, Int8WeightOnly>>()
                 : body.template operator()<StaticEngine<cpu, kShapeAtRuntime, Int8WeightOnly>>();
  if (options.quantizer == "fp8")
    return paged ? body.template operator()<PagedEngine<cpu, 16, Fp8>>()
                 : body.template operator()<StaticEngine<cpu, kShapeAtRuntime, Fp8>>();
  if (options.quantizer == "int4")
    return paged ? body.template operator()<PagedEngine<cpu, 16, Int4>>()
                 : body.template operator()<StaticEngine<cpu, kShapeAtRuntime, Int4>>();
  if (!paged) return body.template operator()<StaticEngine<cpu, kShapeAtRuntime>>();
  if (options.block_size == 8) return body.template operator()<PagedEngine<cpu, 8>>();
  if (options.block_size == 32) return body.template operator()<PagedEngine<cpu, 32>>();
  return body.template operator()<PagedEngine<cpu, 16>>();
}

/// When `spec.model` is an engine file (infer-build's output): `options` become those it runs with and
/// `spec.backend` the file's (engine_file_options, which names what differs when it cannot run). Anything
/// else is left as it is. Idempotent.
inline void apply_engine_file(ModelSpec& spec, LlmOptions& options) {
  if (!spec.dummy.empty() || spec.model.empty() || !EngineFile::is_engine_file(spec.model)) return;
  options = engine_file_options(EngineFile::open(spec.model).info(), spec.model, std::move(options), spec.backend);
}

/// Loads `spec` into the engine `options` name (for an engine file, the engine it was built for:
/// apply_engine_file). Errors: ModelSpec::validate's and resolve_backend's, with_engine_type's, and
/// whatever loading throws. Compiled once, in kernels/cpu/engine_registry.cpp: it instantiates an
/// EngineAdapter for every registered engine, which cost each program that loads a model ~15 s of compile
/// when it was inline (infer-serve's main.cpp: 56 s at 6 CUDA engines, 73 s at 10).
std::unique_ptr<EngineHandle> make_engine(ModelSpec spec, LlmOptions options);

/// Loads `spec` into an engine type of your own (e.g. the paged engine with your scheduler), behind the same
/// EngineHandle as the registered ones, so infer::LLM and the server's engine thread run it unchanged:
/// `E(spec.open(), options.engine_options, engine_args...)` (e.g. a scheduler instance, see Engine). The
/// engine's backend is its type's: InvalidArgument when `spec.backend` names the other one ("auto" takes
/// the type's). `options.engine`, `block_size` and `quantizer` choose among the registered engines only.
template <class E, class... Args>
std::unique_ptr<EngineHandle> make_engine(const ModelSpec& spec, const LlmOptions& options, Args&&... engine_args) {
  spec.validate();
  const std::string_view own = std::is_same_v<typename E::backend, cuda> ? "cuda" : "cpu";
  if (spec.backend != "auto" && spec.backend != own)
    throw InvalidArgument(detail::cat("this engine type runs on the ", own, " backend, but backend '", spec.backend,
                                      "' was asked for; use '", own, "' or 'auto'"));
  return std::make_unique<EngineAdapter<E>>(spec.open(), options.engine_options, std::forward<Args>(engine_args)...);
}

// Compiled once in kernels/: programs that include this header link them instead of instantiating them.
extern template class Engine<cpu, llama, PagedBlockAllocator<8>, PriorityScheduler, PagedAttention<>, F32>;
extern template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, F32>;
extern template class Engine<cpu, llama, PagedBlockAllocator<32>, PriorityScheduler, PagedAttention<>, F32>;
extern template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, F32>;
extern template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int8WeightOnly>;
extern template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int8WeightOnly>;
extern template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Fp8>;
extern template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Fp8>;
extern template class Engine<cpu, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int4>;
extern template class Engine<cpu, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int4>;
#if defined(INFER_HAVE_CUDA)
extern template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, GgufInPlace>;
extern template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Bf16>;
extern template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, GgufInPlace>;
extern template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Bf16>;
extern template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Fp8>;
extern template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Fp8>;
extern template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int8WeightOnly>;
extern template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int8WeightOnly>;
extern template class Engine<cuda, llama, PagedBlockAllocator<16>, PriorityScheduler, PagedAttention<>, Int4>;
extern template class Engine<cuda, llama, ContiguousAllocator<kShapeAtRuntime>,
                             StaticBatchScheduler<kShapeAtRuntime.max_batch>, FusedContiguousAttention<>, Int4>;
#endif

}  // namespace infer
