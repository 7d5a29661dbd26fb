// CUDA paged decode attention (flash-decoding). One thread block = one sequence x one KV head x up to GT
// query heads of its group x one split of the context, so each K/V row is read from memory once for the
// whole group. Inside the block, D/8 lanes own one K/V row (16-byte loads, 8 bf16 each) and a warp walks
// 32/(D/8) rows at a time, U steps unrolled so 2U loads are in flight per thread; the split's block-table
// entries are staged in shared memory first, so no K/V load waits behind a table read. Every lane group keeps its
// own online-softmax state (max m, sum l, acc over its 8 dims) in registers; the groups are merged through
// shared memory at the end, and the splits of a sequence by a second kernel. Scores are kept in the log2
// domain (q is pre-multiplied by scale * log2 e) so the softmax uses exp2.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/attention.hpp"
#include "chained_launch.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
/// A split covers at least this many positions: below it the merge costs more than the parallelism gives.
constexpr int kMinSplitLen = 256;
constexpr int kMaxSplits = 256;
/// Block-table entries a thread block stages in shared memory at a time.
constexpr int kTableWindow = 256;
/// Resident blocks per SM the register allocation must allow, per heads per block: the registers the
/// compiler chose at commit decfb75 (64, 80, 128, 255), where the b64 ctx-2048 benchmark read 2.83 TB/s.
/// Left to itself it drifted to 145 at GT = 4 with an unrelated change (q's row stride): 3 blocks per SM
/// instead of 4, so a 64-sequence, 8-KV-head batch no longer fit one wave unsplit and read 2.34-2.38 TB/s.
template <int GT>
constexpr int kMinBlocksPerSm = GT == 1 ? 8 : GT == 2 ? 6 : GT == 4 ? 4 : 1;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct DecodeParams {
  const std::uint16_t* k;
  const std::uint16_t* v;
  const std::int32_t* tables;
  const std::int32_t* lens;
  const std::uint16_t* q;
  std::int64_t q_stride;  ///< elements from one sequence's q to the next
  std::uint16_t* out;
  float* ws_ml;   ///< [seq][head][split][2]: max (log2 domain), sum
  float* ws_acc;  ///< [seq][head][split][D]: unnormalized accumulator
  int max_blocks;
  int block_shift;
  int kv_heads;
  int num_heads;
  int group;        ///< query heads per KV head
  int head_chunks;  ///< thread blocks per KV head along the group (group > GT)
  int splits;
  int split_len;
  float scale_log2;
};

