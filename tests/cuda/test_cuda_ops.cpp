// The decoder's elementwise CUDA kernels (kernels/cuda/ops.hpp) against the CPU reference
// (kernels::cpu, f32) on the same bf16-rounded inputs. Random inputs from printed seeds (support/test_seed.hpp),
// outputs poisoned with NaN (all-ones bytes) first.
//
// Error bounds, per output type:
// - f32 outputs computed by the same f32 operations in the same order (embedding, the residual add,
//   add): bit for bit.
// - bf16 outputs: the kernel rounds its f32 result g to bf16 (round to nearest even), at most half an
//   ulp: |bf16(g) - g| <= 2^-8 |g|. g itself differs from the CPU's f32 result r by reordering and
//   by library functions (f32 tree sum vs. the CPU's double sum, rsqrtf, expf, sincosf, FMA
//   contraction): a few f32 ulps, bounded by `slack` below. So |bf16(g) - r| <= 2^-8 |r| + (1 + 2^-8) e
//   with e the f32-level bound, stated per kernel.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/kernels/cuda/ops.hpp"

using namespace infer;
using namespace infer::test;
namespace rt = infer::backend::cuda;
namespace kc = infer::kernels::cuda;
namespace kcpu = infer::kernels::cpu;

namespace {

constexpr float kBf16Half = 1.0f / 256.0f;  // 2^-8: half an ulp of bf16, relative
constexpr std::uint16_t kBf16Nan = 0xffff;

std::vector<float> random_f32(std::size_t n, float mean, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// A device copy of `host` (plus `pad` poisoned elements before it, to test unaligned pointers).
template <class T>
struct Dev {
  rt::DeviceBuffer buf;
  std::size_t pad = 0;
  Dev(const std::vector<T>& host, std::size_t pad_elems = 0)
      : buf((host.size() + pad_elems) * sizeof(T) + 16), pad(pad_elems) {
    buf.fill_bytes(0xff);
    buf.upload(std::span<const T>(host), pad * sizeof(T));
  }
  /// A poisoned buffer of n elements.
  static Dev poisoned(std::size_t n, std::size_t pad_elems = 0) { return Dev(std::vector<T>(), n, pad_elems); }
  T* ptr() const { return buf.as<T>() + pad; }
  std::vector<T> get(std::size_t n) const {
    std::vector<T> out(n);
    buf.download(std::span<T>(out), pad * sizeof(T));
    return out;
  }

 private:
  Dev(const std::vector<T>&, std::size_t n, std::size_t pad_elems) : buf((n + pad_elems) * sizeof(T) + 16), pad(pad_elems) {
    buf.fill_bytes(0xff);
  }
};

void device_sync() { rt::check(cudaDeviceSynchronize(), "test synchronize"); }

/// Counts values outside `bound(i)`; reports the first few.
template <class Got, class Bound>
int count_bad(const char* what, std::size_t n, Got got, const std::vector<float>& ref, Bound bound) {
  int bad = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = got(i), r = ref[i], b = bound(i);
    const float err = std::fabs(g - r);
    if (!(err <= b)) {  // NaN fails too
      if (++bad <= 5) FAIL_CHECK(what << " value " << i << ": got " << g << ", reference " << r << ", bound " << b);
    } else if (b > 0) {
      worst = std::max(worst, static_cast<double>(err / b));
    }
  }
  INFO(what << ": worst error / bound = " << worst);
  std::printf("  %s: worst error / bound %.3g\n", what, worst);
  CHECK(bad == 0);
  return bad;
}

}  // namespace

