// CUDA paged prefill / chunked-prefill attention, flash-attention style on the CUDA cores: one thread block
// = one sequence x one query head x a tile of BQ = 32 queries (grid-striding over the chunk's tiles). K/V are
// walked in tiles of BK rows gathered through the block table into shared memory (16-byte loads, converted
// to f32); each query row is owned by 4 consecutive lanes, which split the tile's keys for the scores and the
// head's dims for the accumulator; online softmax (log2 domain) in registers, one rescale per tile.
// Only cache rows at positions <= the chunk's last position are read, so unwritten rows are never touched.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/attention.hpp"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTileQ = 32;  // kThreads / 4 lanes per query row
constexpr int kMaxGridX = 4096;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct PrefillParams {
  const std::uint16_t* k;
  const std::uint16_t* v;
  const std::int32_t* tables;
  const std::int32_t* q_indptr;
  const std::int32_t* q_start;
  const std::uint16_t* q;
  std::uint16_t* out;
  int max_blocks;
  int block_shift;
  int kv_heads;
  int num_heads;
  int group;
  float scale_log2;
};

__device__ __forceinline__ void unpack8_to(const uint4& r, float* f, float mul) {
  f[0] = __uint_as_float(r.x << 16) * mul;
  f[1] = __uint_as_float(r.x & 0xffff0000u) * mul;
  f[2] = __uint_as_float(r.y << 16) * mul;
  f[3] = __uint_as_float(r.y & 0xffff0000u) * mul;
  f[4] = __uint_as_float(r.z << 16) * mul;
  f[5] = __uint_as_float(r.z & 0xffff0000u) * mul;
  f[6] = __uint_as_float(r.w << 16) * mul;
  f[7] = __uint_as_float(r.w & 0xffff0000u) * mul;
}