__device__ __forceinline__ float lo_bf16(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(std::uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ void unpack8(const uint4& r, float* f) {
  f[0] = lo_bf16(r.x);
  f[1] = hi_bf16(r.x);
  f[2] = lo_bf16(r.y);
  f[3] = hi_bf16(r.y);
  f[4] = lo_bf16(r.z);
  f[5] = hi_bf16(r.z);
  f[6] = lo_bf16(r.w);
  f[7] = hi_bf16(r.w);
}

__device__ __forceinline__ uint4 load_nc(const std::uint16_t* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

template <int D, int GT>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<GT>) paged_decode_kernel(const DecodeParams p) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  constexpr int TPR = D / 8;          // lanes per K/V row
  constexpr int RPW = 32 / TPR;       // rows per warp per step
  constexpr int ROWS = kWarps * RPW;  // rows per block per step (= lane groups)

  __shared__ float sm_m[ROWS][GT];
  __shared__ float sm_l[ROWS][GT];
  __shared__ __align__(16) float sm_acc[ROWS][GT][D];

  const int seq = static_cast<int>(blockIdx.z);
  const int kvh = static_cast<int>(blockIdx.y) / p.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int split = static_cast<int>(blockIdx.x);
  const int h0 = kvh * p.group + chunk * GT;
  const int nh = min(GT, p.group - chunk * GT);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int dl = lane % TPR;  // this lane's 8 dims: dl*8 .. dl*8+7
  const int group_id = warp * RPW + lane / TPR;

  // Never read past the block table, even when a caller's seq_len is too large.
  const int len = min(p.lens[seq], p.max_blocks << p.block_shift);
  const int begin = split * p.split_len;
  const int end = min(len, begin + p.split_len);

  float qr[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (g < nh) {
      const uint4 raw = *reinterpret_cast<const uint4*>(
          p.q + static_cast<std::size_t>(seq) * static_cast<std::size_t>(p.q_stride) + static_cast<std::size_t>(h0 + g) * D + dl * 8);
      unpack8(raw, qr[g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) qr[g][i] *= p.scale_log2;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) qr[g][i] = 0.0f;
    }
  }

  float m[GT], l[GT], acc[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    m[g] = kNegInf;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }

  const std::int32_t* table = p.tables + static_cast<std::size_t>(seq) * p.max_blocks;
  const int block_mask = (1 << p.block_shift) - 1;
  // The split's block-table entries are staged in shared memory, a window at a time, so a K/V load
  // waits on one memory access, not on a table read first.
  __shared__ std::int32_t sm_table[kTableWindow];
  const int window = (kTableWindow - 1) << p.block_shift;  // positions whose blocks fit, at any alignment
  for (int wbeg = begin; wbeg < end; wbeg += window) {
    const int wend = min(end, wbeg + window);
    const int first_block = wbeg >> p.block_shift;
    const int nblocks = ((wend - 1) >> p.block_shift) - first_block + 1;
    __syncthreads();  // the previous window's readers are done
    for (int i = static_cast<int>(threadIdx.x); i < nblocks; i += kThreads) sm_table[i] = __ldg(table + first_block + i);
    __syncthreads();
    for (int base = wbeg; base < wend; base += ROWS * kUnroll) {
      uint4 kr[kUnroll], vr[kUnroll];
      bool valid[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int pos = base + u * ROWS + group_id;
        valid[u] = pos < wend;
        if (valid[u]) {
          const auto blk = static_cast<std::size_t>(sm_table[(pos >> p.block_shift) - first_block]);
          const std::size_t row = (blk << p.block_shift) + static_cast<std::size_t>(pos & block_mask);
          const std::size_t off = (row * p.kv_heads + kvh) * D + dl * 8;
          kr[u] = load_nc(p.k + off);
          vr[u] = load_nc(p.v + off);
        } else {
          kr[u] = make_uint4(0, 0, 0, 0);
          vr[u] = make_uint4(0, 0, 0, 0);
        }
      }
      float s[kUnroll][GT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float kf[8];
        unpack8(kr[u], kf);
#pragma unroll
        for (int g = 0; g < GT; ++g) {
          float a = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) a = fmaf(qr[g][i], kf[i], a);
          s[u][g] = a;
        }
      }
#pragma unroll
      for (int off = TPR / 2; off > 0; off >>= 1)
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int g = 0; g < GT; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);

      float vf[kUnroll][8];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) unpack8(vr[u], vf[u]);
#pragma unroll
      for (int g = 0; g < GT; ++g) {
        float mx = m[g];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (valid[u]) mx = fmaxf(mx, s[u][g]);
        // mx is finite once any row was valid; rows are only masked at the end of the range.
        const float corr = m[g] == kNegInf ? 0.0f : exp2f(m[g] - mx);
        float pr[kUnroll];
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          pr[u] = valid[u] ? exp2f(s[u][g] - mx) : 0.0f;
          sum += pr[u];
        }
        l[g] = fmaf(l[g], corr, sum);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float a = acc[g][i] * corr;
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) a = fmaf(pr[u], vf[u][i], a);
          acc[g][i] = a;
        }
        m[g] = mx;
      }
    }
  }  // table window

  // Merge the lane groups of this block.
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (dl == 0) {
      sm_m[group_id][g] = m[g];
      sm_l[group_id][g] = l[g];
    }
    float4* dst = reinterpret_cast<float4*>(&sm_acc[group_id][g][dl * 8]);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < nh * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float mx = kNegInf;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) mx = fmaxf(mx, sm_m[r][g]);
    float sum = 0.0f, a = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float w = sm_m[r][g] == kNegInf ? 0.0f : exp2f(sm_m[r][g] - mx);
      sum = fmaf(sm_l[r][g], w, sum);
      a = fmaf(sm_acc[r][g][d], w, a);
    }
    const std::size_t head = static_cast<std::size_t>(seq) * p.num_heads + h0 + g;
    if (p.splits == 1) {
      p.out[head * D + d] = f32_to_bf16(sum > 0.0f ? a / sum : 0.0f);
    } else {
      const std::size_t slot = head * p.splits + split;
      p.ws_acc[slot * D + d] = a;
      if (d == 0) {
        p.ws_ml[slot * 2] = mx;
        p.ws_ml[slot * 2 + 1] = sum;
      }
    }
  }
}