TEST_CASE("cuda::embedding gathers bf16 rows into f32 exactly", "[cuda][ops]") {
  const auto seed = test::test_seed("cuda::embedding");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::int64_t vocab = 1000;
  for (std::int64_t dim : {576, 64, 8, 13, 1}) {
    for (std::int64_t n : {1, 7, 301}) {
      for (std::size_t pad : {0, 1}) {  // pad 1: unaligned output, the scalar path
        INFO("dim " << dim << ", n " << n << ", output shifted by " << pad);
        const auto table = test::random_bf16(static_cast<std::size_t>(vocab * dim), rng, 1.0f);
        std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
        for (auto& id : ids) id = static_cast<std::int32_t>(rng() % vocab);
        ids[0] = static_cast<std::int32_t>(vocab - 1);
        if (n > 1) ids[1] = 0;
        Dev<std::uint16_t> d_table(table);
        Dev<std::int32_t> d_ids(ids);
        auto d_out = Dev<float>::poisoned(static_cast<std::size_t>(n * dim), pad);
        kc::embedding(d_table.ptr(), d_ids.ptr(), n, dim, d_out.ptr(), nullptr);
        device_sync();
        const auto got = d_out.get(static_cast<std::size_t>(n * dim));
        int bad = 0;
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t c = 0; c < dim; ++c) {
            const float want = bf16_to_f32(table[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)] * dim + c)]);
            const float g = got[static_cast<std::size_t>(r * dim + c)];
            if (std::memcmp(&g, &want, 4) != 0 && ++bad <= 5) FAIL_CHECK("row " << r << " col " << c << ": " << g << " != " << want);
          }
        CHECK(bad == 0);
        if (pad) {
          std::vector<float> before(1);
          d_out.buf.download(std::span<float>(before));
          CHECK(std::isnan(before[0]));  // nothing written before the output
        }
      }
    }
  }
  CHECK_THROWS_AS(kc::embedding(nullptr, nullptr, 3, 8, nullptr, nullptr), InvalidArgument);
  CHECK_NOTHROW(kc::embedding(nullptr, nullptr, 0, 8, nullptr, nullptr));
}

