// ModelSource: canonical weight roles over a GGUF file or a Hugging Face safetensors folder.
// Compiled here, not in the header, so that the file readers (GGUF, safetensors, tokenizer loaders)
// stay out of every translation unit that only uses a model.
#include "infer/model/model_source.hpp"

#include <array>
#include <charconv>
#include <deque>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/dist/communicator.hpp"
#include "infer/io/engine_file.hpp"
#include "infer/io/gguf.hpp"
#include "infer/io/safetensors.hpp"
#include "infer/memory/kv_dtype.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/gguf_config.hpp"
#include "infer/model/hf_config.hpp"
#include "infer/tokenizer/gguf_vocab.hpp"

namespace infer {
namespace {

using detail::cat;

struct RoleName {
  std::string_view canonical, hf;
  bool linear;  ///< a projection: may carry a ".bias"
  bool matrix;  ///< a 2-D weight: may have companion tensors (kCompanions)
};

constexpr std::array<RoleName, 3> kGlobalRoles{{
    {"token_embd", "model.embed_tokens", false, true},
    {"output_norm", "model.norm", false, false},
    {"output", "lm_head", true, true},
}};

constexpr std::array<RoleName, 9> kLayerRoles{{
    {"attn_norm", "input_layernorm", false, false},
    {"attn_q", "self_attn.q_proj", true, true},
    {"attn_k", "self_attn.k_proj", true, true},
    {"attn_v", "self_attn.v_proj", true, true},
    {"attn_output", "self_attn.o_proj", true, true},
    {"ffn_norm", "post_attention_layernorm", false, false},
    {"ffn_gate", "mlp.gate_proj", true, true},
    {"ffn_up", "mlp.up_proj", true, true},
    {"ffn_down", "mlp.down_proj", true, true},
}};

/// The tensors a quantized checkpoint stores beside (or instead of) a matrix's weight, under the
/// weight's module name: vLLM/ModelOpt FP8 and compressed-tensors INT8 (`weight_scale`, `input_scale`),
/// AWQ and GPTQ (`qweight`, `qzeros`, `scales`, `g_idx`). A Quantizer that loads by role reads them
/// (quant/linear_request.hpp); a file without them simply does not have them.
constexpr std::array<std::string_view, 6> kCompanions{"weight_scale", "input_scale", "qweight", "qzeros", "scales",
                                                      "g_idx"};

/// A parsed canonical role: a per-layer one has `layer` >= 0; `suffix` is "weight", "bias" or a companion.
struct Role {
  std::int64_t layer = -1;
  const RoleName* name = nullptr;
  std::string_view suffix = "weight";
  [[nodiscard]] bool bias() const noexcept { return suffix == "bias"; }
  [[nodiscard]] bool companion() const noexcept { return suffix != "weight" && suffix != "bias"; }
};

Role parse_role(std::string_view role) {
  auto bad = [&]() {
    return InvalidArgument(cat("model role '", role,
                               "' is not a canonical role: expected token_embd, output_norm, output, or "
                               "blk.<layer>.<attn_norm|attn_q|attn_k|attn_v|attn_output|ffn_norm|ffn_gate|ffn_up|"
                               "ffn_down>, a linear one optionally followed by .bias, a matrix one by "
                               ".<weight_scale|input_scale|qweight|qzeros|scales|g_idx>"));
  };
  Role r;
  std::string_view rest = role;
  const auto strip = [&](std::string_view suffix) {
    const bool at_end = rest.size() > suffix.size() + 1 && rest.ends_with(suffix) &&
                        rest[rest.size() - suffix.size() - 1] == '.';
    if (at_end) {
      r.suffix = suffix;
      rest.remove_suffix(suffix.size() + 1);
    }
    return at_end;
  };
  if (!strip("bias"))
    for (std::string_view c : kCompanions)
      if (strip(c)) break;
  if (rest.starts_with("blk.")) {
    rest.remove_prefix(4);
    const auto dot = rest.find('.');
    if (dot == std::string_view::npos || dot == 0) throw bad();
    std::int64_t layer = 0;
    const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + dot, layer);
    if (ec != std::errc{} || ptr != rest.data() + dot || layer < 0) throw bad();
    r.layer = layer;
    rest.remove_prefix(dot + 1);
    for (const auto& n : kLayerRoles)
      if (n.canonical == rest) r.name = &n;
  } else {
    for (const auto& n : kGlobalRoles)
      if (n.canonical == rest) r.name = &n;
  }
  if (!r.name || (r.bias() && !r.name->linear) || (r.companion() && !r.name->matrix)) throw bad();
  return r;
}

}  // namespace

