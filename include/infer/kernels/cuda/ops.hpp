#pragma once
/// \file
/// The decoder's elementwise CUDA kernels: embedding gather, residual add + RMSNorm, RoPE with the
/// paged-KV write, SwiGLU and the residual add. Compiled in kernels/cuda/{embedding,rmsnorm,rope_kv,
/// swiglu}.cu; this header includes no CUDA header, so host code can call them.
///
/// Conventions: every pointer is device memory; bf16 values are their `std::uint16_t` bits; the
/// residual stream is f32; `stream` is a cudaStream_t (nullptr = the legacy default stream). All calls
/// are asynchronous and never synchronize. InvalidArgument for a null pointer with work to do, a
/// negative size or an unsupported shape; DeviceError (CUDA's name and message) when a launch fails.
/// Rows are tokens, row-major, densely packed.

#if defined(INFER_HAVE_CUDA)

#include <cstdint>

#include "infer/memory/kv_dtype.hpp"

namespace infer::kernels::cuda {

/// out[i][:] = f32(table_bf16[ids[i]][:]) for i < n: the token embeddings into the f32 residual
/// stream; zeros for a negative id (a row another tensor-parallel rank holds). Ids must lie below the
/// table's rows: they come from the tokenizer and are checked on the host when a request is admitted, so
/// the kernel does not check them again.
void embedding(const std::uint16_t* table_bf16, const std::int32_t* ids, std::int64_t n, std::int64_t dim,
               float* out, void* stream);

/// For each of `rows` rows of `dim` values: residual += delta (skipped when delta is null), then
/// out_bf16 = bf16(residual / sqrt(mean(residual²) + eps) * weight). The pre-norm step of every
/// decoder layer, fused with the previous layer's residual add. One block per row; 16-byte loads
/// when dim % 4 == 0 and the pointers allow. The sum of squares is an f32 tree reduction.
void add_rmsnorm(float* residual, const float* delta, const float* weight, std::int64_t rows, std::int64_t dim,
                 float eps, std::uint16_t* out_bf16, void* stream);

/// add_rmsnorm with a bf16 delta (a projection's output): residual += f32(delta_bf16), then the norm. The
/// decoder's residual add after attention and after the MLP, fused into the next norm (8-byte delta loads
/// when dim % 4 == 0).
void add_bf16_rmsnorm(float* residual, const std::uint16_t* delta_bf16, const float* weight, std::int64_t rows,
                      std::int64_t dim, float eps, std::uint16_t* out_bf16, void* stream);

/// A decoder layer's pre-norm as a value: x = bf16(r · rsqrt(mean(r²) + eps) · weight) per row, r = residual +
/// f32(delta), and where its results go. add_bf16_rmsnorm computes it in place; given out of place, a kernel that
/// reads x can compute it in its own prologue (gguf_gemv) and save the decode step a kernel, while
/// `residual_norm` below is the same thing standalone. Pointers are device memory, rows `dim` values apart;
/// residual, residual_out and normed_out 16-byte aligned for the fused kernels.
struct ResidualNorm {
  const float* residual = nullptr;       ///< [rows][dim] f32, read
  const std::uint16_t* delta = nullptr;  ///< [rows][dim] bf16 added to the residual; null: nothing added
  const float* weight = nullptr;         ///< [dim] f32, the norm's weight
  float eps = 1e-6f;
  /// [rows][dim]: residual + delta. Null: not written (no delta, or a last norm whose residual nobody reads). A
  /// fused kernel needs it apart from `residual` (its CTAs read the residual while others write); the standalone
  /// kernel also takes it equal (in place).
  float* residual_out = nullptr;
  std::uint16_t* normed_out = nullptr;  ///< [rows][dim] bf16 x; null: not written (the fused kernels only)
};

/// The standalone ResidualNorm: what add_bf16_rmsnorm computes, with the residual's sum written to
/// n.residual_out (which may equal n.residual) and x to n.normed_out (required).
void residual_norm(const ResidualNorm& n, std::int64_t rows, std::int64_t dim, void* stream);

/// RoPE on the fused QKV projection output and the KV-cache write, for T tokens.
/// `qkv_bf16` is [T][(nq + 2 * nkv) * hd]: q heads, then k heads, then v heads. q and k are rotated in
/// place (k is also left rotated in `qkv_bf16`, so a prefill attention kernel may read it from there);
/// then k and v of token t are written to cache row `slot[t]` (block * block_size + offset) of this
/// layer's `k_cache`/`v_cache`, each [num_blocks * block_size][nkv][hd]. A negative slot (a padding
/// token) writes nothing to the cache.
///
/// The angle of pair i is `float(positions[t]) * inv_freq[i]` in f32 on the device, then an accurate
/// sincosf. kernels::cpu::rope instead uses a precomputed cos/sin table whose angles are taken in
/// double, so the two differ by up to ~|angle| * 2^-24 in the angle: far below bf16's resolution for
/// any position below 2^16, which is how the tests compare them.
/// rope_style: 0 = neox (pairs (i, i + hd/2)), 1 = interleaved (pairs (2i, 2i + 1)), as RopeStyle.
/// hd must be even.
/// An FP8 cache (kv_dtype fp8_e4m3) gets e4m3 codes instead of bf16 values: code = e4m3(value / scale)
/// (round to nearest even, saturating at ±448, as __nv_cvt_float_to_fp8 and the CPU's f32_to_e4m3), value
/// the bf16 result above, k_scale for K and v_scale for V (positive and finite).
void rope_write_kv(std::uint16_t* qkv_bf16, const std::int32_t* positions, const float* inv_freq, std::int64_t T,
                   int nq, int nkv, int hd, int rope_style, void* k_cache, void* v_cache, const std::int64_t* slot,
                   void* stream, KvCacheDtype kv_dtype = KvCacheDtype::automatic, float k_scale = 1.0f,
                   float v_scale = 1.0f);

/// out[t][i] = bf16(silu(gate) * up) with gate = gate_up[t][i], up = gate_up[t][I + i] (the fused
/// gate/up projection's output) and silu(g) = g / (1 + exp(-g)), computed in f32.
void swiglu(const std::uint16_t* gate_up, std::int64_t T, std::int64_t I, std::uint16_t* out, void* stream);

/// residual[i] += f32(delta_bf16[i]) for n values (the residual add after attention or the MLP).
void add(float* residual, const std::uint16_t* delta_bf16, std::int64_t n, void* stream);

/// x[t][c] = bf16(f32(x[t][c]) + bias[c]) for T rows of `cols` (Qwen2's q/k/v biases on the fused
/// projection's output; `bias` is f32 [cols]). kernels/cuda/rows.cu.
void add_bias(std::uint16_t* x_bf16, const float* bias, std::int64_t T, std::int64_t cols, void* stream);

/// dst[i][:] = src[rows[i]][:] for i < n, rows of `dim` f32 values (the sampled rows of a prefill step,
/// before the final norm and the LM head). kernels/cuda/rows.cu.
void gather_rows(const float* src, const std::int32_t* rows, std::int64_t n, std::int64_t dim, float* dst,
                 void* stream);

}  // namespace infer::kernels::cuda

#endif  // INFER_HAVE_CUDA
