// Token choice on the GPU (kernels/cuda/sampling.hpp): argmax_rows, a cluster of kArgmaxBlocks blocks per
// row (each reduces a slice; the first combines the slices' results through distributed shared memory: a
// batch-1 decode step's 128,256-logit row read by one block took ~30 µs, a cluster of 8 reads it in a few),
// and sample_rows, one block per row.
//
// sample_rows reproduces LogitsProcessor::apply + Sampler::draw step by step:
//   P0  raw row -> online (max, sum exp) for the raw logprob and the input checks, and the processed row
//       (temperature applied; greedy rows unscaled) written once to the workspace, padded with -inf;
//   P0b the row's token list: bans -> -inf, penalties recomputed from the raw value with the CPU's f32
//       operations (explicit __f*_rn so nvcc cannot contract them into FMAs), then scaled;
//   P1  max and first argmax of the processed row (greedy rows stop here);
//   top-k / top-p: an exact threshold search instead of a sort (below);
//   min-p: a per-value predicate (log threshold in double, as the CPU);
//   draw: chunk sums of the kept weights, a block scan over the chunks, then one warp walks the chunk
//       that holds u * total — the CPU's inverse CDF in token-id order.
//
// Why a threshold search and not a sort: every truncation the CPU applies is a *value* threshold (top-k
// keeps l >= the k-th largest, top-p keeps l >= the cutoff value, min-p keeps l - max >= log(min_p)),
// and the draw walks tokens in id order, not in sorted order. So the kernel never needs the sorted
// order, only two order statistics: the k-th largest value, and the largest value t whose mass
// M(>= t) reaches top_p * total. Both are found exactly by a radix descent over the values' order-
// preserving 32-bit keys: a first level of 256 bins by (max - l) * 8 (adaptive to the row, so real
// logits spread over many bins and the shared-memory atomics do not pile onto one), then four 8-bit
// levels over the key within the chosen bin. Each level is one read of the row (from L2 for the
// sizes here), a 256-bin histogram in shared memory and a one-warp scan of it: O(vocab) per level, no
// workspace beyond the processed row, versus a segmented radix sort of (logit, id) pairs that would
// need two more row-sized buffers and ~8 passes of global traffic for the same two numbers.
// Top-p masses are fixed-point (uint64, 2^S per unit with rows * vocab * 2^S < 2^63), so the histogram
// sums are exact and order-independent: the result is deterministic run to run, and differs from the
// CPU's double sums by < vocab * 2^-(S+1) (~1e-9 of the total) — only a boundary within that decides
// differently.
#include <cuda_runtime.h>

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/sampling.hpp"
#include "infer/sampling/logits_processor.hpp"
#include "infer/sampling/sampling_params.hpp"