struct ModelSource::Impl {
  std::filesystem::path path;
  ModelConfig config;
  std::optional<gguf::File> gguf;
  std::optional<safetensors::Checkpoint> checkpoint;
  std::optional<EngineFile> engine;
  std::optional<Tokenizer> tokenizer;
  std::optional<std::uint64_t> dummy_seed;  ///< set for ModelSource::dummy
  std::string dummy_label;

  /// A dummy model's weight for role `r`: the shape the config implies, a fill seeded by role.
  [[nodiscard]] std::optional<WeightTensor> dummy_tensor(const Role& r, std::string name) const {
    const ModelConfig& c = config;
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    const std::string_view n = r.name->canonical;
    if (r.companion()) return std::nullopt;  // dummy weights are plain bf16
    if (r.bias() && !(c.attention_bias && (n == "attn_q" || n == "attn_k" || n == "attn_v"))) return std::nullopt;
    if (r.layer >= c.num_layers) return std::nullopt;
    std::vector<std::uint64_t> shape;
    const std::uint64_t H = u(c.hidden_size), I = u(c.intermediate_size), qs = u(c.q_size()), kvs = u(c.kv_size());
    if (n == "token_embd" || n == "output") shape = {u(c.vocab_size), H};
    else if (n == "output_norm" || n == "attn_norm" || n == "ffn_norm") shape = {H};
    else if (n == "attn_q") shape = {qs, H};
    else if (n == "attn_k" || n == "attn_v") shape = {kvs, H};
    else if (n == "attn_output") shape = {H, qs};
    else if (n == "ffn_gate" || n == "ffn_up") shape = {I, H};
    else shape = {H, I};  // ffn_down
    if (r.bias()) shape = {shape[0]};
    DummyFill fill;
    // Seeded per tensor: the name's FNV-1a hash mixed with the model's seed.
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
    fill.seed = h ^ (*dummy_seed * 0x9E3779B97F4A7C15ull);
    if (r.bias()) fill.spread = 0.02f;
    else if (shape.size() == 1) {
      fill.center = 1.0f;
      fill.spread = 0.05f;
    } else if (n == "token_embd") fill.spread = 1.0f;
    else fill.spread = std::sqrt(3.0f / static_cast<float>(shape[1]));
    return WeightTensor{std::move(name), DType::bf16, std::move(shape), {}, fill};
  }

  /// A shard's (ModelSource::shard): the whole model's source, the group and this rank's place in it, and the
  /// column slices it has copied (alive as long as the shard).
  std::unique_ptr<const Impl> base;
  dist::Group* group = nullptr;
  dist::DeviceGroup* device_group = nullptr;
  TensorParallel tp;
  mutable std::mutex owned_mutex;
  mutable std::deque<std::vector<std::byte>> owned;

  /// The source that holds the files: this one, or a shard's whole model.
  [[nodiscard]] const Impl& root() const noexcept { return base ? *base : *this; }

  [[nodiscard]] std::string describe() const {
    if (base) return cat(base->describe(), " (tensor-parallel rank ", tp.rank, " of ", tp.size, ")");
    if (dummy_seed) return cat("dummy model '", dummy_label, "'");
    if (engine) return cat("engine file '", path.string(), "'");
    return cat(gguf ? "GGUF '" : "safetensors folder '", path.string(), "'");
  }

  /// The whole model's tensor for role r (file name `fname`), or nullopt. Not for a shard.
  [[nodiscard]] std::optional<WeightTensor> find_whole(const Role& r, const std::string& fname) const {
    if (engine)
      throw UnsupportedError(cat(describe(), " holds an engine's weights in its runtime layout, not tensors by role; ",
                                 "load it with the engine it was built for"));
    if (dummy_seed) return dummy_tensor(r, fname);
    if (gguf) {
      const gguf::TensorInfo* t = gguf->find_tensor(fname);
      if (!t) return std::nullopt;
      return WeightTensor{t->name, t->type, std::vector<std::uint64_t>(t->shape.rbegin(), t->shape.rend()), t->data,
                          std::nullopt};
    }
    const safetensors::Tensor* t = checkpoint->find(fname);
    if (!t) return std::nullopt;
    return WeightTensor{t->name, t->dtype, t->shape, t->data, std::nullopt};
  }