TEST_CASE("cuda::add_rmsnorm and add_bf16_rmsnorm match cpu::add + cpu::rms_norm", "[cuda][ops]") {
  const auto seed = test::test_seed("cuda::add_rmsnorm");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const float eps = 1e-6f;
  struct Case {
    std::int64_t rows, dim;
    bool delta;
    std::size_t pad;  // elements before residual/delta/out: 1 forces the scalar path
  };
  const Case cases[] = {{1, 576, true, 0},   {3, 576, false, 0},  {17, 64, true, 0},   {5, 4096, true, 0},
                        {2, 8192, true, 0},  {4, 130, true, 0},   {7, 577, false, 0},  {9, 576, true, 1},
                        {1, 12288, true, 0}, {33, 4, true, 0},    {2, 1, true, 0},     {3, 2000, true, 1}};
  for (const Case& c : cases) {
    INFO("rows " << c.rows << ", dim " << c.dim << (c.delta ? ", with delta" : ", no delta") << ", pad " << c.pad);
    const auto n = static_cast<std::size_t>(c.rows * c.dim);
    auto residual = random_f32(n, 0.0f, 2.0f, rng);
    const auto residual_before = residual;
    const auto delta = random_f32(n, 0.0f, 1.0f, rng);
    const auto weight = random_f32(static_cast<std::size_t>(c.dim), 1.0f, 0.3f, rng);

    Dev<float> d_res(residual, c.pad), d_delta(delta, c.pad), d_w(weight);
    auto d_out = Dev<std::uint16_t>::poisoned(n, c.pad);
    kc::add_rmsnorm(d_res.ptr(), c.delta ? d_delta.ptr() : nullptr, d_w.ptr(), c.rows, c.dim, eps, d_out.ptr(),
                    nullptr);
    device_sync();

    if (c.delta) kcpu::add(residual.data(), delta.data(), n);
    std::vector<float> ref(n);
    kcpu::rms_norm(residual.data(), weight.data(), ref.data(), c.rows, c.dim, eps);

    // The residual add is the same f32 addition on both sides: bit for bit.
    const auto got_res = d_res.get(n);
    CHECK(std::memcmp(got_res.data(), residual.data(), n * 4) == 0);
    // f32 level: the sum of squares (f32, each thread sequential over <= dim/32 terms, then a tree)
    // is within ~(dim/32 + 10) * 2^-24 relative of the double sum, its rsqrtf within 2 ulps, two
    // products one ulp each; sqrt halves the sum's error. 2^-16 relative covers dim <= 2^12 * 32.
    const auto got = d_out.get(n);
    const float slack = std::ldexp(1.0f, -16);
    count_bad("rmsnorm", n, [&](std::size_t i) { return bf16_to_f32(got[i]); }, ref,
              [&](std::size_t i) { return (kBf16Half + slack * (1.0f + kBf16Half)) * std::fabs(ref[i]); });

    if (!c.delta) continue;
    // The same with the delta in bf16 (a projection's output): the CPU adds the same bf16 values.
    std::vector<std::uint16_t> delta_bf16(n);
    std::vector<float> delta_rounded(n);
    for (std::size_t i = 0; i < n; ++i) {
      delta_bf16[i] = f32_to_bf16(delta[i]);
      delta_rounded[i] = bf16_to_f32(delta_bf16[i]);
    }
    auto residual_b = residual_before;
    Dev<float> d_res_b(residual_b, c.pad);
    Dev<std::uint16_t> d_delta_b(delta_bf16, c.pad);
    auto d_out_b = Dev<std::uint16_t>::poisoned(n, c.pad);
    kc::add_bf16_rmsnorm(d_res_b.ptr(), d_delta_b.ptr(), d_w.ptr(), c.rows, c.dim, eps, d_out_b.ptr(), nullptr);
    device_sync();
    kcpu::add(residual_b.data(), delta_rounded.data(), n);
    kcpu::rms_norm(residual_b.data(), weight.data(), ref.data(), c.rows, c.dim, eps);
    const auto got_res_b = d_res_b.get(n);
    CHECK(std::memcmp(got_res_b.data(), residual_b.data(), n * 4) == 0);
    const auto got_b = d_out_b.get(n);
    count_bad("rmsnorm (bf16 delta)", n, [&](std::size_t i) { return bf16_to_f32(got_b[i]); }, ref,
              [&](std::size_t i) { return (kBf16Half + slack * (1.0f + kBf16Half)) * std::fabs(ref[i]); });

    // Out of place (residual_norm, the decoder's ping-pong residual): the input stays as it was, the sum goes to
    // residual_out, and x is the in-place kernel's bits.
    Dev<float> d_res_c(residual_before, c.pad);
    auto d_sum = Dev<float>::poisoned(n, c.pad);
    auto d_out_c = Dev<std::uint16_t>::poisoned(n, c.pad);
    kc::residual_norm({d_res_c.ptr(), d_delta_b.ptr(), d_w.ptr(), eps, d_sum.ptr(), d_out_c.ptr()}, c.rows, c.dim,
                      nullptr);
    device_sync();
    const auto kept = d_res_c.get(n), sum = d_sum.get(n);
    CHECK(std::memcmp(kept.data(), residual_before.data(), n * 4) == 0);
    CHECK(std::memcmp(sum.data(), residual_b.data(), n * 4) == 0);
    CHECK(d_out_c.get(n) == got_b);
  }
  CHECK_THROWS_AS(kc::add_bf16_rmsnorm(nullptr, nullptr, nullptr, 2, 8, eps, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::add_rmsnorm(nullptr, nullptr, nullptr, 2, 8, eps, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::add_rmsnorm(nullptr, nullptr, nullptr, -1, 8, eps, nullptr, nullptr), InvalidArgument);
}

TEST_CASE("cuda::rope_write_kv rotates q and k and writes the paged cache", "[cuda][ops]") {
  const auto seed = test::test_seed("cuda::rope_write_kv");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    int nq, nkv, hd, block_size;
    std::int64_t T;
    float theta;
  };
  // GQA ratios 1, 3, 4, 8; head_dim 64 and 128 (and 2, 6: no 16-byte V path; 512: more pairs than a block's
  // threads, whose (sin, cos) each thread puts in shared memory in turn); block sizes 8/16/32.
  const Case cases[] = {{4, 4, 64, 16, 7, 10000.0f},  {9, 3, 64, 8, 33, 10000.0f},  {8, 2, 128, 32, 1, 500000.0f},
                        {16, 2, 128, 16, 13, 1e6f},   {32, 8, 128, 16, 5, 10000.0f}, {3, 1, 6, 8, 9, 10000.0f},
                        {2, 2, 2, 8, 3, 100.0f},       {12, 4, 64, 32, 65, 10000.0f}, {4, 2, 512, 16, 6, 10000.0f}};
  for (const Case& c : cases) {
    for (int style : {0, 1}) {
      const RopeStyle rs = style == 0 ? RopeStyle::neox : RopeStyle::interleaved;
      INFO("nq " << c.nq << ", nkv " << c.nkv << ", hd " << c.hd << ", block_size " << c.block_size << ", T " << c.T
                 << ", theta " << c.theta << ", style " << to_string(rs));
      const std::int64_t T = c.T;
      const int hd = c.hd, half = hd / 2, nq = c.nq, nkv = c.nkv;
      const std::int64_t width = static_cast<std::int64_t>(nq + 2 * nkv) * hd;
      const auto qkv = test::random_bf16(static_cast<std::size_t>(T * width), rng, 1.0f);

      std::vector<std::int32_t> positions(static_cast<std::size_t>(T));
      for (auto& p : positions) p = static_cast<std::int32_t>(rng() % 4096);
      positions[0] = 0;
      if (T > 2) positions[static_cast<std::size_t>(T - 1)] = 32767;  // a long context
      std::vector<float> inv_freq(static_cast<std::size_t>(half));
      for (int i = 0; i < half; ++i)
        inv_freq[static_cast<std::size_t>(i)] =
            static_cast<float>(std::pow(static_cast<double>(c.theta), -2.0 * i / hd));

      // Paged cache with more rows than tokens; slots are a scrambled choice of distinct rows, and one
      // token (when T > 3) is padding with slot -1.
      const std::int64_t num_blocks = (T + c.block_size - 1) / c.block_size * 2 + 1;
      const std::int64_t cache_rows = num_blocks * c.block_size;
      std::vector<std::int64_t> rows(static_cast<std::size_t>(cache_rows));
      std::iota(rows.begin(), rows.end(), std::int64_t{0});
      std::shuffle(rows.begin(), rows.end(), rng);
      std::vector<std::int64_t> slot(rows.begin(), rows.begin() + T);
      if (T > 3) slot[1] = -1;

      Dev<std::uint16_t> d_qkv(qkv);
      Dev<std::int32_t> d_pos(positions);
      Dev<float> d_freq(inv_freq);
      Dev<std::int64_t> d_slot(slot);
      const auto cache_elems = static_cast<std::size_t>(cache_rows * nkv * hd);
      auto d_k = Dev<std::uint16_t>::poisoned(cache_elems), d_v = Dev<std::uint16_t>::poisoned(cache_elems);
      kc::rope_write_kv(d_qkv.ptr(), d_pos.ptr(), d_freq.ptr(), T, nq, nkv, hd, style, d_k.ptr(), d_v.ptr(),
                        d_slot.ptr(), nullptr);
      device_sync();

      // CPU reference: q and k heads as f32 [T][heads][hd], rotated by cpu::rope with rope_table's angles.
      std::vector<float> q(static_cast<std::size_t>(T * nq * hd)), k(static_cast<std::size_t>(T * nkv * hd));
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t j = 0; j < static_cast<std::int64_t>(nq) * hd; ++j)
          q[static_cast<std::size_t>(t * nq * hd + j)] = bf16_to_f32(qkv[static_cast<std::size_t>(t * width + j)]);
        for (std::int64_t j = 0; j < static_cast<std::int64_t>(nkv) * hd; ++j)
          k[static_cast<std::size_t>(t * nkv * hd + j)] =
              bf16_to_f32(qkv[static_cast<std::size_t>(t * width + nq * hd + j)]);
      }
      const auto q_in = q, k_in = k;
      std::vector<float> cs(static_cast<std::size_t>(T * hd));
      kcpu::rope_table(positions.data(), T, inv_freq.data(), half, cs.data());
      kcpu::rope(q.data(), T, nq, hd, cs.data(), rs);
      kcpu::rope(k.data(), T, nkv, hd, cs.data(), rs);

      // f32-level error of one rotated value: the device's angle f32(pos) * inv_freq is rounded once
      // (<= 2^-24 |angle|), sincosf is within ~2 ulps (<= 2^-22 absolute for values <= 1), the CPU's
      // table is rounded to f32 (2^-24), and a*c - b*s is rounded once or twice (FMA or not): in all
      // <= (|angle| 2^-24 + 2^-20) * |(a, b)| with |(a, b)| the pair's norm.
      auto bound_for = [&](const std::vector<float>& in, const std::vector<float>& ref, int heads) {
        std::vector<float> b(in.size());
        for (std::int64_t t = 0; t < T; ++t)
          for (int h = 0; h < heads; ++h)
            for (int i = 0; i < half; ++i) {
              const std::size_t base = static_cast<std::size_t>((t * heads + h) * hd);
              const std::size_t ia = base + static_cast<std::size_t>(style == 0 ? i : 2 * i);
              const std::size_t ib = base + static_cast<std::size_t>(style == 0 ? i + half : 2 * i + 1);
              const float norm = std::hypot(in[ia], in[ib]);
              const float angle =
                  static_cast<float>(positions[static_cast<std::size_t>(t)]) * inv_freq[static_cast<std::size_t>(i)];
              const float e = (std::fabs(angle) * std::ldexp(1.0f, -24) + std::ldexp(1.0f, -20)) * norm;
              b[ia] = kBf16Half * std::fabs(ref[ia]) + (1.0f + kBf16Half) * e;
              b[ib] = kBf16Half * std::fabs(ref[ib]) + (1.0f + kBf16Half) * e;
            }
        return b;
      };
      const auto qb = bound_for(q_in, q, nq), kb = bound_for(k_in, k, nkv);

      const auto got = d_qkv.get(qkv.size());
      const auto gk = d_k.get(cache_elems), gv = d_v.get(cache_elems);
      auto at = [&](std::int64_t t, std::int64_t j) { return got[static_cast<std::size_t>(t * width + j)]; };
      const std::int64_t qw = static_cast<std::int64_t>(nq) * hd, kw = static_cast<std::int64_t>(nkv) * hd;
      count_bad("rotated q", q.size(),
                [&](std::size_t i) { return bf16_to_f32(at(static_cast<std::int64_t>(i) / qw, static_cast<std::int64_t>(i) % qw)); },
                q, [&](std::size_t i) { return qb[i]; });
      count_bad("rotated k (in qkv)", k.size(),
                [&](std::size_t i) {
                  return bf16_to_f32(at(static_cast<std::int64_t>(i) / kw, qw + static_cast<std::int64_t>(i) % kw));
                },
                k, [&](std::size_t i) { return kb[i]; });

      // Cache rows: k equals the rotated k left in qkv, v equals the input v, bit for bit; v in qkv is
      // untouched; every row no token maps to is still NaN.
      std::set<std::int64_t> written;
      int bad = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t j = 0; j < kw; ++j) {
          const std::uint16_t vin = qkv[static_cast<std::size_t>(t * width + qw + kw + j)];
          if (at(t, qw + kw + j) != vin && ++bad <= 5) FAIL_CHECK("v in qkv changed at token " << t << ", " << j);
        }
        const std::int64_t s = slot[static_cast<std::size_t>(t)];
        if (s < 0) continue;
        written.insert(s);
        for (std::int64_t j = 0; j < kw; ++j) {
          const auto ci = static_cast<std::size_t>(s * kw + j);
          if (gk[ci] != at(t, qw + j) && ++bad <= 5) FAIL_CHECK("k cache row " << s << " (token " << t << ") value " << j);
          if (gv[ci] != at(t, qw + kw + j) && ++bad <= 5)
            FAIL_CHECK("v cache row " << s << " (token " << t << ") value " << j);
        }
      }
      int touched = 0;
      for (std::int64_t r = 0; r < cache_rows; ++r) {
        if (written.count(r)) continue;
        for (std::int64_t j = 0; j < kw; ++j) {
          const auto ci = static_cast<std::size_t>(r * kw + j);
          if ((gk[ci] != kBf16Nan || gv[ci] != kBf16Nan) && ++touched <= 5)
            FAIL_CHECK("cache row " << r << " was written though no token maps to it");
        }
      }
      CHECK(bad == 0);
      CHECK(touched == 0);

      // The same call into an FP8 cache: qkv as above, bit for bit, and each cache value the e4m3 code of the
      // bf16 value above times 1 / scale (round to nearest even, saturating: the CPU's f32_to_e4m3), scales
      // that are not powers of two; unwritten rows keep their poison (0xff, an e4m3 NaN).
      const float k_scale = 0.0123f, v_scale = 0.0071f;  // some values saturate at 448 codes
      Dev<std::uint16_t> d_qkv8(qkv);
      auto d_k8 = Dev<std::uint8_t>::poisoned(cache_elems), d_v8 = Dev<std::uint8_t>::poisoned(cache_elems);
      kc::rope_write_kv(d_qkv8.ptr(), d_pos.ptr(), d_freq.ptr(), T, nq, nkv, hd, style, d_k8.ptr(), d_v8.ptr(),
                        d_slot.ptr(), nullptr, KvCacheDtype::fp8_e4m3, k_scale, v_scale);
      device_sync();
      CHECK(d_qkv8.get(qkv.size()) == got);
      const auto gk8 = d_k8.get(cache_elems), gv8 = d_v8.get(cache_elems);
      const float ik = 1.0f / k_scale, iv = 1.0f / v_scale;
      int bad8 = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t s = slot[static_cast<std::size_t>(t)];
        if (s < 0) continue;
        for (std::int64_t j = 0; j < kw; ++j) {
          const auto ci = static_cast<std::size_t>(s * kw + j);
          if (gk8[ci] != f32_to_e4m3(bf16_to_f32(at(t, qw + j)) * ik) && ++bad8 <= 5)
            FAIL_CHECK("FP8 k cache row " << s << " value " << j << ": code " << int(gk8[ci]));
          if (gv8[ci] != f32_to_e4m3(bf16_to_f32(at(t, qw + kw + j)) * iv) && ++bad8 <= 5)
            FAIL_CHECK("FP8 v cache row " << s << " value " << j << ": code " << int(gv8[ci]));
        }
      }
      for (std::int64_t r = 0; r < cache_rows; ++r) {
        if (written.count(r)) continue;
        for (std::int64_t j = 0; j < kw; ++j) {
          const auto ci = static_cast<std::size_t>(r * kw + j);
          if ((gk8[ci] != 0xff || gv8[ci] != 0xff) && ++bad8 <= 5) FAIL_CHECK("FP8 cache row " << r << " was written");
        }
      }
      CHECK(bad8 == 0);
    }
  }
  std::uint16_t* null16 = nullptr;
  CHECK_THROWS_WITH(kc::rope_write_kv(null16, nullptr, nullptr, 1, 1, 1, 64, 0, null16, null16, nullptr, nullptr,
                                      KvCacheDtype::fp8_e4m3, 0.0f, 1.0f),
                    Catch::Contains("positive and finite"));
  CHECK_THROWS_AS(kc::rope_write_kv(null16, nullptr, nullptr, 1, 1, 1, 64, 2, null16, null16, nullptr, nullptr),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::rope_write_kv(null16, nullptr, nullptr, 1, 1, 1, 63, 0, null16, null16, nullptr, nullptr),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::rope_write_kv(null16, nullptr, nullptr, 1, 1, 1, 64, 0, null16, null16, nullptr, nullptr),
                  InvalidArgument);
}