template <int D>
__global__ void __launch_bounds__(kThreads) paged_prefill_kernel(const PrefillParams p) {
  constexpr int BQ = kTileQ;
  constexpr int BK = D == 64 ? 32 : 16;  // keeps the four tiles under 48 KB of static shared memory
  constexpr int KPT = BK / 4;            // keys per lane
  constexpr int DPT = D / 4;             // accumulator dims per lane
  constexpr int VPR = D / 8;             // 16-byte vectors per row
  // Rows padded by one word: the 4 lanes of a row read different keys/dims without bank conflicts.
  __shared__ float sq[BQ][D + 1];
  __shared__ float sk[BK][D + 1];
  __shared__ float sv[BK][D + 1];
  __shared__ float sp[BQ][BK + 1];

  const int seq = static_cast<int>(blockIdx.z);
  const int h = static_cast<int>(blockIdx.y);
  const int kvh = h / p.group;
  const int tid = static_cast<int>(threadIdx.x);
  const int i = tid >> 2;  // query row of the tile
  const int kq = tid & 3;  // this lane's quarter
  const int q_begin = p.q_indptr[seq];
  const int count = p.q_indptr[seq + 1] - q_begin;
  const int start = p.q_start[seq];
  const int cap = p.max_blocks << p.block_shift;
  const int block_mask = (1 << p.block_shift) - 1;
  const std::int32_t* table = p.tables + static_cast<std::size_t>(seq) * p.max_blocks;

  for (int tile = static_cast<int>(blockIdx.x); tile * BQ < count; tile += static_cast<int>(gridDim.x)) {
    const int q0 = tile * BQ;
    const int nq = min(BQ, count - q0);
    __syncthreads();  // the previous tile's readers of sq are done
    for (int idx = tid; idx < BQ * VPR; idx += kThreads) {
      const int r = idx / VPR, c = idx % VPR;
      float f[8] = {};
      if (r < nq) {
        const uint4 raw = *reinterpret_cast<const uint4*>(
            p.q + (static_cast<std::size_t>(q_begin + q0 + r) * p.num_heads + h) * D + c * 8);
        unpack8_to(raw, f, p.scale_log2);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sq[r][c * 8 + j] = f[j];
    }
    const bool row_valid = i < nq;
    const int qpos = start + q0 + i;
    const int last = min(start + q0 + nq - 1, cap - 1);  // the tile's last visible position

    float m = kNegInf, l = 0.0f;
    float o[DPT];
#pragma unroll
    for (int d = 0; d < DPT; ++d) o[d] = 0.0f;

    for (int k0 = 0; k0 <= last; k0 += BK) {
      __syncthreads();  // the previous K/V tile is consumed (and sq is written, on the first pass)
      for (int idx = tid; idx < BK * VPR; idx += kThreads) {
        const int r = idx / VPR, c = idx % VPR;
        const int kp = k0 + r;
        float kf[8] = {}, vf[8] = {};
        if (kp <= last) {
          const auto blk = static_cast<std::size_t>(__ldg(table + (kp >> p.block_shift)));
          const std::size_t row = (blk << p.block_shift) + static_cast<std::size_t>(kp & block_mask);
          const std::size_t off = (row * p.kv_heads + kvh) * D + c * 8;
          unpack8_to(__ldg(reinterpret_cast<const uint4*>(p.k + off)), kf, 1.0f);
          unpack8_to(__ldg(reinterpret_cast<const uint4*>(p.v + off)), vf, 1.0f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          sk[r][c * 8 + j] = kf[j];
          sv[r][c * 8 + j] = vf[j];
        }
      }
      __syncthreads();

      float s[KPT];
#pragma unroll
      for (int jj = 0; jj < KPT; ++jj) s[jj] = 0.0f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float qv = sq[i][d];
#pragma unroll
        for (int jj = 0; jj < KPT; ++jj) s[jj] = fmaf(qv, sk[kq + 4 * jj][d], s[jj]);
      }
      float mx = m;
#pragma unroll
      for (int jj = 0; jj < KPT; ++jj) {
        const bool visible = row_valid && k0 + kq + 4 * jj <= qpos;
        s[jj] = visible ? s[jj] : kNegInf;
        mx = fmaxf(mx, s[jj]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float corr = m == kNegInf ? 0.0f : exp2f(m - mx);
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < KPT; ++jj) {
        const float e = s[jj] == kNegInf ? 0.0f : exp2f(s[jj] - mx);
        sp[i][kq + 4 * jj] = e;
        sum += e;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l = fmaf(l, corr, sum);
      m = mx;
      __syncwarp();  // a row's probabilities are written and read by its own 4 lanes
#pragma unroll
      for (int d = 0; d < DPT; ++d) o[d] *= corr;
#pragma unroll 4
      for (int j = 0; j < BK; ++j) {
        const float pj = sp[i][j];
#pragma unroll
        for (int d = 0; d < DPT; ++d) o[d] = fmaf(pj, sv[j][kq + 4 * d], o[d]);
      }
    }

    if (row_valid) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      std::uint16_t* dst = p.out + (static_cast<std::size_t>(q_begin + q0 + i) * p.num_heads + h) * D;
#pragma unroll
      for (int d = 0; d < DPT; ++d) dst[kq + 4 * d] = f32_to_bf16(o[d] * inv);
    }
  }
}

}  // namespace

void paged_prefill_attention(const PagedKvBatch& batch, const std::uint16_t* q, const std::int32_t* q_indptr,
                             const std::int32_t* q_start, int num_heads, float scale, std::uint16_t* out,
                             void* stream) {
  using infer::detail::cat;
  const PagedKvBatch& b = batch;
  if (b.num_seqs < 0 || b.num_seqs > 65535)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: num_seqs = ", b.num_seqs, " must be in [0, 65535]"));
  if (b.head_dim != 64 && b.head_dim != 128)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: head_dim = ", b.head_dim,
                              " is not supported; the kernels are built for 64 and 128"));
  if (b.num_kv_heads <= 0 || num_heads <= 0 || num_heads > 65535 || num_heads % b.num_kv_heads != 0)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: num_heads = ", num_heads, ", num_kv_heads = ",
                              b.num_kv_heads, "; both must be positive and num_kv_heads must divide num_heads"));
  if (b.block_size <= 0 || b.block_size > 1024 || (b.block_size & (b.block_size - 1)) != 0)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: block_size = ", b.block_size,
                              " must be a power of two in [1, 1024]"));
  if (b.max_blocks_per_seq <= 0 || static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size > (std::int64_t{1} << 30))
    throw InvalidArgument(cat("cuda::paged_prefill_attention: max_blocks_per_seq = ", b.max_blocks_per_seq,
                              " must be positive and cover at most 2^30 positions"));
  if (b.num_seqs == 0) return;
  if (!b.k || !b.v || !b.block_tables || !q || !q_indptr || !q_start || !out)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: null ",
                              !b.k              ? "K"
                              : !b.v            ? "V"
                              : !b.block_tables ? "block_tables"
                              : !q              ? "q"
                              : !q_indptr       ? "q_indptr"
                              : !q_start        ? "q_start"
                                                : "out",
                              " pointer"));
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(b.k) || misaligned(b.v) || misaligned(q))
    throw InvalidArgument("cuda::paged_prefill_attention: K, V and q must be 16-byte aligned (16-byte loads)");

  PrefillParams p{};
  p.k = b.k;
  p.v = b.v;
  p.tables = b.block_tables;
  p.q_indptr = q_indptr;
  p.q_start = q_start;
  p.q = q;
  p.out = out;
  p.max_blocks = b.max_blocks_per_seq;
  int shift = 0;
  while ((1 << shift) < b.block_size) ++shift;
  p.block_shift = shift;
  p.kv_heads = b.num_kv_heads;
  p.num_heads = num_heads;
  p.group = num_heads / b.num_kv_heads;
  p.scale_log2 = scale * kLog2e;

  // The chunk lengths stay on the device: size the grid from the longest chunk a sequence can hold;
  // blocks past their chunk's end exit at once, and the kernel grid-strides beyond kMaxGridX tiles.
  const std::int64_t cap = static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size;
  std::int64_t tiles = (cap + kTileQ - 1) / kTileQ;
  if (tiles > kMaxGridX) tiles = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(num_heads), static_cast<unsigned>(b.num_seqs));
  auto s = static_cast<cudaStream_t>(stream);
  if (b.head_dim == 64) paged_prefill_kernel<64><<<grid, kThreads, 0, s>>>(p);
  else paged_prefill_kernel<128><<<grid, kThreads, 0, s>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw DeviceError(cat("cuda::paged_prefill_attention(", b.num_seqs, " sequences, ", num_heads, "/",
                          b.num_kv_heads, " heads of ", b.head_dim, "): kernel launch failed: ", cudaGetErrorName(err),
                          ": ", cudaGetErrorString(err)));
}

}  // namespace infer::kernels::cuda