namespace infer::kernels::cuda {
namespace {

static_assert(sizeof(SamplingRowParams) == 40 && alignof(SamplingRowParams) == 8,
              "SamplingRowParams is copied to the device as is");

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxBlocks = 8;  ///< blocks per row: one thread block cluster (8 is the portable maximum)
constexpr int kSampleThreads = 512;
constexpr int kChunk = 256;  ///< draw chunk: 32 lanes x 8 consecutive values; also the row padding
constexpr int kMaxVocab = 1 << 24;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kGreedyEpsilon = SamplingParams::greedy_epsilon;
constexpr double kBoundaryTolerance = infer::detail::boundary_tolerance;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// ---------------------------------------------------------------------------------------------------
// Reductions

/// Online softmax statistics of a raw row: max m, sum of exp(x - m) over x > -inf, the first index of
/// m, and whether a NaN or +inf was seen (the CPU rejects those).
struct RawStats {
  float m;
  float s;
  int idx;
  int bad;
};

__device__ __forceinline__ RawStats raw_init() { return RawStats{neg_inf(), 0.0f, INT_MAX, 0}; }

/// Indices pushed by one thread increase, so "replace only when strictly larger" keeps the first one.
__device__ __forceinline__ void raw_push(RawStats& a, float x, int i) {
  if (!(x < pos_inf())) {  // NaN or +inf
    a.bad = 1;
    return;
  }
  if (x == neg_inf()) return;
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;  // a.m = -inf: 0 * 0 + 1
    a.m = x;
    a.idx = i;
  } else {
    a.s += expf(x - a.m);
  }
}

struct RawCombine {
  __device__ __forceinline__ RawStats operator()(const RawStats& a, const RawStats& b) const {
    RawStats r;
    r.bad = a.bad | b.bad;
    r.m = fmaxf(a.m, b.m);
    r.idx = a.m > b.m ? a.idx : b.m > a.m ? b.idx : min(a.idx, b.idx);
    if (r.m == neg_inf()) {
      r.s = 0.0f;
    } else {
      const float sa = a.m == neg_inf() ? 0.0f : a.s * expf(a.m - r.m);
      const float sb = b.m == neg_inf() ? 0.0f : b.s * expf(b.m - r.m);
      r.s = sa + sb;
    }
    return r;
  }
};

/// Max and its first index over a processed row (which holds no NaN; -inf is an ordinary value here,
/// so an all -inf row gives index 0, as Sampler::argmax does).
struct MaxIdx {
  float m;
  int idx;
};

__device__ __forceinline__ void max_push(MaxIdx& a, float x, int i) {
  if (x > a.m || a.idx == INT_MAX) {
    a.m = x;
    a.idx = i;
  }
}

struct MaxIdxCombine {
  __device__ __forceinline__ MaxIdx operator()(const MaxIdx& a, const MaxIdx& b) const {
    if (a.idx == INT_MAX) return b;
    if (b.idx == INT_MAX) return a;
    if (a.m > b.m) return a;
    if (b.m > a.m) return b;
    return a.idx < b.idx ? a : b;
  }
};

struct IntMax {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct IntMin {
  __device__ __forceinline__ int operator()(int a, int b) const { return a < b ? a : b; }
};

template <class T>
__device__ __forceinline__ T warp_sum_xor(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

/// Inclusive Kogge-Stone scan over the warp.
template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const T t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Row access

/// f(i, x) for every x of a raw row (any alignment); each thread sees increasing i.
template <class F>
__device__ __forceinline__ void for_raw(const float* __restrict__ row, int n, bool vec, F&& f) {
  int done = 0;
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int n4 = n >> 2;
    for (int j = static_cast<int>(threadIdx.x); j < n4; j += static_cast<int>(blockDim.x)) {
      const float4 q = __ldg(r4 + j);
      f(4 * j, q.x);
      f(4 * j + 1, q.y);
      f(4 * j + 2, q.z);
      f(4 * j + 3, q.w);
    }
    done = n4 << 2;
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) f(i, __ldg(row + i));
}

/// f(i, x) over a processed row: 16-byte aligned, `stride` values (a multiple of kChunk), padded with
/// -inf past the vocabulary. Plain loads: this kernel wrote the row, so the read-only path is not allowed.
template <class F>
__device__ __forceinline__ void for_proc(const float* row, int stride, F&& f) {
  const float4* r4 = reinterpret_cast<const float4*>(row);
  const int n4 = stride >> 2;
  for (int j = static_cast<int>(threadIdx.x); j < n4; j += static_cast<int>(blockDim.x)) {
    const float4 q = r4[j];
    f(4 * j, q.x);
    f(4 * j + 1, q.y);
    f(4 * j + 2, q.z);
    f(4 * j + 3, q.w);
  }
}

// ---------------------------------------------------------------------------------------------------
// argmax_rows

/// Row blockIdx.y; block rank b of the row's cluster takes slice b (kArgmaxBlocks slices, each a multiple
/// of 4 values so the 16-byte loads stay aligned).
__global__ void __cluster_dims__(kArgmaxBlocks, 1, 1) __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int vocab, bool vec, std::int32_t* __restrict__ out_ids,
                  float* __restrict__ out_lp) {
  using Reduce = cub::BlockReduce<RawStats, kArgmaxThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ RawStats slice_stats;
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const auto rank = static_cast<int>(cluster.block_rank());
  const int row_id = static_cast<int>(blockIdx.y);
  const int per = ((vocab + kArgmaxBlocks - 1) / kArgmaxBlocks + 3) / 4 * 4;
  const int begin = min(vocab, rank * per), n = min(vocab - begin, per);
  const float* slice = logits + static_cast<std::int64_t>(row_id) * vocab + begin;
  RawStats st = raw_init();
  for_raw(slice, n, vec, [&](int i, float x) { raw_push(st, x, begin + i); });
  st = Reduce(tmp).Reduce(st, RawCombine());
  if (threadIdx.x == 0) slice_stats = st;
  cluster.sync();  // every slice's stats are in its block's shared memory
  if (rank == 0 && threadIdx.x == 0) {
    for (int b = 1; b < kArgmaxBlocks; ++b) st = RawCombine()(st, *cluster.map_shared_rank(&slice_stats, b));
    const bool ok = !st.bad && st.m != neg_inf();
    out_ids[row_id] = ok ? st.idx : -1;
    if (out_lp) out_lp[row_id] = ok ? -logf(st.s) : __int_as_float(0x7fc00000);
  }
  cluster.sync();  // the other blocks' shared memory stays until the first has read it
}

// ---------------------------------------------------------------------------------------------------
// sample_rows

/// Order-preserving key of a float (-0 and +0 share one key, as they compare equal): a > b <=> key(a) >
/// key(b) for non-NaN values.
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned b = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/// The first search level: rank 0..254 by (mx - v) * 8 (monotone: larger values, smaller ranks), 255 for
/// -inf. v <= mx, so the difference is >= 0.
__device__ __forceinline__ int coarse_rank(float v, float mx) {
  if (v == neg_inf()) return 255;
  const float d = __fmul_rn(__fsub_rn(mx, v), 8.0f);
  return d < 254.0f ? static_cast<int>(d) : 254;
}

/// Rank (0 = largest values) of value v at key level `lvl` (0..3, most significant byte first) among
/// the values of coarse rank r0 whose key starts with `prefix`; -1 when v is not among them.
__device__ __forceinline__ int key_rank(float v, float mx, int r0, int lvl, unsigned prefix) {
  if (coarse_rank(v, mx) != r0) return -1;
  const unsigned k = order_key(v);
  const int shift = 24 - 8 * lvl;
  if (lvl > 0 && (k >> (shift + 8)) != (prefix >> (shift + 8))) return -1;
  return 255 - static_cast<int>((k >> shift) & 255u);
}

struct SampleShared {
  union {
    typename cub::BlockReduce<RawStats, kSampleThreads>::TempStorage raw;
    typename cub::BlockReduce<MaxIdx, kSampleThreads>::TempStorage maxidx;
    typename cub::BlockReduce<int, kSampleThreads>::TempStorage i32;
    typename cub::BlockScan<double, kSampleThreads>::TempStorage scan;
  } cub;
  unsigned long long hist[256];
  RawStats raw;
  MaxIdx max;
  unsigned long long excl;
  double base;
  int rank;
  int found;
  int last;
  int token;
};

/// Warp 0: the first rank r whose inclusive cumulative count/mass reaches `need` (> 0), and the sum of
/// the ranks before it. The caller guarantees the histogram's total reaches `need`; if it did not (it
/// cannot), the last rank is taken so the search still ends on a real bin.
__device__ void search_ranks(SampleShared& sh, unsigned long long need) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  unsigned long long v[8];
  unsigned long long sum = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    v[j] = sh.hist[lane * 8 + j];
    sum += v[j];
  }
  const unsigned long long incl = warp_inclusive_scan(sum, lane);
  const unsigned ball = __ballot_sync(kFull, incl >= need);
  const int first = ball ? __ffs(static_cast<int>(ball)) - 1 : 31;
  if (lane == first) {
    unsigned long long cum = incl - sum;
    int r = lane * 8 + 7;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (cum + v[j] >= need) {
        r = lane * 8 + j;
        break;
      }
      cum += v[j];
    }
    sh.rank = r;
    sh.excl = cum;
  }
}

