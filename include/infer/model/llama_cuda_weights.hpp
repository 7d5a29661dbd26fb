#pragma once
/// \file
/// `LlamaCudaWeights<Q>`: the GPU decoder's weights, loaded into one device arena (the first layer of
/// model/llama_cuda.hpp's split: weights here, step metadata in step_metadata_cuda.hpp, graphs in
/// decode_graphs_cuda.hpp, the computation in llama_cuda.hpp).
///
/// The arena is sized by a measuring pass over the same loading code (CudaWeightStore), then filled.
/// q/k/v and gate/up are each stored stacked (one weight) when the Quantizer can (`load_stacked`), else as
/// parts whose outputs the model writes side by side (a Quantizer may refuse to stack some parts, `Q::stacks`).
/// The embedding and the LM head are bf16 unless the Quantizer serves tables (`Q::embed` and `Q::logits`:
/// GgufInPlace keeps them in their blocks, so a step reads the file's bytes); a tied head is the embedding
/// itself. Every tensor's shape is checked against the config before the Quantizer sees it, except where the
/// Quantizer loads by role (quant/linear_request.hpp) and checks its own.

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/backend/cuda_upload.hpp"
#include "infer/backend/weight_store.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/io/engine_file.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/quant/linear_request.hpp"

namespace infer {

template <class Q>
  requires Quantizer<Q, cuda>
class LlamaCudaWeights {
 public:
  using linear = typename Q::template linear<cuda>;
  using bf16 = std::uint16_t;

  /// A projection of several stacked outputs (qkv, gate_up): one weight when Q can stack them, else the
  /// parts, whose outputs are copied side by side.
  struct Projection {
    std::vector<linear> parts;
    std::int64_t out = 0;
  };
  struct Layer {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* qkv_bias = nullptr;  ///< [q_size + 2 kv_size], Qwen2 only
    Projection qkv, gate_up;
    linear o, down;
  };

  /// Loads every weight of `src` into one arena, enqueued on `stream` (done when the stream is).
  /// Errors as ModelSource / the Quantizer, naming the tensor; FormatError for a shape that differs from
  /// the config; DeviceError when the device cannot hold the weights. An engine file's arena is copied as
  /// it is (restore); FormatError naming the file when it holds another Quantizer's layout or an offset or
  /// size its config does not allow.
  LlamaCudaWeights(const ModelSource& src, void* stream) {
    if (const EngineFile* file = src.engine_file()) {
      restore(*file, stream);
      return;
    }
    CudaWeightStore measuring;
    load(src, measuring);  // sizes only
    CudaWeightStore store(measuring.measured_bytes(), stream);
    load(src, store);
    store.finish();
    arena_ = store.release_arena();
  }

  LlamaCudaWeights(LlamaCudaWeights&&) noexcept = default;
  LlamaCudaWeights& operator=(LlamaCudaWeights&&) noexcept = default;