/// One block per (head, sequence), one thread per dim: combines the splits that hold positions.
template <int D>
__global__ void __launch_bounds__(D) paged_decode_merge_kernel(const DecodeParams p) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const int h = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const int d = static_cast<int>(threadIdx.x);
  const int len = min(p.lens[seq], p.max_blocks << p.block_shift);
  const int used = len <= 0 ? 0 : min(p.splits, (len + p.split_len - 1) / p.split_len);
  const std::size_t head = static_cast<std::size_t>(seq) * p.num_heads + h;
  const float* ml = p.ws_ml + head * p.splits * 2;
  const float* acc = p.ws_acc + head * p.splits * D;
  float mx = kNegInf;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, ml[2 * s]);
  float sum = 0.0f, a = 0.0f;
  for (int s = 0; s < used; ++s) {
    const float ms = ml[2 * s];
    const float w = ms == kNegInf ? 0.0f : exp2f(ms - mx);
    sum = fmaf(ml[2 * s + 1], w, sum);
    a = fmaf(acc[static_cast<std::size_t>(s) * D + d], w, a);
  }
  p.out[head * D + d] = f32_to_bf16(sum > 0.0f ? a / sum : 0.0f);
}

int sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  if (dev >= 0 && dev < kMaxDevices && cached[dev] > 0) return cached[dev];
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
  if (dev >= 0 && dev < kMaxDevices) cached[dev] = n;
  return n;
}

int heads_per_block(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

void check(const PagedKvBatch& b, int num_heads) {
  using infer::detail::cat;
  if (b.num_seqs < 0 || b.num_seqs > 65535)
    throw InvalidArgument(cat("cuda::paged_decode_attention: num_seqs = ", b.num_seqs, " must be in [0, 65535]"));
  if (b.head_dim != 64 && b.head_dim != 128)
    throw InvalidArgument(cat("cuda::paged_decode_attention: head_dim = ", b.head_dim,
                              " is not supported; the kernels are built for 64 and 128"));
  if (b.num_kv_heads <= 0 || num_heads <= 0 || num_heads % b.num_kv_heads != 0)
    throw InvalidArgument(cat("cuda::paged_decode_attention: num_heads = ", num_heads, ", num_kv_heads = ",
                              b.num_kv_heads, "; both must be positive and num_kv_heads must divide num_heads"));
  if (b.block_size <= 0 || b.block_size > 1024 || (b.block_size & (b.block_size - 1)) != 0)
    throw InvalidArgument(cat("cuda::paged_decode_attention: block_size = ", b.block_size,
                              " must be a power of two in [1, 1024]"));
  if (b.max_blocks_per_seq <= 0)
    throw InvalidArgument(cat("cuda::paged_decode_attention: max_blocks_per_seq = ", b.max_blocks_per_seq,
                              " must be positive"));
  if (static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size > (std::int64_t{1} << 30))
    throw InvalidArgument(cat("cuda::paged_decode_attention: ", b.max_blocks_per_seq, " blocks of ", b.block_size,
                              " tokens exceed the 2^30 positions a sequence may have"));
  const int chunks = (num_heads / b.num_kv_heads + 7) / 8;
  if (static_cast<std::int64_t>(b.num_kv_heads) * chunks > 65535)
    throw InvalidArgument(cat("cuda::paged_decode_attention: ", num_heads, " heads are too many"));
}

struct Plan {
  int splits;
  int split_len;
};

/// Resident blocks per SM of one kernel instance (register use differs by D and GT); cached per instance,
/// so this assumes one kind of GPU per process.
template <int D, int GT>
int blocks_per_sm() {
  static const int n = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, paged_decode_kernel<D, GT>, kThreads, 0) != cudaSuccess ||
        b <= 0) {
      (void)cudaGetLastError();
      b = 2;
    }
    return b;
  }();
  return n;
}