/// Warp 0: the total of the histogram into sh.excl.
__device__ void total_ranks(SampleShared& sh) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  unsigned long long sum = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) sum += sh.hist[lane * 8 + j];
  sum = warp_sum_xor(sum);
  if (lane == 0) sh.excl = sum;
}

__device__ __forceinline__ void clear_hist(SampleShared& sh) {
  for (int i = static_cast<int>(threadIdx.x); i < 256; i += static_cast<int>(blockDim.x)) sh.hist[i] = 0;
}

/// One level of the descent: histogram `weight(v)` (0 = not counted) by `rank(v)`, then find the rank
/// where `need` is reached. Returns the rank; `need` drops by the weight of the ranks above it.
template <class RankF, class WeightF>
__device__ int descend(SampleShared& sh, const float* proc, int stride, unsigned long long& need, RankF&& rank,
                       WeightF&& weight) {
  __syncthreads();  // earlier readers of sh are done
  clear_hist(sh);
  __syncthreads();
  for_proc(proc, stride, [&](int, float v) {
    const int r = rank(v);
    if (r < 0) return;
    const unsigned long long w = weight(v);
    if (w) atomicAdd(&sh.hist[r], w);
  });
  __syncthreads();
  if (threadIdx.x < 32) search_ranks(sh, need);
  __syncthreads();
  need -= sh.excl;
  return sh.rank;
}