  /// Rows [r0, r1) of t (a view; a dummy's slice of its fill).
  [[nodiscard]] static WeightTensor slice_rows(WeightTensor t, std::uint64_t r0, std::uint64_t r1) {
    const auto cols = t.shape.size() < 2 ? std::uint64_t{1} : static_cast<std::uint64_t>(t.cols());  // a bias: 1
    if (t.dummy) {
      t.dummy->row0 = r0;
      t.dummy->col0 = 0;
      t.dummy->full_cols = cols;
    } else {
      const std::uint64_t rb = row_bytes(t.type, cols).value_or(0);
      if (rb == 0 || t.data.size() < r1 * rb)
        throw FormatError(cat("tensor '", t.name, "' (", name(t.type), ", ", t.elements(), " values) has ", t.data.size(),
                              " bytes, too few for its shape"));
      t.data = t.data.subspan(r0 * rb, (r1 - r0) * rb);
    }
    t.shape[0] = r1 - r0;
    return t;
  }

  /// Columns [c0, c1) of a 2-D t: copied (kept in `owned`), or a dummy's slice of its fill.
  [[nodiscard]] WeightTensor slice_cols(WeightTensor t, std::uint64_t c0, std::uint64_t c1) const {
    const auto rows = static_cast<std::uint64_t>(t.rows()), cols = static_cast<std::uint64_t>(t.cols());
    if (t.dummy) {
      t.dummy->row0 = 0;
      t.dummy->col0 = c0;
      t.dummy->full_cols = cols;
      t.shape[1] = c1 - c0;
      return t;
    }
    const auto be = static_cast<std::uint64_t>(info(t.type).block_elems);
    if (c0 % be != 0 || c1 % be != 0)
      throw UnsupportedError(cat("tensor '", t.name, "' (", name(t.type), ", blocks of ", be, " values): a ", tp.size,
                                 "-way tensor-parallel split of its ", cols, " columns cuts blocks (rank ", tp.rank,
                                 " takes columns ", c0, "..", c1, ")"));
    const std::uint64_t rb = row_bytes(t.type, cols).value_or(0), off = row_bytes(t.type, c0).value_or(0),
                        sb = row_bytes(t.type, c1 - c0).value_or(0);
    if (rb == 0 || t.data.size() < rows * rb)
      throw FormatError(cat("tensor '", t.name, "' (", name(t.type), ", ", t.elements(), " values) has ", t.data.size(),
                            " bytes, too few for its shape"));
    std::vector<std::byte> part(rows * sb);
    for (std::uint64_t r = 0; r < rows; ++r) std::memcpy(part.data() + r * sb, t.data.data() + r * rb + off, sb);
    {
      const std::lock_guard lock(owned_mutex);
      t.data = owned.emplace_back(std::move(part));
    }
    t.shape[1] = c1 - c0;
    return t;
  }

  /// This rank's part of the whole model's tensor t for role r (see ModelSource::shard).
  [[nodiscard]] WeightTensor shard_of(const Role& r, WeightTensor t) const {
    const std::string_view n = r.name->canonical;
    const auto size = static_cast<std::uint64_t>(tp.size), rank = static_cast<std::uint64_t>(tp.rank);
    if (r.companion()) return shard_scale_of(r, std::move(t));
    if (n == "attn_q" || n == "attn_k" || n == "attn_v" || n == "ffn_gate" || n == "ffn_up") {
      const auto R = static_cast<std::uint64_t>(t.rows());
      if (R % size != 0)
        throw FormatError(cat("tensor '", t.name, "' has ", R, " rows, which ", size, " ranks cannot share evenly"));
      return slice_rows(std::move(t), rank * R / size, (rank + 1) * R / size);
    }
    if (n == "attn_output" || n == "ffn_down") {
      if (r.bias())
        throw UnsupportedError(cat("tensor '", t.name, "': tensor parallelism does not split a bias of ", n,
                                   " (each rank's product would add it)"));
      if (t.shape.size() != 2) return t;  // the loader refuses its shape
      const auto C = static_cast<std::uint64_t>(t.cols());
      if (C % size != 0)
        throw FormatError(cat("tensor '", t.name, "' has ", C, " columns, which ", size, " ranks cannot share evenly"));
      return slice_cols(std::move(t), rank * C / size, (rank + 1) * C / size);
    }
    if (n == "token_embd" || n == "output") {
      const std::int64_t V = root().config.vocab_size;
      const auto first = static_cast<std::uint64_t>(tp.vocab_first(V));
      if (static_cast<std::uint64_t>(t.rows()) != static_cast<std::uint64_t>(V)) return t;  // the loader refuses it
      return slice_rows(std::move(t), first, first + static_cast<std::uint64_t>(tp.vocab_rows(V)));
    }
    return t;  // norms: every rank holds them whole
  }

