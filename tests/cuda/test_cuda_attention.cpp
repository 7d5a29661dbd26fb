// CUDA paged attention (decode with split-K, prefill / chunked prefill) against the CPU reference
// kernels::cpu::attention, run in f32 on the bf16-rounded inputs through a PagedKvView over a host copy
// of the cache. Random inputs from printed seeds (support/test_seed.hpp), block tables scrambled, every cache
// row that no query may see (past a sequence's length, spare blocks, the spare table entry) left NaN, and
// the outputs poisoned with NaN first, so a missing write or an out-of-range read shows up as NaN.
//
// Error bound of an f32 kernel, per output value g against the reference r:  |g - r| <= 2^-8 |r| + 1e-4.
//  - r is a convex combination of V values drawn from U(-1, 1), so |r| <= 1;
//  - the kernels accumulate in f32 like the reference but in another order and with exp2 instead of exp:
//    over <= 4096 terms that differs by ~1e-5 at most (a few f32 ulps per term, growing like sqrt(n)),
//    so 1e-4 absolute is a 10x margin;
//  - the output is rounded to bf16 (8 significant bits, round to nearest): at most half an ulp, 2^-8 |r|.
// The prefill tensor-core kernel (its default path) differs in one place that matters:
// P = exp2(s - m) is rounded to bf16 (round to nearest: |p̂ - p| <= 2^-8 p) before O += P·V, while the row
// sum l is summed from the f32 p. So
//   |Σ p̂ v / Σ p - Σ p v / Σ p| <= 2^-8 Σ p |v| / Σ p = 2^-8 a,
// with a = the attention output over |V| (computed by the same CPU reference on a copy of the cache with
// |V|; a <= max |v| <= 1). Their bound is  |g - r| <= 2^-8 (|r| + a) + 1e-4:  the f32 terms as above (Q·Kᵀ on
// the tensor cores multiplies bf16 exactly and accumulates in f32), the output rounding 2^-8 |r|, and the
// second-order term 2^-16 a of rounding the perturbed value inside the 1e-4 margin. A wrong fragment layout,
// mask or rescale gives errors of the order of |v| itself, far outside.
//
// FP8 cache (Config::fp8): the cache holds e4m3 codes of K/k_scale and V/v_scale (k_scale 1/4, v_scale 1/2,
// so that the decoded K is N(0, 1) on e4m3's grid and |V| <= 1 as above), and the reference reads code *
// scale. The kernels widen the codes to bf16 exactly and fold the scales into f32 factors, so the bounds
// above hold unchanged: the scales' own f32 roundings are ~1e-7 relative.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "infer/attention/cpu_attention.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/attention.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/kernels/cuda/fill.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

constexpr std::uint16_t kBf16NaN = 0x7fc0;

constexpr float kFp8KScale = 0.25f, kFp8VScale = 0.5f;
constexpr std::uint8_t kE4m3NaN = 0x7f;

/// One layer's paged cache for a batch: `lens[s]` rows of sequence s written, everything else NaN. bf16
/// values, or (fp8) e4m3 codes of value / scale.
struct Cache {
  int bs = 0, kvh = 0, d = 0, max_blocks = 0, num_blocks = 0;
  bool fp8 = false;
  std::vector<std::uint16_t> k, v;
  std::vector<std::uint8_t> k8, v8;  ///< fp8: the codes
  std::vector<float> kf, vf;
  std::vector<std::int32_t> tables;

