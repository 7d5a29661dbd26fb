#pragma once
/// \file
/// CUDA paged attention over the KV layout of the CPU engine: per layer, K and V each
/// `[num_blocks][block_size][num_kv_heads][head_dim]` bf16 (or e4m3 codes, value = code · scale, with
/// KvCacheDtype::fp8_e4m3: the kernels widen them to bf16 as they load them), token `p` of sequence `s` in block
/// `block_tables[s][p / block_size]` at row `p % block_size` (the same addressing as PagedKvView).
///
/// Two entry points (kernels/cuda/paged_decode_attention.cu, kernels/cuda/paged_prefill_attention.cu):
///  - decode: one query token per sequence at position seq_len - 1 (flash-decoding: long contexts are
///    split across thread blocks that each produce a partial softmax state, then merged);
///  - prefill / chunked prefill: queries of a chunk at positions start..start+count-1 attend causally to
///    cache positions 0..position (the chunk's own K/V rows must already be in the cache).
/// q in bf16, softmax and accumulation in f32, out in bf16. GQA: query head h reads KV head
/// h / (num_heads / num_kv_heads). head_dim 64 or 128; block_size a power of two in [1, 1024].
///
/// This header includes no CUDA header: device pointers are typed host pointers, bf16 values are
/// `std::uint16_t` bits and a stream is a `void*` (cudaStream_t; nullptr = the legacy default stream).
/// Every call is asynchronous and never synchronizes with the host (CUDA-graph capturable: the grid
/// depends on the shapes only, never on the device-side lengths). Bad arguments throw InvalidArgument;
/// a failed launch throws DeviceError with CUDA's message.

#include <cstddef>
#include <cstdint>

#include "infer/memory/kv_dtype.hpp"

#if defined(INFER_HAVE_CUDA)
namespace infer::kernels::cuda {

/// One layer of a batch of paged sequences, FlashInfer-style: plain pointers and sizes, all on the device.
struct PagedKvBatch {
  const void* k = nullptr;                    ///< this layer's K storage (bf16 bits, or e4m3 codes)
  const void* v = nullptr;                    ///< this layer's V storage
  const std::int32_t* block_tables = nullptr;  ///< [num_seqs][max_blocks_per_seq], device
  const std::int32_t* seq_lens = nullptr;      ///< [num_seqs] tokens in the cache (incl. this step's), device
  std::int32_t num_seqs = 0;
  std::int32_t max_blocks_per_seq = 0;
  std::int32_t block_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  KvCacheDtype kv_dtype = KvCacheDtype::automatic;  ///< automatic: bf16; fp8_e4m3: codes with these scales
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

/// How many thread blocks split each sequence's context in `paged_decode_attention` for this shape on the
/// current device: chosen from the shapes and the SM count so that num_seqs * num_kv_heads * splits fills
/// the GPU, at most one split per 64 positions of the table's capacity (max_blocks_per_seq * block_size).
/// The kernel divides each sequence's actual length (seq_lens, on the device) evenly among its splits, in
/// steps of 64 positions. 1 means no split (no workspace, no merge).
[[nodiscard]] int paged_decode_num_splits(const PagedKvBatch& batch, int num_heads);

/// Bytes of f32 workspace `paged_decode_attention` needs for this shape (0 when it does not split).
[[nodiscard]] std::size_t paged_decode_workspace_bytes(const PagedKvBatch& batch, int num_heads);

/// Decode attention: out[s][h][:] = softmax_p(q[s][h] · K[p] · scale) · V[p] over p < seq_lens[s], on the
/// tensor cores (mma.sync, f32 accumulation; P·V exact to ~2^-16: kernels/cuda/paged_decode_attention.cu).
/// One layer's K (and V) may span at most 64 GiB (32-bit offsets in 16-byte units).
/// q and out are [num_seqs][num_heads][head_dim] bf16 on the device. `workspace` (device, f32) must hold
/// at least `paged_decode_workspace_bytes(batch, num_heads)` bytes (scratch, no contents required). A
/// sequence with seq_len <= 0 gets zeros.
/// `q_row_stride`: elements from one sequence's q to the next (0: num_heads * head_dim, dense); a larger
/// stride reads q where a fused QKV projection left it. A multiple of 8 (16-byte loads).
void paged_decode_attention(const PagedKvBatch& batch, const std::uint16_t* q, int num_heads, float scale,
                            std::uint16_t* out, float* workspace, std::size_t workspace_bytes, void* stream,
                            std::int64_t q_row_stride = 0);

/// Prefill / chunked prefill: the queries of sequence s are rows q_indptr[s]..q_indptr[s+1]-1 of
/// q [total_q][num_heads][head_dim] (bf16, device), at positions q_start[s] + i; query i attends to
/// cache positions 0..q_start[s] + i. q_indptr [num_seqs + 1] and q_start [num_seqs] are on the device.
/// Chunks may be at most max_blocks_per_seq * block_size queries long (the grid is sized from that
/// bound, since the lengths stay on the device). out has q's shape. batch.seq_lens is not read (it may
/// be null): cache rows past q_start[s] + count - 1 are never read, so they need not be written.
///
/// Kernel (see PrefillPath): by default, on Hopper with a bf16 cache, flash-attention on wgmma (both products
/// on warpgroup MMA, 128 queries a thread block, kernels/cuda/sm90a/); elsewhere flash-attention-2 on the
/// tensor cores (mma.sync m16n8k16 bf16, f32 accumulators): a thread block takes 128 (or 64) queries of one (sequence, query head), walks the
/// K/V tiles of 64 positions up to its causal limit (double-buffered cp.async gathers through the block
/// table), keeps S = Q·Kᵀ and the online softmax in f32 registers and rounds P to bf16 for O += P·V
/// (error <= 2^-8 · Σ p|v| / Σ p per output value on top of the f32 path's). The CUDA-core kernel it
/// replaced (f32 everywhere) stays as a fallback, and runs whenever `out` is not 16-byte aligned.
/// `q_row_stride`: elements from one query row to the next (0: dense), as for paged_decode_attention; out
/// stays dense.
void paged_prefill_attention(const PagedKvBatch& batch, const std::uint16_t* q, const std::int32_t* q_indptr,
                             const std::int32_t* q_start, int num_heads, float scale, std::uint16_t* out,
                             void* stream, std::int64_t q_row_stride = 0);

/// Which kernel paged_prefill_attention runs, process-wide: `automatic` (the default) takes the value of the
/// environment variable INFER_PREFILL_ATTENTION, read once — `cuda_cores` (or `fallback`), `tc64`, `tc128`,
/// `wgmma`; unset or anything else means `wgmma`. `cuda_cores` forces the CUDA-core fallback (to switch off a
/// suspect tensor-core path without losing prefill); `tensor_cores_q64` / `tensor_cores_q128` force the
/// mma.sync kernel and its tile height (64 queries suit short chunks); `tensor_cores_wgmma` the wgmma kernel
/// where it runs (compute capability 9.0, bf16 cache; elsewhere it means `tensor_cores_q128`). Returns the
/// previous choice; thread-safe, takes effect at the next call (a captured CUDA graph keeps its kernel).
enum class PrefillPath : int {
  automatic = 0,
  cuda_cores = 1,
  tensor_cores_q64 = 2,
  tensor_cores_q128 = 3,
  tensor_cores_wgmma = 4
};
PrefillPath set_paged_prefill_path(PrefillPath path);

}  // namespace infer::kernels::cuda
#endif
