#pragma once
/// \file
/// `detail::CudaLinear`: a linear layer's weight in the CUDA weight arena, row-major [out][in], either
/// as bf16 or as GGUF blocks used in place — and the one matmul both of the CUDA Quantizers (Bf16,
/// GgufInPlace) run: for bf16 the streaming GEMV at M = 1 and cuBLASLt above; for GGUF blocks the integer GEMV
/// at M ≤ 8, the int8 tensor-core MMA up to 32 rows and dequantize-to-scratch + GEMM above. Also `load_stacked`, which puts several [out_i][in] tensors one
/// after another into one weight (q, k, v → qkv; gate, up → gate_up), so a step runs one GEMM for them.

#if defined(INFER_HAVE_CUDA)

#include <cstdint>
#include <span>

#include "infer/backend/weight_store.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/weight_tensor.hpp"

namespace infer::detail {

struct CudaLinear {
  DType type = DType::bf16;   ///< bf16, or a GGUF block type gguf_gemv takes
  const void* data = nullptr;  ///< device, in the model's weight arena
  std::int64_t out_features = 0;
  std::int64_t in_features = 0;

  [[nodiscard]] std::int64_t out() const noexcept { return out_features; }
  [[nodiscard]] std::int64_t in() const noexcept { return in_features; }
  /// Bytes of `data` (0 for a type no matmul here runs).
  [[nodiscard]] std::size_t bytes() const noexcept {
    if (type == DType::bf16) return static_cast<std::size_t>(out_features * in_features) * 2;
    if (!kernels::cuda::gemv_supports(type) || in_features < 0 || out_features < 0) return 0;
    return static_cast<std::size_t>(row_bytes(type, static_cast<std::uint64_t>(in_features)).value_or(0)) *
           static_cast<std::size_t>(out_features);
  }
  /// Whether the matmul runs this weight: bf16 or a GGUF type gguf_gemv takes, with its bytes.
  [[nodiscard]] bool consistent() const noexcept {
    return (type == DType::bf16 || kernels::cuda::gemv_supports(type)) && data != nullptr && bytes() > 0;
  }
  /// Its sizes and its place in the weight arena, for an engine file (io/engine_file.hpp's arena visitors).
  template <class Self, class V>
  static void visit_arena(Self& self, const V& v) {
    v.scalar("type", self.type);
    v.scalar("out", self.out_features);
    v.scalar("in", self.in_features);
    v.pointer("data", self.data, self.bytes());
  }
  /// bf16 scratch values a matmul with more than kGemvMaxRows rows needs (0 for bf16 weights): the int8 MMA's
  /// workspace up to kMmqPreferredRows rows, the weight dequantized above. An LM head in blocks needs less: it is
  /// dequantized a chunk at a time into whatever scratch there is (head_scratch_elems).
  [[nodiscard]] std::size_t scratch_elems() const {
    return type == DType::bf16 ? 0 : kernels::cuda::gguf_scratch_elems(type, out_features, in_features);
  }
  /// The scratch an LM head in blocks asks for: the int8 MMA's workspace, and `chunk_rows` rows dequantized.
  [[nodiscard]] std::size_t head_scratch_elems(std::int64_t chunk_rows) const {
    if (type == DType::bf16) return 0;
    const auto rows = static_cast<std::size_t>(std::min(chunk_rows, out_features));
    return std::max(rows * static_cast<std::size_t>(in_features),
                    (kernels::cuda::gguf_mmq_workspace_bytes(type, out_features, in_features,
                                                              kernels::cuda::kMmqPreferredRows) +
                     1) /
                        2);
  }
};

/// Checks that `parts` are 2-D with one common `in`; returns the total of their rows.
inline std::int64_t stacked_rows(std::span<const WeightTensor> parts, const char* who) {
  require<InvalidArgument>(!parts.empty(), who, ": no tensors to load");
  std::int64_t rows = 0;
  for (const auto& t : parts) {
    require<InvalidArgument>(t.shape.size() == 2, who, ": tensor '", t.name, "' has ", t.shape.size(),
                             " dimensions; a linear layer's weight has 2 ([out, in])");
    require<InvalidArgument>(t.shape[1] == parts[0].shape[1], who, ": tensor '", t.name, "' has ", t.shape[1],
                             " inputs, '", parts[0].name, "' ", parts[0].shape[1], "; stacked weights share their input");
    rows += static_cast<std::int64_t>(t.shape[0]);
  }
  return rows;
}

/// `parts` stacked as bf16 (each converted on the device: dequantized, copied or filled).
inline CudaLinear load_stacked_bf16(std::span<const WeightTensor> parts, CudaWeightStore& store) {
  CudaLinear l;
  l.out_features = stacked_rows(parts, "load (bf16)");
  l.in_features = static_cast<std::int64_t>(parts[0].shape[1]);
  auto* dst = static_cast<std::uint16_t*>(store.allocate(static_cast<std::size_t>(l.out_features * l.in_features) * 2));
  l.data = dst;
  for (const auto& t : parts) {
    if (dst) store.store_bf16(dst, t);
    if (dst) dst += t.elements();
  }
  return l;
}

/// Whether a tensor stays in its GGUF blocks on the GPU (every block type the GEMV takes; never a dummy).
inline bool kept_in_blocks(const WeightTensor& t) { return kernels::cuda::gemv_supports(t.type) && !t.dummy; }

/// Whether `parts` load as one weight: all in blocks of one type, or none in blocks (stacked as bf16). Parts in
/// blocks of different types (llama.cpp's Q4_K_M keeps attn_v in Q6_K beside Q4_K q and k) are loaded apart,
/// each in its own blocks, rather than widened to bf16 together.
inline bool stacks_in_place(std::span<const WeightTensor> parts) {
  bool any = false, all = true;
  for (const auto& t : parts) {
    any = any || kept_in_blocks(t);
    all = all && kept_in_blocks(t) && t.type == parts[0].type;
  }
  return all || !any;
}

/// `parts` stacked in their GGUF blocks, when all share one type gguf_gemv takes (and none is a dummy):
/// rows of blocks are independent, so stacking is concatenating bytes. Otherwise bf16.
inline CudaLinear load_stacked_in_place(std::span<const WeightTensor> parts, CudaWeightStore& store) {
  bool in_place = true;
  for (const auto& t : parts) in_place = in_place && kept_in_blocks(t) && t.type == parts[0].type;
  if (!in_place) return load_stacked_bf16(parts, store);
  CudaLinear l;
  l.type = parts[0].type;
  l.out_features = stacked_rows(parts, "load (GGUF in place)");
  l.in_features = static_cast<std::int64_t>(parts[0].shape[1]);
  std::size_t bytes = 0;
  for (const auto& t : parts) bytes += t.data.size();
  auto* dst = static_cast<std::byte*>(store.allocate(bytes));
  l.data = dst;
  for (const auto& t : parts) {
    if (dst) store.copy_bytes(dst, t);
    if (dst) dst += t.data.size();
  }
  return l;
}

/// y[rows][w.out] = x[rows][w.in] · wᵀ, bf16 in and out, on ctx.stream.
inline void cuda_matmul(CudaMatmulContext& ctx, const CudaLinear& w, const std::uint16_t* x, std::int32_t rows,
                        std::uint16_t* y) {
  if (w.type == DType::bf16) {
    const auto* wd = static_cast<const std::uint16_t*>(w.data);
    if (rows <= kernels::cuda::bf16_gemv_preferred_rows() && kernels::cuda::bf16_gemv_supports(wd, x, w.in_features))
      kernels::cuda::bf16_gemv(wd, x, rows, w.out_features, w.in_features, y, ctx.stream);  // decode: bandwidth-bound
    else
      ctx.gemm->run(x, wd, y, rows, w.out_features, w.in_features, ctx.stream);
    return;
  }
  require<InvalidArgument>(rows <= kernels::cuda::kGemvMaxRows || ctx.scratch_elems >= w.scratch_elems(),
                           "cuda matmul: ", rows, " rows of a ", name(w.type), " weight [", w.out_features, ", ",
                           w.in_features, "] need ", w.scratch_elems(), " bf16 values of scratch; the context has ",
                           ctx.scratch_elems);
  kernels::cuda::gguf_linear(*ctx.gemm, w.type, w.data, x, rows, w.out_features, w.in_features, ctx.scratch, y,
                             ctx.stream);
}

/// cuda_matmul writing row m at y + m·ldy, for a part of a projection whose parts are loaded apart: true when
/// the kernel writes there itself (GGUF blocks at up to kMmqPreferredRows rows: the GEMV or the int8 MMA); false,
/// having done nothing, otherwise (the caller multiplies into a buffer and copies the columns).
inline bool cuda_matmul_into(CudaMatmulContext& ctx, const CudaLinear& w, const std::uint16_t* x, std::int32_t rows,
                             std::uint16_t* y, std::int64_t ldy) {
  if (w.type == DType::bf16 || rows < 1 || rows > kernels::cuda::kMmqPreferredRows) return false;
  require<InvalidArgument>(rows <= kernels::cuda::kGemvMaxRows || ctx.scratch_elems >= w.scratch_elems(),
                           "cuda matmul: ", rows, " rows of a ", name(w.type), " weight [", w.out_features, ", ",
                           w.in_features, "] need ", w.scratch_elems(), " bf16 values of scratch; the context has ",
                           ctx.scratch_elems);
  kernels::cuda::gguf_linear(*ctx.gemm, w.type, w.data, x, rows, w.out_features, w.in_features, ctx.scratch, y,
                             ctx.stream, ldy);
  return true;
}

/// Logits y[rows][w.out] (f32) = x · wᵀ for an LM head: kernels::cuda::bf16_logits, or for GGUF blocks
/// kernels::cuda::gguf_logits (the GEMV, or the head dequantized a chunk at a time into ctx's scratch).
inline void cuda_logits(CudaMatmulContext& ctx, const CudaLinear& w, const std::uint16_t* x, std::int32_t rows,
                        float* y) {
  if (w.type == DType::bf16)
    kernels::cuda::bf16_logits(*ctx.gemm, static_cast<const std::uint16_t*>(w.data), x, rows, w.out_features,
                               w.in_features, y, ctx.stream);
  else
    kernels::cuda::gguf_logits(*ctx.gemm, w.type, w.data, x, rows, w.out_features, w.in_features, ctx.scratch,
                               ctx.scratch_elems, y, ctx.stream);
}

/// Embedding rows x[i][:] = f32(w[ids[i]][:]) for a table kept as bf16 or in GGUF blocks (decoded exactly).
inline void cuda_embed(const CudaLinear& w, const std::int32_t* ids, std::int64_t n, float* x, void* stream) {
  if (w.type == DType::bf16)
    kernels::cuda::embedding(static_cast<const std::uint16_t*>(w.data), ids, n, w.in_features, x, stream);
  else
    kernels::cuda::dequantize_rows(w.type, w.data, ids, n, w.in_features, x, stream);
}

/// y[rows][w.out / 2] = silu(x·gateᵀ) * (x·upᵀ) for a stacked [gate; up] weight, in one kernel when that
/// would be cuda_matmul's GEMV (bf16 weights up to kBf16GemvPreferredRows rows, GGUF blocks up to
/// kGemvMaxRows); returns false, having done nothing, otherwise.
inline bool cuda_matmul_swiglu(CudaMatmulContext& ctx, const CudaLinear& w, const std::uint16_t* x, std::int32_t rows,
                               std::uint16_t* y) {
  if (rows < 1 || w.out_features % 2 != 0) return false;
  if (w.type == DType::bf16) {
    const auto* wd = static_cast<const std::uint16_t*>(w.data);
    if (rows > kernels::cuda::kBf16GemvPreferredRows || !kernels::cuda::bf16_gemv_supports(wd, x, w.in_features))
      return false;
    kernels::cuda::bf16_gemv_swiglu(wd, x, rows, w.out_features / 2, w.in_features, y, ctx.stream);
    return true;
  }
  if (rows > kernels::cuda::kGemvMaxRows || !kernels::cuda::gemv_supports(w.type)) return false;
  kernels::cuda::gguf_gemv_swiglu(w.type, w.data, x, rows, w.out_features / 2, w.in_features, y, ctx.stream);
  return true;
}

/// Whether the GGUF GEMV takes this weight at `rows` with x as a pre-norm (its ResidualNorm overloads).
inline bool gemv_takes_norm(const CudaLinear& w, std::int32_t rows) {
  return w.type != DType::bf16 && rows >= 1 && rows <= kernels::cuda::kGemvMaxRows &&
         kernels::cuda::gemv_supports(w.type) && kernels::cuda::gguf_gemv_fuses_norm(rows, w.in_features);
}

/// cuda_matmul with x as the pre-norm `x` (which the kernel computes, writing x.residual_out and x.normed_out),
/// row m of y at y + m·ldy (0: w.out): true where the GGUF GEMV does that (gemv_takes_norm); false, having done
/// nothing, otherwise (the caller runs residual_norm, then the matmul).
inline bool cuda_matmul_normed(CudaMatmulContext& ctx, const CudaLinear& w, const kernels::cuda::ResidualNorm& x,
                               std::int32_t rows, std::uint16_t* y, std::int64_t ldy) {
  if (!gemv_takes_norm(w, rows)) return false;
  kernels::cuda::gguf_gemv(w.type, w.data, x, rows, w.out_features, w.in_features, y, ctx.stream, ldy);
  return true;
}

/// cuda_matmul_swiglu with x as a pre-norm, where the GGUF GEMV does both; false, having done nothing, otherwise.
inline bool cuda_matmul_swiglu_normed(CudaMatmulContext& ctx, const CudaLinear& w,
                                      const kernels::cuda::ResidualNorm& x, std::int32_t rows, std::uint16_t* y) {
  if (w.out_features % 2 != 0 || !gemv_takes_norm(w, rows)) return false;
  kernels::cuda::gguf_gemv_swiglu(w.type, w.data, x, rows, w.out_features / 2, w.in_features, y, ctx.stream);
  return true;
}

/// cuda_logits with x as a pre-norm (the final norm), where the GGUF GEMV does both; false otherwise.
inline bool cuda_logits_normed(CudaMatmulContext& ctx, const CudaLinear& w, const kernels::cuda::ResidualNorm& x,
                               std::int32_t rows, float* y) {
  if (!gemv_takes_norm(w, rows)) return false;
  kernels::cuda::gguf_gemv(w.type, w.data, x, rows, w.out_features, w.in_features, y, ctx.stream);
  return true;
}

}  // namespace infer::detail

#endif  // INFER_HAVE_CUDA