int resident_blocks(int d, int gt) {
  int per_sm = 2;
  if (d == 64) per_sm = gt == 1 ? blocks_per_sm<64, 1>() : gt == 2 ? blocks_per_sm<64, 2>() : gt == 4 ? blocks_per_sm<64, 4>() : blocks_per_sm<64, 8>();
  else per_sm = gt == 1 ? blocks_per_sm<128, 1>() : gt == 2 ? blocks_per_sm<128, 2>() : gt == 4 ? blocks_per_sm<128, 4>() : blocks_per_sm<128, 8>();
  return per_sm * sm_count();
}

/// Splits so that the grid fills the GPU in whole waves: the fewest splits whose last wave is at least 95%
/// full, else the best fill found; never splits shorter than kMinSplitLen positions.
Plan plan(const PagedKvBatch& b, int num_heads) {
  const int group = num_heads / b.num_kv_heads;
  const int gt = heads_per_block(group);
  const int chunks = (group + gt - 1) / gt;
  const std::int64_t cap = static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size;
  const std::int64_t ctas = std::int64_t{b.num_seqs} * b.num_kv_heads * chunks;
  const std::int64_t slots = resident_blocks(b.head_dim, gt);
  std::int64_t max_splits = (cap + kMinSplitLen - 1) / kMinSplitLen;
  if (max_splits > kMaxSplits) max_splits = kMaxSplits;
  if (max_splits < 1) max_splits = 1;
  std::int64_t splits = 1;
  double best = 0.0;
  for (std::int64_t s = 1; s <= max_splits && ctas > 0; ++s) {
    const std::int64_t total = ctas * s;
    const std::int64_t waves = (total + slots - 1) / slots;
    const double fill = static_cast<double>(total) / static_cast<double>(waves * slots);
    if (fill > best + 1e-3) {
      best = fill;
      splits = s;
    }
    if (best >= 0.95) break;
  }
  // Split lengths are whole steps of the widest block (64 rows), so every split but the last is full.
  constexpr std::int64_t kStep = 64;
  std::int64_t len = (cap + splits - 1) / splits;
  len = (len + kStep - 1) / kStep * kStep;
  splits = (cap + len - 1) / len;
  return {static_cast<int>(splits), static_cast<int>(len)};
}

template <int D, int GT>
void launch(const DecodeParams& p, int num_seqs, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.kv_heads * p.head_chunks),
                  static_cast<unsigned>(num_seqs));
  chained::launch(paged_decode_kernel<D, GT>, grid, kThreads, 0, stream, p);
  if (p.splits > 1)
    chained::launch(paged_decode_merge_kernel<D>,
                    dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs)), D, 0, stream, p);
}

template <int D>
void launch_d(int gt, const DecodeParams& p, int num_seqs, cudaStream_t stream) {
  switch (gt) {
    case 1: launch<D, 1>(p, num_seqs, stream); break;
    case 2: launch<D, 2>(p, num_seqs, stream); break;
    case 4: launch<D, 4>(p, num_seqs, stream); break;
    default: launch<D, 8>(p, num_seqs, stream); break;
  }
}

}  // namespace

int paged_decode_num_splits(const PagedKvBatch& batch, int num_heads) {
  check(batch, num_heads);
  return plan(batch, num_heads).splits;
}

