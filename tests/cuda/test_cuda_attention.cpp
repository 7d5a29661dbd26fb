// CUDA paged attention (decode with split-K, prefill / chunked prefill) against the CPU reference
// kernels::cpu::attention, run in f32 on the bf16-rounded inputs through a PagedKvView over a host copy
// of the cache. Fresh random inputs every run (the seed is printed), block tables scrambled, every cache
// row that no query may see (past a sequence's length, spare blocks, the spare table entry) left NaN, and
// the outputs poisoned with NaN first, so a missing write or an out-of-range read shows up as NaN.
//
// Error bound, per output value g against the reference r:  |g - r| <= 2^-8 |r| + 1e-4.
//  - r is a convex combination of V values drawn from U(-1, 1), so |r| <= 1;
//  - the kernels accumulate in f32 like the reference but in another order and with exp2 instead of exp:
//    over <= 4096 terms that differs by ~1e-5 at most (a few f32 ulps per term, growing like sqrt(n)),
//    so 1e-4 absolute is a 10x margin;
//  - the output is rounded to bf16 (8 significant bits, round to nearest): at most half an ulp, 2^-8 |r|.
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
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/attention.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

constexpr std::uint16_t kBf16NaN = 0x7fc0;

/// One layer's paged cache for a batch: `lens[s]` rows of sequence s written, everything else NaN.
struct Cache {
  int bs = 0, kvh = 0, d = 0, max_blocks = 0, num_blocks = 0;
  std::vector<std::uint16_t> k, v;
  std::vector<float> kf, vf;
  std::vector<std::int32_t> tables;

  Cache(const std::vector<int>& lens, int block_size, int kv_heads, int head_dim, std::mt19937& rng)
      : bs(block_size), kvh(kv_heads), d(head_dim) {
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
          k[base + i] = f32_to_bf16(n01(rng));
          v[base + i] = f32_to_bf16(u11(rng));
        }
      }
    }
    kf.resize(elems);
    vf.resize(elems);
    for (std::size_t i = 0; i < elems; ++i) {
      kf[i] = bf16_to_f32(k[i]);
      vf[i] = bf16_to_f32(v[i]);
    }
  }

  [[nodiscard]] PagedKvView<const float> view(std::size_t seq) const {
    return PagedKvView<const float>{kf.data(), vf.data(), tables.data() + seq * static_cast<std::size_t>(max_blocks),
                                    max_blocks, bs, kvh, d};
  }
};

/// Counts values outside the bound (reporting the first few); NaN counts as outside.
int compare(const std::vector<std::uint16_t>& got, const std::vector<float>& ref) {
  int bad = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float g = bf16_to_f32(got[i]), r = ref[i];
    const float tol = std::ldexp(std::fabs(r), -8) + 1e-4f;
    const float err = std::fabs(g - r);
    if (std::isfinite(g)) worst = std::max(worst, static_cast<double>(err / tol));
    if (!(err <= tol) && ++bad <= 5) FAIL_CHECK("value " << i << ": got " << g << ", reference " << r);
  }
  INFO("worst error / bound: " << worst);
  CHECK(worst <= 1.0);
  return bad;
}

struct Config {
  int group, head_dim, block_size;
};

std::vector<Config> all_configs() {
  std::vector<Config> c;
  for (int g : {1, 3, 4, 8})
    for (int d : {64, 128})
      for (int bs : {8, 16, 32}) c.push_back({g, d, bs});
  return c;
}

void run_decode_case(const Config& c, const std::vector<int>& lens, int kvh, std::mt19937& rng, bool expect_split,
                     cudaStream_t stream) {
  const int H = c.group * kvh, D = c.head_dim;
  const auto S = static_cast<int>(lens.size());
  INFO("group " << c.group << ", head_dim " << D << ", block " << c.block_size << ", " << S << " sequences, "
                << kvh << " KV heads");
  const Cache cache(lens, c.block_size, kvh, D, rng);
  const std::size_t qn = static_cast<std::size_t>(S) * H * D;
  const auto q = random_bf16(qn, rng);
  const auto qf = to_f32(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<float> ref(qn);
  const AttentionShape shape{H, kvh, D, scale};
  for (int s = 0; s < S; ++s) {
    const std::size_t at = static_cast<std::size_t>(s) * H * D;
    kernels::cpu::attention(shape, qf.data() + at, ref.data() + at, lens[static_cast<std::size_t>(s)] - 1, 1,
                            cache.view(static_cast<std::size_t>(s)));
  }

  test::DeviceMem dk(cache.k.size() * 2), dv(cache.v.size() * 2), dt(cache.tables.size() * 4),
      dl(lens.size() * 4), dq(qn * 2), dout(qn * 2);
  upload(dk, cache.k);
  upload(dv, cache.v);
  upload(dt, cache.tables);
  upload(dl, std::vector<std::int32_t>(lens.begin(), lens.end()));
  upload(dq, q);
  CUDA_REQUIRE(cudaMemset(dout.p, 0xff, qn * 2));  // 0xffff is a bf16 NaN

  const kc::PagedKvBatch batch{dk.as<const std::uint16_t>(), dv.as<const std::uint16_t>(),
                               dt.as<const std::int32_t>(), dl.as<const std::int32_t>(),
                               S, cache.max_blocks, c.block_size, kvh, D};
  const int splits = kc::paged_decode_num_splits(batch, H);
  INFO("splits " << splits);
  if (expect_split) CHECK(splits > 1);
  else CHECK(splits == 1);
  const std::size_t ws = kc::paged_decode_workspace_bytes(batch, H);
  CHECK((ws == 0) == (splits == 1));
  test::DeviceMem dws(ws);
  // Poison the workspace too: merged values must only come from partials that were written.
  CUDA_REQUIRE(cudaMemset(dws.p, 0xff, ws == 0 ? 16 : ws));
  kc::paged_decode_attention(batch, dq.as<const std::uint16_t>(), H, scale, dout.as<std::uint16_t>(),
                             dws.as<float>(), ws, stream);
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  std::vector<std::uint16_t> got(qn);
  CUDA_REQUIRE(cudaMemcpy(got.data(), dout.p, qn * 2, cudaMemcpyDeviceToHost));
  CHECK(compare(got, ref) == 0);
}

}  // namespace