  /// x[i][:] = the embedding row of ids[i], f32, for n ids.
  void embed(const std::int32_t* ids, std::int64_t n, std::int64_t H, float* x, void* stream) const {
    if constexpr (kTables) Q::embed(embedding_table_, ids, n, x, stream);
    else kernels::cuda::embedding(embedding_, ids, n, H, x, stream);
  }
  /// logits[rows][V] (f32) = x · headᵀ.
  void logits(CudaMatmulContext& ctx, const bf16* x, std::int32_t rows, std::int64_t V, std::int64_t H,
              float* y) const {
    if constexpr (kTables) Q::logits(ctx, head_table_, x, rows, y);
    else kernels::cuda::bf16_logits(*ctx.gemm, lm_head_, x, rows, V, H, y, ctx.stream);
  }
  /// logits with x given as the final norm `x` (kernels::cuda::ResidualNorm), computed inside the head's matmul
  /// where the Quantizer's `logits_normed` hook takes it: true then; false, having done nothing, otherwise.
  bool logits_normed(CudaMatmulContext& ctx, const kernels::cuda::ResidualNorm& x, std::int32_t rows, float* y) const {
    if constexpr (kTables && requires { { Q::logits_normed(ctx, head_table_, x, rows, y) } -> std::same_as<bool>; })
      return Q::logits_normed(ctx, head_table_, x, rows, y);
    else
      return false;
  }
  [[nodiscard]] const float* output_norm() const noexcept { return output_norm_; }
  [[nodiscard]] const std::vector<Layer>& layers() const noexcept { return layers_; }
  /// The widest unstacked projection's output (0: every projection is stacked): the model's split buffer.
  [[nodiscard]] std::int64_t split_out() const noexcept { return split_out_; }
  /// Device bytes of matmul workspace a step of T rows needs (0: none), the model's scratch buffer: the most
  /// any linear asks for, by `workspace_bytes(rows)` (Fp8: the activation's codes and scales) or, in a step
  /// above kGemvMaxRows rows, by `scratch_elems()` (a GGUF weight's int8 MMA workspace, or the weight
  /// dequantized to bf16 for the GEMM).
  [[nodiscard]] std::size_t workspace_bytes(std::int64_t T) const {
    std::size_t bytes = 0;
    const auto need = [&](const linear& w) {
      if constexpr (requires { w.workspace_bytes(T); }) bytes = std::max(bytes, w.workspace_bytes(T));
      if constexpr (requires { w.scratch_elems(); })
        if (T > kernels::cuda::kGemvMaxRows) bytes = std::max(bytes, w.scratch_elems() * sizeof(bf16));
    };
    for (const Layer& L : layers_) {
      for (const linear& w : L.qkv.parts) need(w);
      for (const linear& w : L.gate_up.parts) need(w);
      need(L.o);
      need(L.down);
    }
    // A head in blocks is dequantized a chunk of rows at a time into this scratch: at least kHeadChunkRows of
    // it, even where every layer is bf16 and asks for none.
    if constexpr (kTables && requires { head_table_.head_scratch_elems(kHeadChunkRows); })
      if (T > kernels::cuda::kGemvMaxRows)
        bytes = std::max(bytes, head_table_.head_scratch_elems(kHeadChunkRows) * sizeof(bf16));
    return bytes;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return arena_.used(); }
  /// The layers' distinct weight shapes (N, K), each linear's and each stacked part's: what a prefill's GEMMs
  /// multiply, for tuning them ahead (kernels::cuda::Gemm::tune, at engine build).
  [[nodiscard]] std::vector<std::pair<std::int64_t, std::int64_t>> gemm_shapes() const {
    std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
    const auto add = [&](const linear& w) {
      const std::pair<std::int64_t, std::int64_t> s{w.out(), w.in()};
      if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
    };
    for (const Layer& L : layers_) {
      for (const linear& w : L.qkv.parts) add(w);
      for (const linear& w : L.gate_up.parts) add(w);
      add(L.o);
      add(L.down);
    }
    return shapes;
  }

  /// Writes the weights into `out` as an engine file's parts: the arena, copied into `host` (which must
  /// outlive out.write()), as the part "arena", and every pointer into it and every size as scalars.
  void save(const ModelConfig& c, EngineFileWriter& out, std::vector<std::byte>& host) const {
    host.resize(arena_.used());
    backend::cuda::check(cudaMemcpy(host.data(), arena_.base(), host.size(), cudaMemcpyDeviceToHost),
                         "LlamaCudaWeights: copying the weight arena to the host");
    out.add_part("arena", element_type_name<std::uint8_t>(), std::span<const std::byte>(host));
    visit_arena(*this, c, EngineArenaSaver{out, arena_.base(), ""});
  }

 private:
  static constexpr bool kStacks = requires(std::span<const WeightTensor> parts, CudaWeightStore& s) {
    { Q::template load_stacked<cuda>(parts, s) } -> std::same_as<linear>;
  };
  /// A Quantizer that may refuse to stack some parts (GgufInPlace: blocks of different types).
  static constexpr bool kMayRefuseStack = requires(std::span<const WeightTensor> parts) {
    { Q::stacks(parts) } -> std::same_as<bool>;
  };
  /// A Quantizer that serves the embedding and the LM head in its own format.
  static constexpr bool kTables = requires(const linear& w, CudaMatmulContext& ctx, const bf16* x,
                                           const std::int32_t* ids, float* y, void* s) {
    Q::embed(w, ids, std::int64_t{}, y, s);
    Q::logits(ctx, w, x, std::int32_t{}, y);
  };
  struct NoTable {};
  using Table = std::conditional_t<kTables, linear, NoTable>;
  /// The fewest head rows one dequantize + GEMM of the logits takes (the scratch may allow more).
  static constexpr std::int64_t kHeadChunkRows = 4096;
  /// A Quantizer that stacks by role (each part's companions, such as an FP8 checkpoint's weight_scale).
  static constexpr bool kStacksByRole = requires(std::span<const LinearRequest> parts, CudaWeightStore& s) {
    { Q::template load_stacked<cuda>(parts, s) } -> std::same_as<linear>;
  };