std::size_t paged_decode_workspace_bytes(const PagedKvBatch& batch, int num_heads) {
  check(batch, num_heads);
  const Plan pl = plan(batch, num_heads);
  if (pl.splits <= 1) return 0;
  return static_cast<std::size_t>(batch.num_seqs) * static_cast<std::size_t>(num_heads) *
         static_cast<std::size_t>(pl.splits) * (2 + static_cast<std::size_t>(batch.head_dim)) * sizeof(float);
}

void paged_decode_attention(const PagedKvBatch& batch, const std::uint16_t* q, int num_heads, float scale,
                            std::uint16_t* out, float* workspace, std::size_t workspace_bytes, void* stream,
                            std::int64_t q_row_stride) {
  using infer::detail::cat;
  check(batch, num_heads);
  const std::int64_t dense = static_cast<std::int64_t>(num_heads) * batch.head_dim;
  if (q_row_stride != 0 && (q_row_stride < dense || q_row_stride % 8 != 0))
    throw InvalidArgument(cat("cuda::paged_decode_attention: q_row_stride = ", q_row_stride, " must be 0 or a multiple",
                              " of 8 of at least num_heads * head_dim = ", dense));
  if (batch.num_seqs == 0) return;
  if (!batch.k || !batch.v || !batch.block_tables || !batch.seq_lens || !q || !out)
    throw InvalidArgument(cat("cuda::paged_decode_attention: null ",
                              !batch.k              ? "K"
                              : !batch.v            ? "V"
                              : !batch.block_tables ? "block_tables"
                              : !batch.seq_lens     ? "seq_lens"
                              : !q                  ? "q"
                                                    : "out",
                              " pointer"));
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(batch.k) || misaligned(batch.v) || misaligned(q))
    throw InvalidArgument("cuda::paged_decode_attention: K, V and q must be 16-byte aligned (16-byte loads)");
  const Plan pl = plan(batch, num_heads);
  const std::size_t need = paged_decode_workspace_bytes(batch, num_heads);
  if (need > 0 && (workspace == nullptr || workspace_bytes < need))
    throw InvalidArgument(cat("cuda::paged_decode_attention: the workspace has ", workspace_bytes, " bytes",
                              workspace == nullptr ? " (null)" : "", "; this shape splits each context ", pl.splits,
                              " ways and needs ", need, " (paged_decode_workspace_bytes)"));

  const int group = num_heads / batch.num_kv_heads;
  const int gt = heads_per_block(group);
  DecodeParams p{};
  p.k = batch.k;
  p.v = batch.v;
  p.tables = batch.block_tables;
  p.lens = batch.seq_lens;
  p.q = q;
  p.q_stride = q_row_stride != 0 ? q_row_stride : dense;
  p.out = out;
  const std::size_t ml_floats =
      static_cast<std::size_t>(batch.num_seqs) * static_cast<std::size_t>(num_heads) * static_cast<std::size_t>(pl.splits) * 2;
  p.ws_ml = workspace;
  p.ws_acc = workspace == nullptr ? nullptr : workspace + ml_floats;
  p.max_blocks = batch.max_blocks_per_seq;
  int shift = 0;
  while ((1 << shift) < batch.block_size) ++shift;
  p.block_shift = shift;
  p.kv_heads = batch.num_kv_heads;
  p.num_heads = num_heads;
  p.group = group;
  p.head_chunks = (group + gt - 1) / gt;
  p.splits = pl.splits;
  p.split_len = pl.split_len;
  p.scale_log2 = scale * kLog2e;

  auto s = static_cast<cudaStream_t>(stream);
  if (batch.head_dim == 64) launch_d<64>(gt, p, batch.num_seqs, s);
  else launch_d<128>(gt, p, batch.num_seqs, s);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw DeviceError(cat("cuda::paged_decode_attention(", batch.num_seqs, " sequences, ", num_heads, "/",
                          batch.num_kv_heads, " heads of ", batch.head_dim, ", ", pl.splits,
                          " splits): kernel launch failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace infer::kernels::cuda