  Cache(const std::vector<int>& lens, int block_size, int kv_heads, int head_dim, std::mt19937& rng, bool fp8_codes = false)
      : bs(block_size), kvh(kv_heads), d(head_dim), fp8(fp8_codes) {
    int needed = 0;
    for (int len : lens) {
      max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
      needed += (len + bs - 1) / bs;
    }
    max_blocks += 1;                // one spare table entry per sequence, pointing at a NaN block
    num_blocks = needed + 5;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);  // scrambled block tables
    const std::size_t row = static_cast<std::size_t>(kvh) * d;
    const std::size_t elems = static_cast<std::size_t>(num_blocks) * bs * row;
    k.assign(elems, kBf16NaN);
    v.assign(elems, kBf16NaN);
    if (fp8) {
      k8.assign(elems, kE4m3NaN);
      v8.assign(elems, kE4m3NaN);
    }
    tables.assign(lens.size() * static_cast<std::size_t>(max_blocks), 0);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::uniform_real_distribution<float> u11(-1.0f, 1.0f);
    const std::int32_t spare = ids[static_cast<std::size_t>(needed)];  // never written: NaN
    int next = 0;
    for (std::size_t s = 0; s < lens.size(); ++s) {
      const int nb = (lens[s] + bs - 1) / bs;
      for (int b = 0; b < max_blocks; ++b)
        tables[s * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(b)] = b < nb ? ids[static_cast<std::size_t>(next++)] : spare;
      for (int p = 0; p < lens[s]; ++p) {
        const auto blk = static_cast<std::size_t>(tables[s * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(p / bs)]);
        const std::size_t base = (blk * static_cast<std::size_t>(bs) + static_cast<std::size_t>(p % bs)) * row;
        for (std::size_t i = 0; i < row; ++i) {
          if (fp8) {
            k8[base + i] = f32_to_e4m3(n01(rng) / kFp8KScale);
            v8[base + i] = f32_to_e4m3(u11(rng) / kFp8VScale);
          } else {
            k[base + i] = f32_to_bf16(n01(rng));
            v[base + i] = f32_to_bf16(u11(rng));
          }
        }
      }
    }
    kf.resize(elems);
    vf.resize(elems);
    vabs.resize(elems);
    for (std::size_t i = 0; i < elems; ++i) {
      kf[i] = fp8 ? e4m3_to_f32(k8[i]) * kFp8KScale : bf16_to_f32(k[i]);
      vf[i] = fp8 ? e4m3_to_f32(v8[i]) * kFp8VScale : bf16_to_f32(v[i]);
      vabs[i] = std::fabs(vf[i]);
    }
  }

  /// The cache's K and V on the device: bf16 values or e4m3 codes.
  struct Device {
    std::size_t bytes;
    test::DeviceMem k, v;
    explicit Device(const Cache& c) : bytes(c.fp8 ? c.k8.size() : c.k.size() * 2), k(bytes), v(bytes) {
      CUDA_REQUIRE(cudaMemcpy(k.p, c.fp8 ? static_cast<const void*>(c.k8.data()) : c.k.data(), bytes, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemcpy(v.p, c.fp8 ? static_cast<const void*>(c.v8.data()) : c.v.data(), bytes, cudaMemcpyHostToDevice));
    }
  };
  /// The PagedKvBatch fields that say what the values are.
  void describe(kc::PagedKvBatch& b) const {
    b.kv_dtype = fp8 ? KvCacheDtype::fp8_e4m3 : KvCacheDtype::automatic;
    b.k_scale = fp8 ? kFp8KScale : 1.0f;
    b.v_scale = fp8 ? kFp8VScale : 1.0f;
  }

  [[nodiscard]] PagedKvView<const float> view(std::size_t seq) const { return view_of(seq, vf); }
  /// The same cache with |V|: attention over it gives the weight `a` of the tensor-core bound.
  [[nodiscard]] PagedKvView<const float> abs_view(std::size_t seq) const { return view_of(seq, vabs); }

 private:
  std::vector<float> vabs;
  [[nodiscard]] PagedKvView<const float> view_of(std::size_t seq, const std::vector<float>& values) const {
    return PagedKvView<const float>{kf.data(), values.data(), tables.data() + seq * static_cast<std::size_t>(max_blocks),
                                    max_blocks, bs, kvh, d};
  }
};

/// The bound of one output value (see above): r the reference, a the reference over |V|, `bf16_p` for the
/// tensor-core kernels.
float tolerance(float r, float a, bool bf16_p) { return std::ldexp(std::fabs(r) + (bf16_p ? a : 0.0f), -8) + 1e-4f; }

/// Counts values outside the bound (reporting the first few); NaN counts as outside.
int compare(const std::vector<std::uint16_t>& got, const std::vector<float>& ref, const std::vector<float>& weight,
            bool bf16_p) {
  int bad = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float g = bf16_to_f32(got[i]), r = ref[i];
    const float tol = tolerance(r, weight[i], bf16_p);
    const float err = std::fabs(g - r);
    if (std::isfinite(g)) worst = std::max(worst, static_cast<double>(err / tol));
    if (!(err <= tol) && ++bad <= 5) FAIL_CHECK("value " << i << ": got " << g << ", reference " << r);
  }
  INFO("worst error / bound: " << worst);
  std::printf("  attention: worst error / bound %.3g\n", worst);
  CHECK(worst <= 1.0);
  return bad;
}

struct Config {
  int group, head_dim, block_size;
  bool fp8 = false;  ///< an FP8 cache (e4m3 codes) instead of bf16
};

std::vector<Config> all_configs() {
  std::vector<Config> c;
  for (int g : {1, 3, 4, 8})
    for (int d : {64, 128})
      for (int bs : {8, 16, 32}) c.push_back({g, d, bs});
  return c;
}

/// A workspace that several calls of different shapes share, zeroed once (as the model's is).
struct SharedWorkspace {
  test::DeviceMem mem;
  std::size_t bytes;
  explicit SharedWorkspace(std::size_t n) : mem(n), bytes(n) { CUDA_REQUIRE(cudaMemset(mem.p, 0, n)); }
};