TEST_CASE("CUDA paged decode attention matches the CPU reference (split-K)", "[cuda][attention]") {
  std::mt19937 rng(test::fresh_seed("test_cuda_attention"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (const Config& c : all_configs()) {
    // Few sequences, up to 4096 positions: each context is split across many thread blocks.
    const std::vector<int> lens{1, 17, 1000 + static_cast<int>(rng() % 200), 4096};
    run_decode_case(c, lens, 2, rng, true, stream);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("CUDA paged decode attention without a split (grid already full)", "[cuda][attention]") {
  std::mt19937 rng(test::fresh_seed("test_cuda_attention"));
  for (const Config& c : {Config{4, 128, 16}, Config{1, 64, 8}, Config{8, 64, 32}, Config{3, 128, 32}}) {
    // 64 x 8 blocks fill the GPU, and contexts under 256 positions (table capacity included) never split.
    std::vector<int> lens(64);
    for (auto& len : lens) len = 1 + static_cast<int>(rng() % 150);
    run_decode_case(c, lens, 8, rng, false, nullptr);
  }
}

TEST_CASE("CUDA paged prefill attention matches the CPU reference (chunked, causal)", "[cuda][attention]") {
  std::mt19937 rng(test::fresh_seed("test_cuda_attention"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (const Config& c : all_configs()) {
    const int kvh = c.group == 8 ? 1 : 2;
    const int H = c.group * kvh, D = c.head_dim;
    // (start, count): a one-token chunk, a short prompt, a chunk in the middle of a long context, a whole
    // prompt of several query tiles, and the last chunk of a 4096-token context.
    const int mid = 1000 + static_cast<int>(rng() % 100);
    const std::vector<std::pair<int, int>> chunks{{0, 1}, {0, 17}, {mid, 37}, {0, 300}, {4032, 64}};
    INFO("group " << c.group << ", head_dim " << D << ", block " << c.block_size);
    std::vector<int> lens, indptr{0}, starts;
    for (auto [st, n] : chunks) {
      lens.push_back(st + n);  // rows past the chunk stay NaN
      starts.push_back(st);
      indptr.push_back(indptr.back() + n);
    }
    const auto S = static_cast<int>(chunks.size());
    const Cache cache(lens, c.block_size, kvh, D, rng);
    const auto total_q = static_cast<std::size_t>(indptr.back());
    const std::size_t qn = total_q * H * D;
    const auto q = random_bf16(qn, rng);
    const auto qf = to_f32(q);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::vector<float> ref(qn);
    const AttentionShape shape{H, kvh, D, scale};
    for (int s = 0; s < S; ++s) {
      const std::size_t at = static_cast<std::size_t>(indptr[static_cast<std::size_t>(s)]) * H * D;
      kernels::cpu::attention(shape, qf.data() + at, ref.data() + at, starts[static_cast<std::size_t>(s)],
                              chunks[static_cast<std::size_t>(s)].second, cache.view(static_cast<std::size_t>(s)));
    }
    test::DeviceMem dk(cache.k.size() * 2), dv(cache.v.size() * 2), dt(cache.tables.size() * 4), dl(lens.size() * 4),
        dind(indptr.size() * 4), dst(starts.size() * 4), dq(qn * 2), dout(qn * 2);
    upload(dk, cache.k);
    upload(dv, cache.v);
    upload(dt, cache.tables);
    upload(dl, std::vector<std::int32_t>(lens.begin(), lens.end()));
    upload(dind, std::vector<std::int32_t>(indptr.begin(), indptr.end()));
    upload(dst, std::vector<std::int32_t>(starts.begin(), starts.end()));
    upload(dq, q);
    CUDA_REQUIRE(cudaMemset(dout.p, 0xff, qn * 2));
    const kc::PagedKvBatch batch{dk.as<const std::uint16_t>(), dv.as<const std::uint16_t>(),
                                 dt.as<const std::int32_t>(), dl.as<const std::int32_t>(),
                                 S, cache.max_blocks, c.block_size, kvh, D};
    kc::paged_prefill_attention(batch, dq.as<const std::uint16_t>(), dind.as<const std::int32_t>(),
                                dst.as<const std::int32_t>(), H, scale, dout.as<std::uint16_t>(), stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    std::vector<std::uint16_t> got(qn);
    CUDA_REQUIRE(cudaMemcpy(got.data(), dout.p, qn * 2, cudaMemcpyDeviceToHost));
    CHECK(compare(got, ref) == 0);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
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

TEST_CASE("CUDA paged decode attention bandwidth", "[cuda][attention][.bench]") {
  // batch 64, context 2048, 32 query / 8 KV heads, head_dim 128, block 16: 512 MiB of K+V per step.
  constexpr int S = 64, L = 2048, H = 32, KVH = 8, D = 128, BS = 16;
  constexpr int MB = L / BS;
  const std::size_t blocks = static_cast<std::size_t>(S) * MB;
  const std::size_t kv_elems = blocks * BS * KVH * D;
  test::DeviceMem dk(kv_elems * 2), dv(kv_elems * 2), dt(blocks * 4), dl(S * 4), dq(S * H * D * 2), dout(S * H * D * 2);
  CUDA_REQUIRE(cudaMemset(dk.p, 0x3c, kv_elems * 2));
  CUDA_REQUIRE(cudaMemset(dv.p, 0x3c, kv_elems * 2));
  CUDA_REQUIRE(cudaMemset(dq.p, 0x3c, S * H * D * 2));
  std::mt19937 rng(7);
  std::vector<std::int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  upload(dt, ids);
  upload(dl, std::vector<std::int32_t>(S, L));
  const kc::PagedKvBatch batch{dk.as<const std::uint16_t>(), dv.as<const std::uint16_t>(), dt.as<const std::int32_t>(),
                               dl.as<const std::int32_t>(), S, MB, BS, KVH, D};
  const std::size_t ws = kc::paged_decode_workspace_bytes(batch, H);
  test::DeviceMem dws(ws);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto step = [&] {
    kc::paged_decode_attention(batch, dq.as<const std::uint16_t>(), H, scale, dout.as<std::uint16_t>(), dws.as<float>(),
                               ws, nullptr);
  };
  for (int i = 0; i < 5; ++i) step();
  cudaEvent_t a, b;
  CUDA_REQUIRE(cudaEventCreate(&a));
  CUDA_REQUIRE(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CUDA_REQUIRE(cudaEventRecord(a));
    step();
    CUDA_REQUIRE(cudaEventRecord(b));
    CUDA_REQUIRE(cudaEventSynchronize(b));
    float t = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double bytes = 2.0 * static_cast<double>(kv_elems) * 2.0;
  std::printf("paged decode b%d ctx%d h%d/%d d%d block%d splits %d: median %.1f us, %.2f TB/s (K+V read)\n", S, L, H,
              KVH, D, BS, kc::paged_decode_num_splits(batch, H), med * 1e3, bytes / (med * 1e-3) / 1e12);

  // Prefill for scale: 4 sequences x 2048 tokens, causal.
  constexpr int PS = 4, PL = 2048;
  const std::size_t pq = static_cast<std::size_t>(PS) * PL * H * D;
  test::DeviceMem pdq(pq * 2), pdo(pq * 2), pind((PS + 1) * 4), pst(PS * 4);
  CUDA_REQUIRE(cudaMemset(pdq.p, 0x3c, pq * 2));
  std::vector<std::int32_t> ind(PS + 1);
  for (int s = 0; s <= PS; ++s) ind[static_cast<std::size_t>(s)] = s * PL;
  upload(pind, ind);
  upload(pst, std::vector<std::int32_t>(PS, 0));
  auto pbatch = batch;
  pbatch.num_seqs = PS;
  auto pstep = [&] {
    kc::paged_prefill_attention(pbatch, pdq.as<const std::uint16_t>(), pind.as<const std::int32_t>(),
                                pst.as<const std::int32_t>(), H, scale, pdo.as<std::uint16_t>(), nullptr);
  };
  pstep();
  ms.clear();
  for (int i = 0; i < 5; ++i) {
    CUDA_REQUIRE(cudaEventRecord(a));
    pstep();
    CUDA_REQUIRE(cudaEventRecord(b));
    CUDA_REQUIRE(cudaEventSynchronize(b));
    float t = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double pmed = ms[ms.size() / 2];
  const double flops = 4.0 * PS * H * D * (static_cast<double>(PL) * (PL + 1) / 2);
  std::printf("paged prefill b%d s%d h%d/%d d%d causal: median %.2f ms, %.1f TFLOP/s\n", PS, PL, H, KVH, D, pmed,
              flops / (pmed * 1e-3) / 1e12);
  CUDA_REQUIRE(cudaEventDestroy(a));
  CUDA_REQUIRE(cudaEventDestroy(b));
}