TEST_CASE("cuda::swiglu matches cpu::swiglu", "[cuda][ops]") {
  const auto seed = test::test_seed("cuda::swiglu");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (std::int64_t T : {1, 7, 33}) {
    for (std::int64_t I : {1536, 8, 1000, 13, 1001, 1}) {
      for (std::size_t pad : {0, 1}) {
        INFO("T " << T << ", I " << I << ", pointers shifted by " << pad);
        const auto gate_up = test::random_bf16(static_cast<std::size_t>(T * 2 * I), rng, 3.0f);
        Dev<std::uint16_t> d_in(gate_up, pad);
        auto d_out = Dev<std::uint16_t>::poisoned(static_cast<std::size_t>(T * I), pad);
        kc::swiglu(d_in.ptr(), T, I, d_out.ptr(), nullptr);
        device_sync();
        std::vector<float> gate(static_cast<std::size_t>(T * I)), up(gate.size());
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t i = 0; i < I; ++i) {
            gate[static_cast<std::size_t>(t * I + i)] = bf16_to_f32(gate_up[static_cast<std::size_t>(t * 2 * I + i)]);
            up[static_cast<std::size_t>(t * I + i)] = bf16_to_f32(gate_up[static_cast<std::size_t>(t * 2 * I + I + i)]);
          }
        kcpu::swiglu(gate.data(), up.data(), gate.size());
        const auto got = d_out.get(gate.size());
        // f32 level: expf within 2 ulps, then an add, a correctly rounded division and a product:
        // <= 2^-20 relative. An absolute 2^-126 floor covers results in the subnormal range.
        count_bad("swiglu", gate.size(), [&](std::size_t i) { return bf16_to_f32(got[i]); }, gate,
                  [&](std::size_t i) {
                    return (kBf16Half + std::ldexp(1.0f, -20)) * std::fabs(gate[i]) + std::ldexp(1.0f, -126);
                  });
      }
    }
  }
  CHECK_THROWS_AS(kc::swiglu(nullptr, 2, 8, nullptr, nullptr), InvalidArgument);
}