  static void check_shape(const ModelSource& src, const WeightTensor& t, std::int64_t out, std::int64_t in) {
    const bool ok = in == 0 ? (t.shape.size() == 1 && t.shape[0] == static_cast<std::uint64_t>(out))
                            : (t.shape.size() == 2 && t.shape[0] == static_cast<std::uint64_t>(out) &&
                               t.shape[1] == static_cast<std::uint64_t>(in));
    if (!ok)
      throw FormatError(detail::cat(src.describe(), ": tensor '", t.name, "' has shape ", shape_text(t.shape),
                                    ", expected ", in == 0 ? detail::cat("[", out, "]") : detail::cat("[", out, ", ", in, "]"),
                                    " from the model config"));
  }
  static std::string shape_text(const std::vector<std::uint64_t>& s) {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }

  /// A stacked projection: one weight when Q stacks, by role or by tensor (each checked to be [out, in]
  /// first), else each part through load_linear (by role where Q loads by role).
  Projection load_projection(std::span<const LinearRequest> parts, CudaWeightStore& store) {
    Projection p;
    for (const auto& r : parts) p.out += r.out;
    if constexpr (kStacksByRole) {
      p.parts.push_back(Q::template load_stacked<cuda>(parts, store));
    } else if constexpr (kStacks) {
      std::vector<WeightTensor> tensors;
      for (const auto& r : parts) tensors.push_back(r.checked_weight());
      // Runs of neighbouring parts that stack load as one weight each (all of them, usually; Q4_K_M files
      // keep q and k in Q4_K and v in Q6_K in half the layers: [q; k] and v, two GEMVs a step, not three).
      const std::span<const WeightTensor> all(tensors);
      auto stacks = [&](std::size_t from, std::size_t to) {
        if constexpr (kMayRefuseStack) return Q::stacks(all.subspan(from, to - from));
        else return true;
      };
      for (std::size_t i = 0; i < tensors.size();) {
        std::size_t j = i + 1;
        while (j < tensors.size() && stacks(i, j + 1)) ++j;
        if (j - i > 1 || tensors.size() == 1) p.parts.push_back(Q::template load_stacked<cuda>(all.subspan(i, j - i), store));
        else p.parts.push_back(Q::template load<cuda>(tensors[i], store));
        i = j;
      }
      if (p.parts.size() > 1) split_out_ = std::max(split_out_, p.out);
    } else {
      for (const auto& r : parts) p.parts.push_back(infer::load_linear<Q, cuda>(r, store));
      split_out_ = std::max(split_out_, p.out);
    }
    return p;
  }
  linear load_linear(const LinearRequest& r, CudaWeightStore& store) { return infer::load_linear<Q, cuda>(r, store); }
  const bf16* load_bf16_matrix(const ModelSource& src, const WeightTensor& t, std::int64_t rows, std::int64_t cols,
                               CudaWeightStore& store) {
    check_shape(src, t, rows, cols);
    auto* p = static_cast<bf16*>(store.allocate(static_cast<std::size_t>(rows * cols) * sizeof(bf16)));
    if (p) store.store_bf16(p, t);
    return p;
  }
  const float* load_f32_vectors(const ModelSource& src, std::span<const WeightTensor> parts,
                                std::span<const std::int64_t> sizes, CudaWeightStore& store) {
    std::int64_t total = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      check_shape(src, parts[i], sizes[i], 0);
      total += sizes[i];
    }
    auto* p = static_cast<float*>(store.allocate(static_cast<std::size_t>(total) * sizeof(float)));
    float* at = p;
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (p) {
        store.store_f32(at, parts[i]);
        at += sizes[i];
      }
    return p;
  }