void run_decode_case(const Config& c, const std::vector<int>& lens, int kvh, std::mt19937& rng, bool expect_split,
                     cudaStream_t stream, SharedWorkspace* shared = nullptr) {
  const int H = c.group * kvh, D = c.head_dim;
  const auto S = static_cast<int>(lens.size());
  INFO("group " << c.group << ", head_dim " << D << ", block " << c.block_size << ", " << S << " sequences, "
                << kvh << " KV heads" << (c.fp8 ? ", FP8 cache" : ""));
  const Cache cache(lens, c.block_size, kvh, D, rng, c.fp8);
  const std::size_t qn = static_cast<std::size_t>(S) * H * D;
  const auto q = random_bf16(qn, rng);
  const auto qf = to_f32(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<float> ref(qn), weight(qn);
  const AttentionShape shape{H, kvh, D, scale};
  for (int s = 0; s < S; ++s) {
    const auto su = static_cast<std::size_t>(s);
    const std::size_t at = su * H * D;
    kernels::cpu::attention(shape, qf.data() + at, ref.data() + at, lens[su] - 1, 1, cache.view(su));
    kernels::cpu::attention(shape, qf.data() + at, weight.data() + at, lens[su] - 1, 1, cache.abs_view(su));
  }

  const Cache::Device dkv(cache);
  test::DeviceMem dt(cache.tables.size() * 4), dl(lens.size() * 4), dq(qn * 2), dout(qn * 2);
  upload(dt, cache.tables);
  upload(dl, std::vector<std::int32_t>(lens.begin(), lens.end()));
  upload(dq, q);
  CUDA_REQUIRE(cudaMemset(dout.p, 0xff, qn * 2));  // 0xffff is a bf16 NaN

  kc::PagedKvBatch batch{dkv.k.p, dkv.v.p, dt.as<const std::int32_t>(), dl.as<const std::int32_t>(),
                         S,       cache.max_blocks, c.block_size,          kvh, D};
  cache.describe(batch);
  const int splits = kc::paged_decode_num_splits(batch, H);
  INFO("splits " << splits);
  if (expect_split) CHECK(splits > 1);
  else CHECK(splits == 1);
  const std::size_t ws = kc::paged_decode_workspace_bytes(batch, H);
  CHECK((ws == 0) == (splits == 1));
  test::DeviceMem own(shared ? 0 : ws);
  if (shared) {
    REQUIRE(ws <= shared->bytes);
  } else {
    // Poison the workspace too: merged values must only come from partials that were written.
    CUDA_REQUIRE(cudaMemset(own.p, 0xff, ws == 0 ? 16 : ws));
  }
  const test::DeviceMem& dws = shared ? shared->mem : own;
  // Twice on one workspace: the second call must not depend on what the first left there.
  for (int call = 0; call < 2; ++call) {
    INFO("call " << call);
    CUDA_REQUIRE(cudaMemset(dout.p, 0xff, qn * 2));
    kc::paged_decode_attention(batch, dq.as<const std::uint16_t>(), H, scale, dout.as<std::uint16_t>(),
                               dws.as<float>(), shared ? shared->bytes : ws, stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    std::vector<std::uint16_t> got(qn);
    CUDA_REQUIRE(cudaMemcpy(got.data(), dout.p, qn * 2, cudaMemcpyDeviceToHost));
    // The decode kernel's P·V on the tensor cores takes P as two bf16 parts (hi + lo): held to the f32 bound.
    CHECK(compare(got, ref, weight, /*bf16_p=*/false) == 0);
  }
}

}  // namespace

TEST_CASE("CUDA paged decode attention matches the CPU reference (split-K)", "[cuda][attention]") {
  std::mt19937 rng(test::test_seed("decode attention, split-K"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (const Config& c : all_configs()) {
    // Few sequences, up to 4096 positions: each context is split across many thread blocks.
    const std::vector<int> lens{1, 17, 1000 + static_cast<int>(rng() % 200), 4096};
    run_decode_case(c, lens, 2, rng, true, stream);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("CUDA paged decode attention: calls of different batch sizes share one workspace", "[cuda][attention]") {
  // As in a decoder, whose batch grows and shrinks between steps: the partials of one call must never land
  // on the arrival counters of another (zeroed once, left zero by every call).
  std::mt19937 rng(test::test_seed("decode attention, shared workspace"));
  SharedWorkspace ws(std::size_t{64} << 20);
  const Config c{4, 128, 16};
  for (const std::size_t n : {1, 5, 2, 9, 1, 3}) {
    std::vector<int> lens(n);
    for (auto& len : lens) len = 200 + static_cast<int>(rng() % 3000);
    run_decode_case(c, lens, 2, rng, true, nullptr, &ws);
  }
}

TEST_CASE("CUDA paged decode attention without a split (grid already full)", "[cuda][attention]") {
  std::mt19937 rng(test::test_seed("decode attention, no split"));
  // Group 12 takes two thread blocks per KV head (8 query heads each, the second one partly empty).
  for (const Config& c : {Config{4, 128, 16}, Config{1, 64, 8}, Config{8, 64, 32}, Config{3, 128, 32}, Config{12, 128, 16}}) {
    // A table capacity of at most 64 positions (one block step) is never split.
    std::vector<int> lens(64);
    for (auto& len : lens) len = 1 + static_cast<int>(rng() % 32);
    run_decode_case(c, lens, 8, rng, false, nullptr);
  }
}

namespace {

// ---- prefill -------------------------------------------------------------------------------------------
//
// Every case runs through each prefill kernel (set_paged_prefill_path): the CUDA-core fallback and the
// tensor-core kernel with 64- and 128-query tiles. The CUDA-core kernel is f32 throughout and is held to the
// f32 bound, the tensor-core kernel to the bound with the bf16-P term (see the top of this file).
// The tensor-core outputs are also compared with the CUDA-core ones (same inputs): by the triangle inequality
// |g_tc - g_cc| <= 2^-8 (2|r| + a) + 2e-4, and both must have written exactly the same values (no NaN).

/// Sets the prefill kernel for one scope and restores the previous choice.
struct PrefillPathScope {
  kc::PrefillPath prev;
  explicit PrefillPathScope(kc::PrefillPath p) : prev(kc::set_paged_prefill_path(p)) {}
  ~PrefillPathScope() { kc::set_paged_prefill_path(prev); }
  PrefillPathScope(const PrefillPathScope&) = delete;
  PrefillPathScope& operator=(const PrefillPathScope&) = delete;
};

constexpr kc::PrefillPath kPrefillPaths[] = {kc::PrefillPath::cuda_cores, kc::PrefillPath::tensor_cores_q64,
                                             kc::PrefillPath::tensor_cores_q128, kc::PrefillPath::tensor_cores_wgmma};

const char* prefill_path_name(kc::PrefillPath p) {
  switch (p) {
    case kc::PrefillPath::cuda_cores: return "CUDA cores";
    case kc::PrefillPath::tensor_cores_q64: return "tensor cores, 64-query tiles";
    case kc::PrefillPath::tensor_cores_q128: return "tensor cores, 128-query tiles";
    case kc::PrefillPath::tensor_cores_wgmma: return "tensor cores, wgmma";
    default: return "automatic";
  }
}

struct Chunk {
  int start, count;  ///< queries at positions start..start+count-1, the cache holding start+count rows
};

/// One batch of chunks (one sequence each) through every prefill kernel, against the CPU reference and the
/// tensor-core kernels against the CUDA-core one. With `misaligned_out` the output starts 2 bytes past a
/// 16-byte boundary, where every path must take the CUDA-core kernel (and so meets its bound).
void run_prefill_case(const Config& c, int kvh, const std::vector<Chunk>& chunks, std::mt19937& rng,
                      cudaStream_t stream, bool misaligned_out = false, std::int64_t q_stride = 0) {
  const int H = c.group * kvh, D = c.head_dim;
  const auto S = static_cast<int>(chunks.size());
  INFO("group " << c.group << ", head_dim " << D << ", block " << c.block_size << ", " << S << " sequences, "
                << kvh << " KV heads" << (misaligned_out ? ", misaligned out" : ""));
  std::vector<int> lens, indptr{0}, starts;
  for (const Chunk& ch : chunks) {
    lens.push_back(ch.start + ch.count);  // rows past the chunk stay NaN
    starts.push_back(ch.start);
    indptr.push_back(indptr.back() + ch.count);
  }
  const Cache cache(lens, c.block_size, kvh, D, rng, c.fp8);
  const auto total_q = static_cast<std::size_t>(indptr.back());
  const std::size_t qn = total_q * H * D;
  const auto q = random_bf16(qn, rng);
  const auto qf = to_f32(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> ref(qn), weight(qn);
  const AttentionShape shape{H, kvh, D, scale};
  for (int s = 0; s < S; ++s) {
    const auto su = static_cast<std::size_t>(s);
    const std::size_t at = static_cast<std::size_t>(indptr[su]) * H * D;
    kernels::cpu::attention(shape, qf.data() + at, ref.data() + at, starts[su], chunks[su].count, cache.view(su));
    kernels::cpu::attention(shape, qf.data() + at, weight.data() + at, starts[su], chunks[su].count, cache.abs_view(su));
  }
  const Cache::Device dkv(cache);
  test::DeviceMem dt(cache.tables.size() * 4), dl(lens.size() * 4), dind(indptr.size() * 4), dst(starts.size() * 4),
      dout(qn * 2 + 16);
  // With a row stride, each row's q sits at the front of a longer row (as in the fused QKV projection's
  // output) whose other values are NaN: a kernel that read past a row's q would fail the comparison.
  const std::size_t row = static_cast<std::size_t>(H) * D;
  const std::size_t stride = q_stride != 0 ? static_cast<std::size_t>(q_stride) : row;
  std::vector<std::uint16_t> q_rows(total_q * stride, 0xffff);
  for (std::size_t r = 0; r < total_q; ++r) std::copy_n(q.begin() + static_cast<std::ptrdiff_t>(r * row), row, q_rows.begin() + static_cast<std::ptrdiff_t>(r * stride));
  test::DeviceMem dq(q_rows.size() * 2);
  upload(dt, cache.tables);
  upload(dl, std::vector<std::int32_t>(lens.begin(), lens.end()));
  upload(dind, std::vector<std::int32_t>(indptr.begin(), indptr.end()));
  upload(dst, std::vector<std::int32_t>(starts.begin(), starts.end()));
  upload(dq, q_rows);
  kc::PagedKvBatch batch{dkv.k.p, dkv.v.p, dt.as<const std::int32_t>(), dl.as<const std::int32_t>(),
                         S,       cache.max_blocks, c.block_size,          kvh, D};
  cache.describe(batch);
  std::uint16_t* out = dout.as<std::uint16_t>(misaligned_out ? 2 : 0);
  std::vector<std::vector<std::uint16_t>> outs;
  for (const kc::PrefillPath path : kPrefillPaths) {
    INFO("prefill kernel: " << prefill_path_name(path));
    const PrefillPathScope scope(path);
    CUDA_REQUIRE(cudaMemset(dout.p, 0xff, qn * 2 + 16));  // 0xffff is a bf16 NaN
    kc::paged_prefill_attention(batch, dq.as<const std::uint16_t>(), dind.as<const std::int32_t>(),
                                dst.as<const std::int32_t>(), H, scale, out, stream, q_stride);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    outs.push_back(download<std::uint16_t>(out, qn));
    const bool bf16_p = path != kc::PrefillPath::cuda_cores && !misaligned_out;
    CHECK(compare(outs.back(), ref, weight, bf16_p) == 0);
  }
  // The tensor-core kernels against the CUDA-core one.
  for (std::size_t k = 1; k < outs.size(); ++k) {
    INFO("prefill kernel " << prefill_path_name(kPrefillPaths[k]) << " against the CUDA cores");
    int bad = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < qn; ++i) {
      const float gt = bf16_to_f32(outs[k][i]), gc = bf16_to_f32(outs[0][i]);
      const float tol = tolerance(ref[i], weight[i], true) + tolerance(ref[i], 0.0f, false);
      const float err = std::fabs(gt - gc);
      if (std::isfinite(err)) worst = std::max(worst, static_cast<double>(err / tol));
      if (!(err <= tol) && ++bad <= 5) FAIL_CHECK("value " << i << ": " << gt << " against " << gc);
    }
    INFO("worst difference / bound: " << worst);
    std::printf("  prefill tensor-core vs CUDA-core: worst difference / bound %.3g\n", worst);
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_CASE("CUDA paged prefill attention matches the CPU reference (chunked, causal)", "[cuda][attention]") {
  std::mt19937 rng(test::test_seed("prefill attention, chunked"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (const Config& c : all_configs()) {
    const int kvh = c.group == 8 ? 1 : 2;
    // Sequences of different lengths in one call: a one-token chunk, a short prompt, a chunk in the middle of a
    // long context (prefix already cached), a whole prompt of several query tiles, the last chunk of a
    // 4096-token context, chunks starting off a 64-position tile and not a multiple of 64 long (spanning
    // query tiles of both heights), an aligned 128 x 128 chunk, an empty chunk, and one of exactly 64.
    const int mid = 1000 + static_cast<int>(rng() % 100);
    const std::vector<Chunk> chunks{{0, 1},   {0, 17},    {mid, 37}, {0, 300}, {4032, 64},
                                    {77, 200}, {63, 129}, {128, 128}, {50, 0},  {5, 64}};
    run_prefill_case(c, kvh, chunks, rng, stream);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("CUDA paged attention over an FP8 cache (e4m3 codes) matches the CPU reference", "[cuda][attention][fp8]") {
  std::mt19937 rng(test::test_seed("attention, FP8 cache"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (const int group : {1, 4, 8})
    for (const int d : {64, 128})
      for (const int bs : {8, 16}) {
        const Config c{group, d, bs, /*fp8=*/true};
        // Decode: split contexts up to 4096 positions, then a full grid of short ones (no split).
        run_decode_case(c, {1, 17, 1000 + static_cast<int>(rng() % 200), 4096}, 2, rng, true, stream);
        std::vector<int> lens(64);
        for (auto& len : lens) len = 1 + static_cast<int>(rng() % 32);
        run_decode_case(c, lens, 8, rng, false, stream);
        // Prefill through every kernel (codes widened in shared memory by the tensor-core ones), with and
        // without a misaligned output (the CUDA-core kernel).
        const std::vector<Chunk> chunks{{0, 1}, {0, 17}, {900, 37}, {0, 300}, {77, 200}, {63, 129}, {50, 0}};
        run_prefill_case(c, group == 8 ? 1 : 2, chunks, rng, stream);
        run_prefill_case(c, 2, {{5, 40}, {0, 3}}, rng, stream, /*misaligned_out=*/true);
      }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("CUDA paged prefill attention: long chunks, any power-of-two block size", "[cuda][attention]") {
  std::mt19937 rng(test::test_seed("prefill attention, long chunks"));
  // Block sizes 1 and 4 (a table lookup for nearly every row), 256 and 1024 (a tile inside one block); long
  // chunks of many query tiles, with and without a cached prefix.
  for (const Config& c : {Config{4, 128, 1}, Config{3, 64, 4}, Config{1, 128, 256}, Config{2, 64, 1024}}) {
    const std::vector<Chunk> chunks{{0, 1000}, {1500, 333}, {0, 65}, {2047, 1}};
    run_prefill_case(c, 2, chunks, rng, nullptr);
  }
}

TEST_CASE("CUDA paged prefill attention with a misaligned output takes the CUDA-core kernel", "[cuda][attention]") {
  std::mt19937 rng(test::test_seed("prefill attention, misaligned output"));
  for (const Config& c : {Config{4, 128, 16}, Config{1, 64, 8}})
    run_prefill_case(c, 2, {{0, 130}, {300, 70}}, rng, nullptr, /*misaligned_out=*/true);
}

TEST_CASE("CUDA paged prefill attention reads q in place, rows a stride apart", "[cuda][attention]") {
  std::mt19937 rng(test::test_seed("prefill attention, q row stride"));
  // The stride of a fused QKV row: q's heads, then k's and v's (group + 2 heads of head_dim per KV head).
  for (const Config& c : {Config{4, 128, 16}, Config{3, 64, 8}}) {
    const int kvh = 2;
    run_prefill_case(c, kvh, {{0, 200}, {37, 90}}, rng, nullptr, false,
                     static_cast<std::int64_t>(c.group + 2) * kvh * c.head_dim);
  }
}

TEST_CASE("set_paged_prefill_path returns the previous choice", "[cuda][attention]") {
  const auto first = kc::set_paged_prefill_path(kc::PrefillPath::cuda_cores);
  CHECK(first == kc::PrefillPath::automatic);  // nothing else has changed it (the scopes above restore it)
  CHECK(kc::set_paged_prefill_path(kc::PrefillPath::tensor_cores_q64) == kc::PrefillPath::cuda_cores);
  CHECK(kc::set_paged_prefill_path(first) == kc::PrefillPath::tensor_cores_q64);
}

TEST_CASE("CUDA paged attention rejects bad arguments", "[cuda][attention]") {
  test::DeviceMem k(4096), v(4096), t(64), l(64), q(4096), out(4096), ws(64);
  const kc::PagedKvBatch good{k.as<const std::uint16_t>(), v.as<const std::uint16_t>(), t.as<const std::int32_t>(),
                              l.as<const std::int32_t>(), 1, 1, 16, 1, 64};
  auto* qp = q.as<const std::uint16_t>();
  auto* op = out.as<std::uint16_t>();
  auto bad = good;
  bad.head_dim = 96;
  CHECK_THROWS_AS(kc::paged_decode_attention(bad, qp, 1, 1.0f, op, nullptr, 0, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kc::paged_prefill_attention(bad, qp, t.as<const std::int32_t>(), l.as<const std::int32_t>(), 1,
                                                1.0f, op, nullptr),
                    Catch::Contains("head_dim = 96"));
  bad = good;
  bad.num_kv_heads = 2;
  CHECK_THROWS_WITH(kc::paged_decode_attention(bad, qp, 3, 1.0f, op, nullptr, 0, nullptr),
                    Catch::Contains("must divide"));
  bad = good;
  bad.block_size = 12;
  CHECK_THROWS_WITH(kc::paged_decode_workspace_bytes(bad, 1), Catch::Contains("power of two"));
  CHECK_THROWS_AS(kc::paged_decode_attention(good, nullptr, 1, 1.0f, op, nullptr, 0, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::paged_decode_attention(good, qp + 1, 1, 1.0f, op, nullptr, 0, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kc::paged_prefill_attention(good, qp, t.as<const std::int32_t>(), l.as<const std::int32_t>(), 1, 1.0f,
                                                op, nullptr, 68),
                    Catch::Contains("q_row_stride = 68"));
  // A long context with one sequence splits, and then needs a workspace.
  bad = good;
  bad.max_blocks_per_seq = 256;
  REQUIRE(kc::paged_decode_workspace_bytes(bad, 1) > 0);
  CHECK_THROWS_WITH(kc::paged_decode_attention(bad, qp, 1, 1.0f, op, ws.as<float>(), 64, nullptr),
                    Catch::Contains("workspace"));
  bad = good;
  bad.num_seqs = 0;
  CHECK_NOTHROW(kc::paged_decode_attention(bad, qp, 1, 1.0f, op, nullptr, 0, nullptr));
}

namespace {

/// Median of `iters` timed runs of `fn` (CUDA events on the legacy stream), after 5 warm-up runs; in ms.
template <class Fn>
double median_ms(Fn&& fn, int iters = 50) {
  for (int i = 0; i < 5; ++i) fn();
  cudaEvent_t a, b;
  CUDA_REQUIRE(cudaEventCreate(&a));
  CUDA_REQUIRE(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CUDA_REQUIRE(cudaEventRecord(a));
    fn();
    CUDA_REQUIRE(cudaEventRecord(b));
    CUDA_REQUIRE(cudaEventSynchronize(b));
    float t = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CUDA_REQUIRE(cudaEventDestroy(a));
  CUDA_REQUIRE(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// One decode-attention shape over random bf16 K, V and q (scrambled block tables, every context full):
/// prints time, K+V bytes read per second, and that rate over a device-to-device copy measured here
/// (bytes read + written), the ceiling a bandwidth-bound kernel is held to.
/// `fp8`: the cache holds e4m3 codes (all 0x30, 0.5: a bandwidth figure needs no random values).
void bench_decode(int S, int L, int H, int KVH, int D, int BS, double copy_tbs, bool fp8 = false) {
  const int MB = (L + BS - 1) / BS;
  const std::size_t blocks = static_cast<std::size_t>(S) * MB;
  const std::size_t kv_elems = blocks * BS * KVH * D;
  const std::size_t value_bytes = fp8 ? 1 : 2;
  test::DeviceMem dk(kv_elems * value_bytes), dv(kv_elems * value_bytes), dt(blocks * 4), dl(S * 4), dq(S * H * D * 2),
      dout(S * H * D * 2);
  if (fp8) {
    CUDA_REQUIRE(cudaMemset(dk.p, 0x30, kv_elems));
    CUDA_REQUIRE(cudaMemset(dv.p, 0x30, kv_elems));
  } else {
    kc::fill_dummy_bf16(dk.as<std::uint16_t>(), kv_elems, 1, 0.0f, 1.0f, nullptr);
    kc::fill_dummy_bf16(dv.as<std::uint16_t>(), kv_elems, 2, 0.0f, 1.0f, nullptr);
  }
  kc::fill_dummy_bf16(dq.as<std::uint16_t>(), static_cast<std::size_t>(S) * H * D, 3, 0.0f, 1.0f, nullptr);
  std::mt19937 rng(7);
  std::vector<std::int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  upload(dt, ids);
  upload(dl, std::vector<std::int32_t>(static_cast<std::size_t>(S), L));
  kc::PagedKvBatch batch{dk.p, dv.p, dt.as<const std::int32_t>(), dl.as<const std::int32_t>(), S, MB, BS, KVH, D};
  if (fp8) batch.kv_dtype = KvCacheDtype::fp8_e4m3;
  const std::size_t ws = kc::paged_decode_workspace_bytes(batch, H);
  test::DeviceMem dws(ws);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const double med = median_ms([&] {
    kc::paged_decode_attention(batch, dq.as<const std::uint16_t>(), H, scale, dout.as<std::uint16_t>(), dws.as<float>(),
                               ws, nullptr);
  });
  const double tbs = 2.0 * static_cast<double>(S) * L * KVH * D * static_cast<double>(value_bytes) / (med * 1e-3) / 1e12;
  std::printf("paged decode%s b%d ctx%d h%d/%d d%d block%d splits %d: median %.1f us, %.2f TB/s (K+V read), %.0f%% of copy\n",
              fp8 ? " (FP8 cache)" : "", S, L, H, KVH, D, BS, kc::paged_decode_num_splits(batch, H), med * 1e3, tbs,
              100.0 * tbs / copy_tbs);
}

}  // namespace

TEST_CASE("CUDA paged decode attention bandwidth", "[cuda][attention][.bench]") {
  // The ceiling: a 1 GiB device-to-device copy, read + written bytes over time.
  constexpr std::size_t kCopy = std::size_t{1} << 30;
  test::DeviceMem src(kCopy), dst(kCopy);
  CUDA_REQUIRE(cudaMemset(src.p, 0x5a, kCopy));
  const double copy_ms = median_ms([&] { CUDA_REQUIRE(cudaMemcpyAsync(dst.p, src.p, kCopy, cudaMemcpyDeviceToDevice)); }, 20);
  const double copy_tbs = 2.0 * kCopy / (copy_ms * 1e-3) / 1e12;
  std::printf("device-to-device copy of 1 GiB: %.1f us, %.2f TB/s (read + written)\n", copy_ms * 1e3, copy_tbs);
  // The shape (batch 64, context 2048, 32 query / 8 KV heads, head_dim 128: 512 MiB of K+V), its
  // other block sizes, Llama-3-8B's batch-1 decode (one layer, 640 positions), and a large batch of short
  // contexts as in a throughput run.
  for (const int bs : {16, 8, 32}) bench_decode(64, 2048, 32, 8, 128, bs, copy_tbs);
  bench_decode(1, 640, 32, 8, 128, 16, copy_tbs);  // Llama-3-8B's batch-1 step: its context split
  bench_decode(256, 256, 32, 8, 128, 16, copy_tbs);
  bench_decode(1024, 192, 32, 8, 128, 16, copy_tbs);  // the decode steps of 1024 x (128 in, 128 out), mid-way
  bench_decode(64, 2048, 9, 3, 64, 16, copy_tbs);  // SmolLM2's heads
  // The FP8 cache: the same shapes reading half the bytes.
  bench_decode(64, 2048, 32, 8, 128, 16, copy_tbs, true);
  bench_decode(1, 640, 32, 8, 128, 16, copy_tbs, true);
  bench_decode(256, 256, 32, 8, 128, 16, copy_tbs, true);
  bench_decode(64, 2048, 9, 3, 64, 16, copy_tbs, true);
}

TEST_CASE("CUDA paged prefill attention throughput", "[cuda][attention][.bench]") {
  // Causal, 32 query heads of 128 over 8 (GQA) or 32 KV heads, block 16: 4 sequences x 4096 tokens, and one
  // prompt of 2048 over 8 KV heads (a Llama-3-8B layer of the time-to-first-token run). FLOPs counted as
  // 4·b·h·d·(causal pairs). Constant inputs make the softmax uniform, so every output value is exactly V's
  // (p = 1 is exact in bf16 and n·v is exact in f32): a cheap check that every row was written.
  struct Shape {
    int seqs, len, kv_heads;
  };
  for (const Shape sh : {Shape{4, 4096, 8}, Shape{4, 4096, 32}, Shape{1, 2048, 8}}) {
    const int S = sh.seqs, L = sh.len, KVH = sh.kv_heads;
    constexpr int H = 32, D = 128, BS = 16;
    constexpr std::uint16_t kValue = 0x3c3c;
    const int MB = L / BS;  // the table covers exactly the chunk: no thread block exits early
    const std::size_t blocks = static_cast<std::size_t>(S) * MB;
    const std::size_t qn = static_cast<std::size_t>(S) * L * H * D;
    std::mt19937 rng(7);
    std::vector<std::int32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<std::int32_t> ind(static_cast<std::size_t>(S) + 1);
    for (int s = 0; s <= S; ++s) ind[static_cast<std::size_t>(s)] = s * L;
    test::DeviceMem dt(blocks * 4), dl(static_cast<std::size_t>(S) * 4), dq(qn * 2), dout(qn * 2),
        dind((static_cast<std::size_t>(S) + 1) * 4), dst(static_cast<std::size_t>(S) * 4);
    upload(dt, ids);
    upload(dl, std::vector<std::int32_t>(static_cast<std::size_t>(S), L));
    upload(dind, ind);
    upload(dst, std::vector<std::int32_t>(static_cast<std::size_t>(S), 0));
    CUDA_REQUIRE(cudaMemset(dq.p, 0x3c, qn * 2));
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::size_t kv_elems = blocks * BS * KVH * D;
    test::DeviceMem dk(kv_elems * 2), dv(kv_elems * 2);
    CUDA_REQUIRE(cudaMemset(dk.p, 0x3c, kv_elems * 2));
    CUDA_REQUIRE(cudaMemset(dv.p, 0x3c, kv_elems * 2));
    const kc::PagedKvBatch batch{dk.as<const std::uint16_t>(), dv.as<const std::uint16_t>(),
                                 dt.as<const std::int32_t>(), dl.as<const std::int32_t>(), S, MB, BS, KVH, D};
    for (const kc::PrefillPath path : {kc::PrefillPath::cuda_cores, kc::PrefillPath::tensor_cores_q64,
                                       kc::PrefillPath::tensor_cores_q128, kc::PrefillPath::tensor_cores_wgmma,
                                       kc::PrefillPath::automatic}) {
      if (path == kc::PrefillPath::cuda_cores && L < 4096) continue;  // 40+ ms, measured at 4096 already
      INFO("prefill kernel: " << prefill_path_name(path) << ", " << KVH << " KV heads");
      const PrefillPathScope scope(path);
      auto step = [&] {
        kc::paged_prefill_attention(batch, dq.as<const std::uint16_t>(), dind.as<const std::int32_t>(),
                                    dst.as<const std::int32_t>(), H, scale, dout.as<std::uint16_t>(), nullptr);
      };
      CUDA_REQUIRE(cudaMemset(dout.p, 0xff, qn * 2));
      step();
      CUDA_REQUIRE(cudaDeviceSynchronize());
      const auto got = download<std::uint16_t>(dout.p, qn);
      CHECK(std::count(got.begin(), got.end(), kValue) == static_cast<std::ptrdiff_t>(qn));
      const double med = median_ms(step, 10);
      const double flops = 4.0 * S * H * D * (static_cast<double>(L) * (L + 1) / 2);
      std::printf("paged prefill b%d s%d h%d/%d d%d block%d causal, %s: median %.3f ms, %.1f TFLOP/s\n", S, L, H,
                  KVH, D, BS, prefill_path_name(path), med, flops / (med * 1e-3) / 1e12);
    }
  }
}