TEST_CASE("cuda::add adds bf16 deltas into the f32 residual exactly", "[cuda][ops]") {
  const auto seed = test::test_seed("cuda::add");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (std::int64_t n : {1, 7, 8, 4099, 100000}) {
    for (std::size_t pad : {0, 1}) {
      INFO("n " << n << ", delta shifted by " << pad);
      auto residual = random_f32(static_cast<std::size_t>(n), 0.0f, 4.0f, rng);
      const auto delta = test::random_bf16(static_cast<std::size_t>(n), rng, 1.0f);
      Dev<float> d_res(residual);
      Dev<std::uint16_t> d_delta(delta, pad);
      kc::add(d_res.ptr(), d_delta.ptr(), n, nullptr);
      device_sync();
      const auto df = to_f32(delta);
      kcpu::add(residual.data(), df.data(), df.size());
      const auto got = d_res.get(static_cast<std::size_t>(n));
      CHECK(std::memcmp(got.data(), residual.data(), got.size() * 4) == 0);
    }
  }
  CHECK_THROWS_AS(kc::add(nullptr, nullptr, 5, nullptr), InvalidArgument);
}

// Not a correctness test (hidden and not tagged [cuda]; run with "[ops_perf]"): effective bandwidth of each kernel at
// prefill-sized shapes of an 8B model, median of 20 timed runs after warm-up.
TEST_CASE("cuda elementwise ops: bandwidth", "[.][perf][ops_perf]") {
  std::mt19937 rng(1);
  const std::int64_t T = 4096, D = 4096, I = 14336, vocab = 32000;
  const int nq = 32, nkv = 8, hd = 128;
  rt::DeviceBuffer table(static_cast<std::size_t>(vocab * D) * 2), ids(static_cast<std::size_t>(T) * 4),
      res(static_cast<std::size_t>(T * D) * 4), delta(static_cast<std::size_t>(T * D) * 4), w(D * 4),
      out(static_cast<std::size_t>(T * D) * 2), gate_up(static_cast<std::size_t>(T * 2 * I) * 2),
      act(static_cast<std::size_t>(T * I) * 2), qkv(static_cast<std::size_t>(T * (nq + 2 * nkv) * hd) * 2),
      pos(static_cast<std::size_t>(T) * 4), freq(hd / 2 * 4), kc_(static_cast<std::size_t>(T * nkv * hd) * 2),
      vc_(static_cast<std::size_t>(T * nkv * hd) * 2), slot(static_cast<std::size_t>(T) * 8);
  for (rt::DeviceBuffer* b : {&table, &res, &delta, &w, &gate_up, &qkv, &freq}) {
    std::vector<std::uint16_t> v = test::random_bf16(b->size() / 2, rng, 0.5f);  // any finite bits will do
    b->upload(std::span<const std::uint16_t>(v));
  }
  std::vector<std::int32_t> hid(static_cast<std::size_t>(T));
  for (auto& x : hid) x = static_cast<std::int32_t>(rng() % vocab);
  ids.upload(std::span<const std::int32_t>(hid));
  std::vector<std::int32_t> hpos(static_cast<std::size_t>(T));
  std::iota(hpos.begin(), hpos.end(), 0);
  pos.upload(std::span<const std::int32_t>(hpos));
  std::vector<std::int64_t> hslot(static_cast<std::size_t>(T));
  std::iota(hslot.begin(), hslot.end(), std::int64_t{0});
  std::shuffle(hslot.begin(), hslot.end(), rng);
  slot.upload(std::span<const std::int64_t>(hslot));

  rt::Stream s;
  auto time = [&](const char* name, double bytes, auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
      rt::EventTimer t;
      t.start(s.handle());
      fn();
      t.stop(s.handle());
      ms.push_back(t.elapsed_ms());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("%-34s %9.1f us  %7.0f GB/s\n", name, med * 1e3, bytes / (med * 1e-3) / 1e9);
  };
  const double td = static_cast<double>(T * D);
  time("embedding 4096x4096", td * (2 + 4), [&] {
    kc::embedding(table.as<std::uint16_t>(), ids.as<std::int32_t>(), T, D, res.as<float>(), s.handle());
  });
  time("add_rmsnorm 4096x4096 (+delta)", td * (4 + 4 + 4 + 2), [&] {
    kc::add_rmsnorm(res.as<float>(), delta.as<float>(), w.as<float>(), T, D, 1e-6f, out.as<std::uint16_t>(),
                    s.handle());
  });
  const double qkv_elems = static_cast<double>(T * (nq + 2 * nkv) * hd), kv_elems = static_cast<double>(T * nkv * hd);
  time("rope_write_kv 4096 tok 32/8x128", (qkv_elems + (nq + nkv) * hd * static_cast<double>(T) + 2 * kv_elems) * 2, [&] {
    kc::rope_write_kv(qkv.as<std::uint16_t>(), pos.as<std::int32_t>(), freq.as<float>(), T, nq, nkv, hd, 0,
                      kc_.as<std::uint16_t>(), vc_.as<std::uint16_t>(), slot.as<std::int64_t>(), s.handle());
  });
  time("swiglu 4096x14336", static_cast<double>(T * I) * (4 + 2), [&] {
    kc::swiglu(gate_up.as<std::uint16_t>(), T, I, act.as<std::uint16_t>(), s.handle());
  });
  time("add 4096x4096", td * (4 + 4 + 2), [&] {
    kc::add(res.as<float>(), out.as<std::uint16_t>(), T * D, s.handle());
  });
  s.synchronize();
}