  /// Every pointer into the arena and every size, in one order for saving and restoring (io/engine_file.hpp's
  /// arena visitors): the Quantizer's linears list their own (`visit_arena`).
  template <class Self, class V>
  static void visit_arena(Self& w, const ModelConfig& c, const V& v) {
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(std::max<std::int64_t>(x, 0)); };
    const std::size_t H = n(c.hidden_size), V_ = n(w.vocab_rows_);
    const std::size_t qkv_out = n(c.q_size() + 2 * c.kv_size());
    if constexpr (kTables) {
      linear::visit_arena(w.embedding_table_, v.at("token_embd"));
      linear::visit_arena(w.head_table_, v.at("output"));
    } else {
      v.pointer("token_embd", w.embedding_, V_ * H * sizeof(bf16));
      v.pointer("output", w.lm_head_, V_ * H * sizeof(bf16));
    }
    v.pointer("output_norm", w.output_norm_, H * sizeof(float));
    v.scalar("split_out", w.split_out_);
    const auto projection = [](auto& p, const V& pv) {
      std::size_t parts = p.parts.size();
      pv.scalar("parts", parts);
      pv.scalar("out", p.out);
      if constexpr (!std::is_const_v<std::remove_reference_t<decltype(p)>>) {
        if (parts < 1 || parts > 3) throw FormatError(detail::cat("engine file: a projection of ", parts, " parts"));
        p.parts.resize(parts);
      }
      for (std::size_t k = 0; k < parts; ++k) linear::visit_arena(p.parts[k], pv.at(std::to_string(k)));
    };
    for (std::size_t i = 0; i < w.layers_.size(); ++i) {
      auto& L = w.layers_[i];
      const V lv = v.at(detail::cat("blk.", i));
      lv.pointer("attn_norm", L.attn_norm, H * sizeof(float));
      lv.pointer("ffn_norm", L.ffn_norm, H * sizeof(float));
      lv.pointer("qkv_bias", L.qkv_bias, c.attention_bias ? qkv_out * sizeof(float) : 0);
      projection(L.qkv, lv.at("qkv"));
      projection(L.gate_up, lv.at("gate_up"));
      linear::visit_arena(L.o, lv.at("attn_output"));
      linear::visit_arena(L.down, lv.at("ffn_down"));
    }
  }

  /// The engine file's arena on the device and every pointer placed (see the constructor).
  void restore(const EngineFile& file, void* stream) {
    using detail::cat;
    const EngineFileInfo& info = file.info();
    const std::string where = cat("engine file '", file.path().string(), "'");
    file.require_quantizer_layout(Q::name);
    const ModelConfig& c = info.config;
    vocab_rows_ = info.tensor_parallel.vocab_rows(c.vocab_size);  // a rank's file: its block of the vocabulary
    const std::span<const std::byte> bytes = file.part("arena", element_type_name<std::uint8_t>());
    layers_.resize(static_cast<std::size_t>(c.num_layers));
    // Placed against the file's own bytes (never dereferenced) and checked before any byte moves: a bad
    // file costs no device memory.
    visit_arena(*this, c, EngineArenaLoader{file, bytes.data(), bytes.size(), ""});
    const std::int64_t H = c.hidden_size, I = c.intermediate_size, qs = c.q_size(), kvs = c.kv_size();
    const auto check = [&](const std::string& role, std::int64_t out, std::int64_t in, std::int64_t want_out,
                           std::int64_t want_in) {
      if (out != want_out || in != want_in)
        throw FormatError(cat(where, ": weight '", role, "' is [", out, ", ", in, "]; the config implies [", want_out,
                              ", ", want_in, "]"));
    };
    const auto check_linear = [&](const std::string& role, const linear& l, std::int64_t out, std::int64_t in) {
      if (!l.consistent()) throw FormatError(cat(where, ": weight '", role, "' is not one this Quantizer runs"));
      check(role, l.out(), l.in(), out, in);
    };
    const auto check_projection = [&](const std::string& role, const Projection& p, std::int64_t out, std::int64_t in) {
      std::int64_t sum = 0;
      for (std::size_t k = 0; k < p.parts.size(); ++k) {
        check_linear(cat(role, ".", k), p.parts[k], p.parts[k].out(), in);
        sum += p.parts[k].out();
      }
      check(role, sum, in, out, in);
      check(role, p.out, in, out, in);
      if (p.parts.size() > 1 && split_out_ < p.out)
        throw FormatError(cat(where, ": split_out ", split_out_, " is less than '", role, "''s ", p.out, " outputs"));
    };
    if constexpr (kTables) {
      check_linear("token_embd", embedding_table_, vocab_rows_, H);
      check_linear("output", head_table_, vocab_rows_, H);
    }
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      const std::string blk = cat("blk.", i, ".");
      check_projection(blk + "qkv", L.qkv, qs + 2 * kvs, H);
      check_projection(blk + "gate_up", L.gate_up, 2 * I, H);
      check_linear(blk + "attn_output", L.o, H, qs);
      check_linear(blk + "ffn_down", L.down, H, I);
    }
    arena_ = backend::cuda::DeviceArena(bytes.size());
    void* base = arena_.allocate(bytes.size());
    backend::cuda::upload_staged(base, bytes, stream);
    visit_arena(*this, c, EngineArenaLoader{file, base, bytes.size(), ""});
  }

  void load(const ModelSource& src, CudaWeightStore& store) {
    using detail::cat;
    const ModelConfig& c = src.config();
    // A tensor-parallel shard's embedding and head hold its block of the vocabulary (the rest: the whole).
    const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = src.tensor_parallel().vocab_rows(c.vocab_size),
                       qs = c.q_size(), kvs = c.kv_size();
    vocab_rows_ = V;
    split_out_ = 0;
    layers_.clear();
    const WeightTensor embd = src.get("token_embd");
    if constexpr (kTables) {
      check_shape(src, embd, V, H);
      embedding_table_ = Q::template load<cuda>(embd, store);
      if (c.tie_word_embeddings) {
        head_table_ = embedding_table_;
      } else {
        const WeightTensor head = src.get("output");
        check_shape(src, head, V, H);
        head_table_ = Q::template load<cuda>(head, store);
      }
    } else {
      embedding_ = load_bf16_matrix(src, embd, V, H, store);
      lm_head_ = c.tie_word_embeddings ? embedding_ : load_bf16_matrix(src, src.get("output"), V, H, store);
    }
    {
      const WeightTensor n = src.get("output_norm");
      const std::array<std::int64_t, 1> sz{H};
      output_norm_ = load_f32_vectors(src, std::span(&n, 1), sz, store);
    }
    layers_.reserve(static_cast<std::size_t>(c.num_layers));
    for (std::int64_t i = 0; i < c.num_layers; ++i) {
      const auto role = [&](const char* name) { return cat("blk.", i, ".", name); };
      Layer L;
      const std::array<std::int64_t, 1> hsz{H};
      const WeightTensor an = src.get(role("attn_norm")), fn = src.get(role("ffn_norm"));
      L.attn_norm = load_f32_vectors(src, std::span(&an, 1), hsz, store);
      L.ffn_norm = load_f32_vectors(src, std::span(&fn, 1), hsz, store);
      const std::array<LinearRequest, 3> qkv{LinearRequest{src, role("attn_q"), qs, H},
                                             LinearRequest{src, role("attn_k"), kvs, H},
                                             LinearRequest{src, role("attn_v"), kvs, H}};
      L.qkv = load_projection(qkv, store);
      if (c.attention_bias) {
        const std::array<WeightTensor, 3> b{src.get(role("attn_q.bias")), src.get(role("attn_k.bias")),
                                            src.get(role("attn_v.bias"))};
        const std::array<std::int64_t, 3> sz{qs, kvs, kvs};
        L.qkv_bias = load_f32_vectors(src, b, sz, store);
      }
      L.o = load_linear(LinearRequest{src, role("attn_output"), H, qs}, store);
      const std::array<LinearRequest, 2> gu{LinearRequest{src, role("ffn_gate"), I, H},
                                            LinearRequest{src, role("ffn_up"), I, H}};
      L.gate_up = load_projection(gu, store);
      L.down = load_linear(LinearRequest{src, role("ffn_down"), H, I}, store);
      layers_.push_back(std::move(L));
    }
  }

  backend::cuda::DeviceArena arena_;
  const bf16* embedding_ = nullptr;  ///< without kTables: bf16 tables
  const bf16* lm_head_ = nullptr;
  Table embedding_table_{};  ///< with kTables: the Quantizer's tables
  Table head_table_{};
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::int64_t split_out_ = 0;
  std::int64_t vocab_rows_ = 0;  ///< rows of the embedding and head: the vocabulary, or a shard's block of it
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
