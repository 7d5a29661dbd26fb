#pragma once
/// \file
/// `EngineHandle`: one compiled engine behind a small virtual interface, so the server's engine thread,
/// its router and its tests are written once for every engine (`PagedEngine<cpu, 8|16|32>`,
/// `StaticEngine<cpu>`, `PagedEngine<cuda, 16>`) picked at run time. A virtual call per step or per request costs nothing next to
/// a forward pass; the engine's own hot path stays free of them.
///
/// `make_engine` chooses the engine from the same `LlmOptions` that `infer::LLM` and `infer-generate`
/// take, so the server's engine and cache flags mean exactly what theirs do, and the backend and model
/// (a file or a dummy shape) from a `ModelSpec`.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/engine/llm.hpp"
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/model_source.hpp"

namespace infer::serve {

/// What the server needs to know about a loaded engine, fixed after loading (handlers read it freely).
struct EngineInfo {
  std::string kind;                 ///< "paged" or "static"
  std::int32_t block_size = 0;      ///< paged: tokens per KV block
  std::int32_t max_model_len = 0;   ///< longest prompt + output
  std::int32_t max_output = 0;      ///< most tokens one request can generate (a static slot's max_output)
  std::int64_t vocab_size = 0;
  std::int32_t max_num_seqs = 0;    ///< requests that run at once
};

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
  /// The model's tokenizer (nullptr when it has none). Tokenizer is immutable and thread-safe.
  [[nodiscard]] virtual const Tokenizer* tokenizer() const = 0;
  [[nodiscard]] virtual EngineInfo info() const = 0;
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
  [[nodiscard]] const Tokenizer* tokenizer() const override { return engine_.tokenizer(); }
  [[nodiscard]] EngineInfo info() const override {
    using A = typename E::allocator_type;
    EngineInfo i;
    i.max_model_len = engine_.max_model_len();
    i.vocab_size = static_cast<std::int64_t>(engine_.config().vocab_size);
    i.block_size = engine_.kv_stats().block_size;
    if constexpr (requires { A::shape; }) {
      i.kind = "static";
      i.block_size = 0;
      i.max_output = A::shape.max_output;
      i.max_num_seqs = A::shape.max_batch;
    } else {
      i.kind = "paged";
      i.max_output = i.max_model_len;
      i.max_num_seqs = engine_.options().scheduler.max_num_seqs;
    }
    return i;
  }
  [[nodiscard]] E& engine() noexcept { return engine_; }

 private:
  E engine_;
};

/// What a server engine loads and where it runs: a model file, or a `dummy` shape (a preset name or a
/// config.json, seeded random weights, as vLLM's `--load-format dummy`) with the tokenizer of
/// `tokenizer` (a model file, or an HF tokenizer.json) so that text prompts work; on backend "cpu" or
/// "cuda".
struct ModelSpec {
  std::filesystem::path model{};
  std::string dummy{};
  std::uint64_t dummy_seed = 0;
  std::filesystem::path tokenizer{};
  std::string backend = "cpu";

  /// The model's name as clients see it by default.
  [[nodiscard]] std::string name() const { return dummy.empty() ? model.filename().string() : "dummy-" + dummy; }

  /// InvalidArgument for a combination that cannot load, before anything is read.
  void validate() const {
    using infer::detail::cat;
    if (model.empty() == dummy.empty()) throw InvalidArgument("give one of --model PATH or --dummy SHAPE");
    if (!tokenizer.empty() && dummy.empty())
      throw InvalidArgument("--tokenizer is for --dummy models; a model file brings its own tokenizer");
    if (backend != "cpu" && backend != "cuda")
      throw InvalidArgument(cat("backend '", backend, "' is unknown; choose cpu or cuda"));
#if !defined(INFER_HAVE_CUDA)
    if (backend == "cuda") throw InvalidArgument("this build has no CUDA backend (nvcc was not found); use --backend cpu");
#endif
  }

  [[nodiscard]] ModelSource open() const {
    if (dummy.empty()) return ModelSource::open(model);
    std::optional<Tokenizer> tok;
    if (tokenizer.extension() == ".json") {
      tok.emplace(Tokenizer::from_hf_json(tokenizer));
    } else if (!tokenizer.empty()) {
      const ModelSource donor = ModelSource::open(tokenizer);
      if (!donor.tokenizer()) throw InvalidArgument(infer::detail::cat(donor.describe(), " has no tokenizer"));
      tok.emplace(*donor.tokenizer());  // shares its tables; outlives the donor
    }
    return ModelSource::dummy(dummy_config(dummy), dummy_seed, dummy, std::move(tok));
  }
};

/// Loads `spec` into the engine `options` names (engine "paged" with block_size 8/16/32, or "static",
/// on the CPU; "paged" with block_size 16 on CUDA); InvalidArgument for anything else, and whatever
/// loading throws.
inline std::unique_ptr<EngineHandle> make_engine(const ModelSpec& spec, const LlmOptions& options) {
  using infer::detail::cat;
  spec.validate();
  const EngineOptions& eo = options.engine_options;
  if (options.engine != "paged" && options.engine != "static")
    throw InvalidArgument(cat("engine '", options.engine, "' is unknown; choose paged or static"));
  if (spec.backend == "cuda") {
#if defined(INFER_HAVE_CUDA)
    // One CUDA engine is compiled into the server: each instantiation adds minutes to its build.
    if (options.engine != "paged" || options.block_size != 16)
      throw InvalidArgument(cat("the cuda backend serves the paged engine with block_size 16 (asked: ", options.engine,
                                options.engine == "paged" ? cat(", block_size ", options.block_size) : std::string(), ")"));
    return std::make_unique<EngineAdapter<PagedEngine<cuda, 16>>>(spec.open(), eo);
#endif
  }
  if (options.engine == "static") return std::make_unique<EngineAdapter<StaticEngine<cpu>>>(spec.open(), eo);
  switch (options.block_size) {
    case 8: return std::make_unique<EngineAdapter<PagedEngine<cpu, 8>>>(spec.open(), eo);
    case 16: return std::make_unique<EngineAdapter<PagedEngine<cpu, 16>>>(spec.open(), eo);
    case 32: return std::make_unique<EngineAdapter<PagedEngine<cpu, 32>>>(spec.open(), eo);
    default:
      throw InvalidArgument(cat("block_size = ", options.block_size, " is not compiled in; choose 8, 16 or 32"));
  }
}

}  // namespace infer::serve