  /// This rank's part of an FP8 or INT8 checkpoint's scale for role r: a per-tensor value (and input_scale, which
  /// is one) whole on every rank; a per-channel weight_scale ([out] or [out, 1]) the rows the rank takes of the
  /// weight (its heads, its share of the MLP, its block of the vocabulary), or whole where the weight's columns
  /// are split (attn_output, ffn_down: every output row on every rank). GPTQ and AWQ's packed tensors are refused.
  [[nodiscard]] WeightTensor shard_scale_of(const Role& r, WeightTensor t) const {
    const std::string_view n = r.name->canonical;
    if (r.suffix != "weight_scale" && r.suffix != "input_scale")
      throw UnsupportedError(cat("tensor '", t.name, "': tensor parallelism does not split GPTQ or AWQ checkpoints' ",
                                 "packed tensors (", r.suffix, ")"));
    if (t.elements() == 1 || n == "attn_output" || n == "ffn_down") return t;
    if (r.suffix == "input_scale" || t.shape.empty() || (t.shape.size() == 2 && t.shape[1] != 1) || t.shape.size() > 2)
      return t;  // not one value a row: the quantizer refuses its shape
    const auto size = static_cast<std::uint64_t>(tp.size), rank = static_cast<std::uint64_t>(tp.rank);
    const auto R = static_cast<std::uint64_t>(t.shape[0]);
    if (n == "token_embd" || n == "output") {
      const std::int64_t V = root().config.vocab_size;
      if (R != static_cast<std::uint64_t>(V)) return t;
      const auto first = static_cast<std::uint64_t>(tp.vocab_first(V));
      return slice_rows(std::move(t), first, first + static_cast<std::uint64_t>(tp.vocab_rows(V)));
    }
    if (R % size != 0)
      throw FormatError(cat("tensor '", t.name, "' has ", R, " rows, which ", size, " ranks cannot share evenly"));
    return slice_rows(std::move(t), rank * R / size, (rank + 1) * R / size);
  }

  [[nodiscard]] std::string name_of(const Role& r) const {
    if (gguf)
      return r.layer < 0 ? cat(r.name->canonical, ".", r.suffix) : cat("blk.", r.layer, ".", r.name->canonical, ".", r.suffix);
    return r.layer < 0 ? cat(r.name->hf, ".", r.suffix) : cat("model.layers.", r.layer, ".", r.name->hf, ".", r.suffix);
  }
};

ModelSource::ModelSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelSource::ModelSource(ModelSource&&) noexcept = default;
ModelSource& ModelSource::operator=(ModelSource&&) noexcept = default;
ModelSource::~ModelSource() = default;

ModelSource ModelSource::open(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec) && EngineFile::is_engine_file(path)) {
    impl->engine.emplace(EngineFile::open(path));
    impl->config = impl->engine->info().config;
    impl->tp = impl->engine->info().tensor_parallel;  // a rank's file: its decoder needs the group (shard)
    if (const auto& spec = impl->engine->tokenizer()) impl->tokenizer.emplace(*spec);
  } else if (std::filesystem::is_directory(path, ec)) {
    impl->checkpoint.emplace(safetensors::Checkpoint::open(path));
    impl->config = load_hf_config(path);
    const auto tok = path / "tokenizer.json";
    if (std::filesystem::exists(tok, ec)) impl->tokenizer.emplace(Tokenizer::from_hf_json(tok));
  } else {
    impl->gguf.emplace(gguf::File::open(path));
    impl->config = from_gguf(*impl->gguf);
    // A GGUF without tokenizer metadata (converted weights only) runs on token ids.
    if (impl->gguf->find("tokenizer.ggml.tokens")) impl->tokenizer.emplace(Tokenizer::from_gguf(*impl->gguf));
  }
  return ModelSource(std::move(impl));
}