/// The k-th largest processed value (k in [1, vocab)), with multiplicity: LogitsProcessor::apply_top_k's
/// nth_element threshold. -inf values take part (they are real entries of the CPU's array); the row
/// padding adds only -inf entries below the vocabulary's, so it cannot change the answer.
__device__ float topk_threshold(SampleShared& sh, const float* proc, int stride, float mx, int k) {
  unsigned long long need = static_cast<unsigned long long>(k);
  auto one = [](float) { return 1ull; };
  const int r0 = descend(sh, proc, stride, need, [&](float v) { return coarse_rank(v, mx); }, one);
  if (r0 == 255) return neg_inf();  // the k-th largest is -inf: nothing is removed
  unsigned prefix = 0;
  for (int lvl = 0; lvl < 4; ++lvl) {
    const int r = descend(sh, proc, stride, need, [&](float v) { return key_rank(v, mx, r0, lvl, prefix); }, one);
    prefix |= static_cast<unsigned>(255 - r) << (24 - 8 * lvl);
  }
  return key_value(prefix);
}

/// LogitsProcessor::apply_top_p's cutoff: over the candidates (v >= thr_k, v > -inf), with mass
/// e(v) = exp(double(v) - mx), the largest candidate value t with M(>= t) >= top_p * total * (1 - 1e-6).
/// (The CPU walks the candidates sorted by value and stops at the first whose running mass reaches the
/// target; tied values share one mass group, so that stop lies in exactly this t's group.)
__device__ float topp_threshold(SampleShared& sh, const float* proc, int stride, float mx, float thr_k, float top_p,
                                int scale_bits) {
  const double scale = ldexp(1.0, scale_bits);
  auto mass = [&](float v) -> unsigned long long {
    if (!(v >= thr_k) || v == neg_inf()) return 0ull;
    const double e = exp(static_cast<double>(v) - static_cast<double>(mx));
    return __double2ull_rn(e * scale);
  };
  // Level 0 by hand: the target needs the total, which is this histogram's sum.
  __syncthreads();
  clear_hist(sh);
  __syncthreads();
  for_proc(proc, stride, [&](int, float v) {
    const unsigned long long w = mass(v);
    if (w) atomicAdd(&sh.hist[coarse_rank(v, mx)], w);
  });
  __syncthreads();
  if (threadIdx.x < 32) total_ranks(sh);
  __syncthreads();
  const double total = static_cast<double>(sh.excl) / scale;  // the CPU's `total`
  __syncthreads();  // everyone has read sh.excl before the search overwrites it
  const double target = static_cast<double>(top_p) * total * (1.0 - kBoundaryTolerance);
  const double t_fixed = ceil(target * scale);
  // mass >= target <=> fixed mass >= ceil(target * 2^S); at least 1 so that an empty rank never
  // satisfies it (then the first candidate, the max, is the cutoff, as on the CPU).
  unsigned long long need = t_fixed < 1.0 ? 1ull : static_cast<unsigned long long>(t_fixed);
  if (threadIdx.x < 32) search_ranks(sh, need);
  __syncthreads();
  need -= sh.excl;
  const int r0 = sh.rank;
  unsigned prefix = 0;
  for (int lvl = 0; lvl < 4; ++lvl) {
    const int r = descend(sh, proc, stride, need, [&](float v) { return key_rank(v, mx, r0, lvl, prefix); }, mass);
    prefix |= static_cast<unsigned>(255 - r) << (24 - 8 * lvl);
  }
  return key_value(prefix);
}