ModelSource ModelSource::dummy(ModelConfig config, std::uint64_t seed, std::string label,
                               std::optional<Tokenizer> tokenizer) {
  config.validate();
  if (tokenizer && tokenizer->vocab_size() > static_cast<std::size_t>(config.vocab_size))
    throw InvalidArgument(cat("dummy model '", label, "': the tokenizer has ", tokenizer->vocab_size(),
                              " tokens, more than the model's vocabulary of ", config.vocab_size));
  auto impl = std::make_unique<Impl>();
  impl->tokenizer = std::move(tokenizer);
  impl->config = std::move(config);
  impl->dummy_seed = seed;
  impl->dummy_label = std::move(label);
  return ModelSource(std::move(impl));
}

ModelConfig dummy_config(std::string_view name_or_json) {
  if (name_or_json.ends_with(".json")) return load_hf_config(std::filesystem::path(name_or_json));
  return dummy_preset(name_or_json);
}

const ModelConfig& ModelSource::config() const noexcept { return impl_->config; }

std::optional<WeightTensor> ModelSource::find(std::string_view role) const {
  const Role r = parse_role(role);
  if (r.layer < 0 && r.name->canonical == "output" && impl_->config.tie_word_embeddings) return std::nullopt;
  const Impl& whole = impl_->root();
  auto t = whole.find_whole(r, whole.name_of(r));
  if (!t || !impl_->base) return t;
  return impl_->shard_of(r, std::move(*t));
}

ModelSource ModelSource::shard(ModelSource source, TensorParallel place) {
  require<InvalidArgument>(place.valid(), "ModelSource::shard: rank ", place.rank, " of a group of ", place.size);
  require<InvalidArgument>(!source.impl_->base, "ModelSource::shard: ", source.describe(), " is a shard already");
  const Impl& whole = *source.impl_;
  auto impl = std::make_unique<Impl>();
  impl->tp = place;
  if (whole.engine) {
    // An engine file built from a shard holds that rank's weights and config already (infer-build
    // --tensor-parallel-size): only that rank of a group of that size loads it.
    const TensorParallel built = whole.engine->info().tensor_parallel;
    if (built != place)
      throw UnsupportedError(cat(whole.describe(), " holds ", built.describe(), "; this is ", place.describe(),
                                 built.split() ? "" : cat(": tensor parallelism loads one engine file per rank, built by ",
                                                          "infer-build --tensor-parallel-size ", place.size),
                                 built.split() && built.size == place.size
                                     ? " (give --engine-file the name infer-build was given: each rank loads its own file)"
                                     : ""));
    impl->config = whole.config;
  } else {
    const ModelConfig& c = whole.config;
    const int size = place.size;
    if (c.num_heads % size != 0 || c.num_kv_heads % size != 0 || c.intermediate_size % size != 0)
      throw UnsupportedError(cat("tensor parallelism over ", size, " ranks needs ", size, " to divide the attention ",
                                 "heads, the KV heads and the MLP width; ", whole.describe(), " has ", c.num_heads,
                                 " attention heads, ", c.num_kv_heads, " KV heads and an MLP of ", c.intermediate_size));
    impl->config = c;
    impl->config.num_heads = c.num_heads / size;
    impl->config.num_kv_heads = c.num_kv_heads / size;
    impl->config.intermediate_size = c.intermediate_size / size;
  }
  impl->base = std::move(source.impl_);
  return ModelSource(std::move(impl));
}

ModelSource ModelSource::shard(ModelSource source, dist::Group& group, dist::DeviceGroup* device) {
  ModelSource part = shard(std::move(source), TensorParallel{group.rank(), group.size()});
  part.impl_->group = &group;
  part.impl_->device_group = device;
  return part;
}

void require_group_for_split(const ModelSource& src) {
  const TensorParallel tp = src.tensor_parallel();
  if (!tp.split() || src.group() != nullptr) return;
  if (src.engine_file() != nullptr)
    throw UnsupportedError(cat(src.describe(), " holds ", tp.describe(), ": run it on ", tp.size, " ranks (mpirun -np ",
                               tp.size, " PROGRAM --tensor-parallel-size ", tp.size, " --engine-file with the name ",
                               "infer-build was given; each rank loads its own file)"));
  throw UnsupportedError(cat(src.describe(), " has no group for its collectives: ModelSource::shard(whole, group) ",
                             "makes a shard that runs; shard(whole, place) is for building engine files"));
}

TensorParallel ModelSource::tensor_parallel() const noexcept { return impl_->tp; }

dist::Group* ModelSource::group() const noexcept { return impl_->group; }

dist::DeviceGroup* ModelSource::device_group() const noexcept { return impl_->device_group; }

WeightTensor ModelSource::get(std::string_view role) const {
  if (auto w = find(role)) return std::move(*w);
  const Role r = parse_role(role);
  const bool tied = r.layer < 0 && r.name->canonical == "output" && impl_->config.tie_word_embeddings;
  throw NotFoundError(cat("weight '", role, "' (tensor '", impl_->root().name_of(r), "') is not in ", describe(),
                          tied ? " (the model ties its LM head to token_embd)" : ""));
}

std::string ModelSource::file_name(std::string_view role) const { return impl_->root().name_of(parse_role(role)); }

namespace {

/// A checkpoint's scalar scale tensor as f32 (F32, BF16 or F16; shape [] or [1]): FormatError naming it unless
/// it holds one positive finite value.
float scalar_scale(const safetensors::Tensor& t, const std::string& where) {
  float v = 0.0f;
  if (t.elements() == 1 && t.dtype == DType::f32 && t.data.size() == 4) {
    std::memcpy(&v, t.data.data(), 4);
  } else if (t.elements() == 1 && (t.dtype == DType::bf16 || t.dtype == DType::f16) && t.data.size() == 2) {
    std::uint16_t h = 0;
    std::memcpy(&h, t.data.data(), 2);
    v = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  } else {
    throw FormatError(cat("KV-cache scale '", t.name, "' in ", where, " is not one f32, bf16 or f16 value (",
                          name(t.dtype), ", ", t.elements(), " values)"));
  }
  if (!valid_kv_scale(v))
    throw FormatError(cat("KV-cache scale '", t.name, "' in ", where, " is ", v, "; it must be positive and finite"));
  return v;
}

}  // namespace

std::optional<ModelSource::KvScales> ModelSource::kv_cache_scales(std::int64_t layer) const {
  if (layer < 0 || layer >= impl_->config.num_layers)
    throw InvalidArgument(cat("ModelSource::kv_cache_scales: layer ", layer, " is out of range [0, ",
                              impl_->config.num_layers, ")"));
  const Impl& whole = impl_->root();
  if (whole.engine) {  // what the checkpoint it was built from shipped
    const auto& scales = whole.engine->info().kv_cache_scales;
    if (scales.empty()) return std::nullopt;
    return KvScales{scales[static_cast<std::size_t>(layer)].first, scales[static_cast<std::size_t>(layer)].second};
  }
  if (!whole.checkpoint) return std::nullopt;  // GGUF files and dummy models ship none
  const std::string attn = cat("model.layers.", layer, ".self_attn.");
  // ModelOpt puts them on the projections, compressed-tensors and vLLM on the attention module.
  for (const auto& [k_name, v_name] : {std::pair{attn + "k_proj.k_scale", attn + "v_proj.v_scale"},
                                       std::pair{attn + "k_scale", attn + "v_scale"}}) {
    const safetensors::Tensor* k = whole.checkpoint->find(k_name);
    const safetensors::Tensor* v = whole.checkpoint->find(v_name);
    if (!k && !v) continue;
    if (!k || !v)
      throw FormatError(cat(describe(), " has '", k ? k_name : v_name, "' but not '", k ? v_name : k_name,
                            "': an FP8 KV cache needs both scales of a layer"));
    return KvScales{scalar_scale(*k, describe()), scalar_scale(*v, describe())};
  }
  return std::nullopt;
}

const Tokenizer* ModelSource::tokenizer() const noexcept {
  const Impl& whole = impl_->root();
  return whole.tokenizer ? &*whole.tokenizer : nullptr;
}

std::string ModelSource::describe() const { return impl_->describe(); }

const std::filesystem::path& ModelSource::path() const noexcept { return impl_->root().path; }

const gguf::File* ModelSource::gguf_file() const noexcept {
  const Impl& whole = impl_->root();
  return whole.gguf ? &*whole.gguf : nullptr;
}

const EngineFile* ModelSource::engine_file() const noexcept {
  const Impl& whole = impl_->root();
  return whole.engine ? &*whole.engine : nullptr;
}

}  // namespace infer