/// What survives truncation, and the draw weight of a value (Sampler::draw: exp(l - mx) in f32 of the
/// f32 difference; here exp in double rounded once to f32, i.e. correctly rounded but for double
/// rounding, where glibc's expf is within 0.502 ulp).
struct Keep {
  float mx;
  float thr;  ///< max(top-k threshold, top-p cutoff); -inf when neither applies
  bool min_p;
  double log_thr;
  __device__ __forceinline__ float weight(float v) const {
    if (v == neg_inf() || !(v >= thr)) return 0.0f;
    if (min_p && static_cast<double>(v) - static_cast<double>(mx) < log_thr) return 0.0f;
    return static_cast<float>(exp(static_cast<double>(__fsub_rn(v, mx))));
  }
};

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* __restrict__ logits, int vocab, bool vec, const SamplingRowParams* __restrict__ params,
                  SamplingTokenLists lists, float* __restrict__ proc_all, int stride, double* __restrict__ chunk_all,
                  int scale_bits, std::int32_t* __restrict__ out_ids, float* __restrict__ out_lp) {
  __shared__ SampleShared sh;
  const int row_i = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const float* raw = logits + static_cast<std::int64_t>(row_i) * vocab;
  float* proc = proc_all + static_cast<std::int64_t>(row_i) * stride;
  const SamplingRowParams p = params[row_i];
  const bool greedy = p.temperature < kGreedyEpsilon;
  // LogitsProcessor::apply_temperature: multiply by the f32 reciprocal (not a division).
  const bool scale = !greedy && p.temperature != 1.0f;
  const float inv = scale ? __fdiv_rn(1.0f, p.temperature) : 1.0f;

  // P0: raw statistics and the scaled copy.
  RawStats st = raw_init();
  if (vec) {
    const float4* r4 = reinterpret_cast<const float4*>(raw);
    float4* p4 = reinterpret_cast<float4*>(proc);
    const int n4 = vocab >> 2;
    for (int j = tid; j < n4; j += kSampleThreads) {
      float4 q = __ldg(r4 + j);
      raw_push(st, q.x, 4 * j);
      raw_push(st, q.y, 4 * j + 1);
      raw_push(st, q.z, 4 * j + 2);
      raw_push(st, q.w, 4 * j + 3);
      if (scale) q = make_float4(__fmul_rn(q.x, inv), __fmul_rn(q.y, inv), __fmul_rn(q.z, inv), __fmul_rn(q.w, inv));
      p4[j] = q;
    }
    for (int i = (n4 << 2) + tid; i < vocab; i += kSampleThreads) {
      const float x = __ldg(raw + i);
      raw_push(st, x, i);
      proc[i] = scale ? __fmul_rn(x, inv) : x;
    }
  } else {
    for (int i = tid; i < vocab; i += kSampleThreads) {
      const float x = __ldg(raw + i);
      raw_push(st, x, i);
      proc[i] = scale ? __fmul_rn(x, inv) : x;
    }
  }
  for (int i = vocab + tid; i < stride; i += kSampleThreads) proc[i] = neg_inf();
  st = cub::BlockReduce<RawStats, kSampleThreads>(sh.cub.raw).Reduce(st, RawCombine());
  if (tid == 0) sh.raw = st;
  __syncthreads();
  st = sh.raw;
  const bool temp_ok = greedy || (p.temperature > 0.0f && p.temperature < pos_inf());
  if (st.bad || st.m == neg_inf() || !temp_ok) {
    if (tid == 0) {
      out_ids[row_i] = -1;
      if (out_lp) out_lp[row_i] = __int_as_float(0x7fc00000);
    }
    return;
  }

  // P0b: bans and penalties (LogitsProcessor::apply_min_tokens, apply_penalties), each from the raw
  // value, so their order does not matter: a banned id is -inf whatever its penalty would have been.
  if (lists.indptr != nullptr) {
    const int b = lists.indptr[row_i], e = lists.indptr[row_i + 1];
    const bool rep = p.repetition_penalty != 1.0f;
    const bool freq_pres = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    for (int t = b + tid; t < e; t += kSampleThreads) {
      const int id = lists.ids[t];
      if (id < 0 || id >= vocab) continue;
      const int count = lists.counts[t];
      if (count == kBannedToken) {
        proc[id] = neg_inf();
        continue;
      }
      if (!rep && !freq_pres) continue;
      float l = __ldg(raw + id);
      if (rep) l = l > 0.0f ? __fdiv_rn(l, p.repetition_penalty) : __fmul_rn(l, p.repetition_penalty);
      if (count > 0)
        l = __fsub_rn(l, __fadd_rn(__fmul_rn(p.frequency_penalty, static_cast<float>(count)), p.presence_penalty));
      proc[id] = scale ? __fmul_rn(l, inv) : l;
    }
  }
  __syncthreads();

  // P1: max and first argmax of the processed row.
  MaxIdx mi{neg_inf(), INT_MAX};
  for_proc(proc, stride, [&](int i, float v) { max_push(mi, v, i); });
  mi = cub::BlockReduce<MaxIdx, kSampleThreads>(sh.cub.maxidx).Reduce(mi, MaxIdxCombine());
  if (tid == 0) sh.max = mi;
  __syncthreads();
  mi = sh.max;
  const float mx = mi.m;

  int token = -1;
  if (greedy) {
    token = mi.idx;
  } else if (mx < pos_inf() && mx > neg_inf()) {
    Keep keep{mx, neg_inf(), false, 0.0};
    if (p.top_k > 0 && p.top_k < vocab) keep.thr = topk_threshold(sh, proc, stride, mx, p.top_k);
    if (p.top_p < 1.0f) keep.thr = fmaxf(keep.thr, topp_threshold(sh, proc, stride, mx, keep.thr, p.top_p, scale_bits));
    if (p.min_p > 0.0f) {
      keep.min_p = true;
      keep.log_thr = log(static_cast<double>(p.min_p)) + log1p(-kBoundaryTolerance);
    }

    // Draw, pass 1: per-chunk sums of the weights (lane-sequential, then a fixed butterfly) and the last
    // positive index (Sampler::draw's fallback when u * total rounds past the last weight).
    double* chunk = chunk_all + static_cast<std::int64_t>(row_i) * (stride / kChunk);
    const int nchunks = stride / kChunk;
    const int lane = tid & 31, warp = tid >> 5;
    int last = -1;
    for (int c = warp; c < nchunks; c += kSampleThreads / 32) {
      const float4* q = reinterpret_cast<const float4*>(proc + c * kChunk + lane * 8);
      const float4 a = q[0], b = q[1];
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      double s = 0.0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float w = keep.weight(v[j]);
        s += static_cast<double>(w);
        if (w > 0.0f) last = c * kChunk + lane * 8 + j;
      }
      s = warp_sum_xor(s);
      if (lane == 0) chunk[c] = s;
    }
    __syncthreads();  // sh.cub is reused; chunk[] is visible to the block
    last = cub::BlockReduce<int, kSampleThreads>(sh.cub.i32).Reduce(last, IntMax());
    if (tid == 0) sh.last = last;
    __syncthreads();

    // Draw, pass 2: the chunk holding target = u * total. Thread t owns consecutive chunks; base is its
    // exclusive prefix. The chosen chunk has a positive sum, so it holds a positive weight.
    const int per = (nchunks + kSampleThreads - 1) / kSampleThreads;
    const int c0 = min(nchunks, tid * per), c1 = min(nchunks, c0 + per);
    double local = 0.0;
    for (int c = c0; c < c1; ++c) local += chunk[c];
    double base = 0.0, total = 0.0;
    cub::BlockScan<double, kSampleThreads>(sh.cub.scan).ExclusiveSum(local, base, total);
    const double target = p.u * total;
    int found = INT_MAX;
    for (int c = c0; c < c1; ++c) {
      const double s = chunk[c];
      const double next = base + s;
      if (s > 0.0 && next > target) {
        found = c;
        break;
      }
      base = next;
    }
    __syncthreads();
    const int fmin = cub::BlockReduce<int, kSampleThreads>(sh.cub.i32).Reduce(found, IntMin());
    if (tid == 0) sh.found = fmin;
    __syncthreads();
    const int c = sh.found;
    if (c != INT_MAX && found == c) sh.base = base;
    __syncthreads();

    if (c == INT_MAX) {
      token = sh.last;
    } else {
      if (warp == 0) {
        const float4* q = reinterpret_cast<const float4*>(proc + c * kChunk + lane * 8);
        const float4 a = q[0], b = q[1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float w[8];
        double s = 0.0;
        int last_in = -1;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          w[j] = keep.weight(v[j]);
          s += static_cast<double>(w[j]);
          if (w[j] > 0.0f) last_in = c * kChunk + lane * 8 + j;
        }
        const double incl = warp_inclusive_scan(s, lane);
        double excl = __shfl_up_sync(kFull, incl, 1);
        if (lane == 0) excl = 0.0;
        double cum = sh.base + excl;
        int hit = -1;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (w[j] > 0.0f) {
            cum += static_cast<double>(w[j]);
            if (hit < 0 && cum > target) hit = c * kChunk + lane * 8 + j;
          }
        }
        const unsigned ball = __ballot_sync(kFull, hit >= 0);
        int pick;
        if (ball) {
          pick = __shfl_sync(kFull, hit, __ffs(static_cast<int>(ball)) - 1);
        } else {
          // Rounding put the target past this chunk's walk: its last positive weight.
          for (int o = 16; o > 0; o >>= 1) last_in = max(last_in, __shfl_xor_sync(kFull, last_in, o));
          pick = last_in;
        }
        if (lane == 0) sh.token = pick >= 0 ? pick : sh.last;
      }
      __syncthreads();
      token = sh.token;
    }
  }

  if (tid == 0) {
    out_ids[row_i] = token;
    if (out_lp) {
      out_lp[row_i] = token >= 0 ? __fsub_rn(__fsub_rn(__ldg(raw + token), st.m), logf(st.s))
                                 : __int_as_float(0x7fc00000);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Host side

struct Layout {
  int stride = 0;           ///< processed row length (vocab rounded up to kChunk)
  std::size_t proc_bytes = 0;
  std::size_t chunk_off = 0;
  std::size_t total = 0;
};

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

Layout layout_for(int rows, int vocab, const char* who) {
  if (rows < 0) throw InvalidArgument(detail::cat(who, ": rows = ", rows, " must be >= 0"));
  if (vocab < 1 || vocab > kMaxVocab)
    throw InvalidArgument(detail::cat(who, ": vocab = ", vocab, " is out of range; use a value in [1, ", kMaxVocab, "]"));
  Layout l;
  l.stride = (vocab + kChunk - 1) / kChunk * kChunk;
  l.proc_bytes = align256(static_cast<std::size_t>(rows) * static_cast<std::size_t>(l.stride) * sizeof(float));
  l.chunk_off = l.proc_bytes;
  l.total = l.chunk_off + align256(static_cast<std::size_t>(rows) * static_cast<std::size_t>(l.stride / kChunk) *
                                   sizeof(double));
  return l;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void argmax_rows(const float* logits, int rows, int vocab, std::int32_t* out_ids, float* out_logprob_or_null,
                 void* stream) {
  if (rows < 0) throw InvalidArgument(detail::cat("cuda::argmax_rows: rows = ", rows, " must be >= 0"));
  if (vocab < 1)
    throw InvalidArgument(detail::cat("cuda::argmax_rows: vocab = ", vocab, " must be >= 1 (the logits' row length)"));
  if (rows == 0) return;
  if (logits == nullptr || out_ids == nullptr)
    throw InvalidArgument(detail::cat("cuda::argmax_rows: null ", logits == nullptr ? "logits" : "out_ids",
                                      " pointer for ", rows, " rows of ", vocab));
  if (rows > 65535) throw InvalidArgument(detail::cat("cuda::argmax_rows: rows = ", rows, " exceeds 65535"));
  const bool vec = vocab % 4 == 0 && aligned16(logits);
  argmax_kernel<<<dim3(kArgmaxBlocks, static_cast<unsigned>(rows)), kArgmaxThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, vec, out_ids, out_logprob_or_null);
  backend::cuda::check(cudaGetLastError(), "cuda::argmax_rows: kernel launch");
}

std::size_t sampling_workspace_bytes(int rows, int vocab) {
  return layout_for(rows, vocab, "cuda::sampling_workspace_bytes").total;
}

void sample_rows(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                 SamplingTokenLists lists, void* workspace, std::size_t workspace_bytes, std::int32_t* out_ids,
                 float* out_logprob_or_null, void* stream) {
  const Layout l = layout_for(rows, vocab, "cuda::sample_rows");
  if (rows == 0) return;
  if (logits == nullptr || params == nullptr || out_ids == nullptr || workspace == nullptr)
    throw InvalidArgument(detail::cat("cuda::sample_rows: null ",
                                      logits == nullptr   ? "logits"
                                      : params == nullptr ? "params"
                                      : out_ids == nullptr ? "out_ids"
                                                           : "workspace",
                                      " pointer for ", rows, " rows of ", vocab));
  if (lists.indptr != nullptr && (lists.ids == nullptr || lists.counts == nullptr))
    throw InvalidArgument("cuda::sample_rows: token lists have an indptr but a null ids or counts array; pass all "
                          "three or none");
  if (workspace_bytes < l.total)
    throw InvalidArgument(detail::cat("cuda::sample_rows: workspace of ", workspace_bytes, " bytes is too small; ",
                                      rows, " rows of ", vocab, " need sampling_workspace_bytes = ", l.total));
  if (!aligned16(workspace))
    throw InvalidArgument("cuda::sample_rows: workspace must be 16-byte aligned (cudaMalloc's pointers are)");
  // Fixed-point top-p masses: each is in [0, 2^S], at most vocab of them, so the sum stays below 2^63.
  const int scale_bits = 63 - static_cast<int>(std::bit_width(static_cast<unsigned>(vocab)));
  const bool vec = vocab % 4 == 0 && aligned16(logits);
  auto* base = static_cast<unsigned char*>(workspace);
  sample_kernel<<<static_cast<unsigned>(rows), kSampleThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, vocab, vec, params, lists, reinterpret_cast<float*>(base), l.stride,
      reinterpret_cast<double*>(base + l.chunk_off), scale_bits, out_ids, out_logprob_or_null);
  backend::cuda::check(cudaGetLastError(), "cuda::sample_rows: kernel launch");
}

}  // namespace infer::kernels::cuda
