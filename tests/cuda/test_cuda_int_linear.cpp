// Weight-only integer linear kernels (kernels/cuda/int_linear.cu) against the CPU's Int8WeightOnly and Int4
// (quant/int8_weight_only.hpp, quant/int4.hpp) on the same inputs, from printed seeds (support/test_seed.hpp);
// outputs poisoned with NaN first.
//
// The quantizers must give the CPU's codes, scales and zeros bit for bit (same f32 division, same rounding),
// and the dequantization for the GEMM the CPU's bf16(value) bit for bit. The GEMVs against the CPU matmul on
// the same weights, per element, with A = Σ_k |x_k·w_k| (w the dequantized weight):
//   INT8: |got − ref| ≤ 2^-8·|ref| + 4·K·2^-24·A
// 2^-8: the bf16 output's rounding (8 significant bits, to nearest: at most 2^-8 of the value). Each product x·q is exact in f32 (8 and 7 significant
// bits); the CPU multiplies by the pre-scaled q·s (one more rounding per term) and both sides sum K f32 terms
// in different orders (≤ K·2^-24·A each), doubled for slack.
// The INT4 weights on the GPU are bf16(q·s_b + m_b), s_b and m_b the bf16 roundings of s and −s·z (two bf16x2
// instructions decode them for the tensor cores: int_linear.hpp). The test computes those bf16 weights on the
// CPU (std::fma of exact values, one rounding: what fma.rn.bf16x2 does) and wants
//   - dequantize_int4_bf16 to give them bit for bit;
//   - each within 2^-7·(1 + 2^-8)·s·(q + |z|) of the CPU's s·(q − z) (the roundings of s, m and the sum);
//   - the GEMV (tensor cores, f32 sums) and the GEMM path within 2^-8·|ref| + 8·K·2^-24·A of x · w_bf16ᵀ in
//     double, A = Σ |x·w_bf16| (the bf16 output, and f32 sums in any order, doubled for the mma's adder);
//   - and so within 2^-8·|ref| + 2^-7·(1 + 2^-8)·B + 8·K·2^-24·B of the CPU's Int4::matmul, B = Σ |x|·s·(q + |z|).
// The wider terms grow with K: the small shapes (K = 32, 128) are the ones where a single wrong code shows.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/int_linear.hpp"
#include "infer/quant/int4.hpp"
#include "infer/quant/int8_weight_only.hpp"
#include "infer/backend/weight_store.hpp"
#include "infer/model/model_source.hpp"
#include "support/cuda_test_support.hpp"
#include "support/int4_checkpoint.hpp"
#include "support/tiny_checkpoint.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

/// Rows of f32 weights at very different magnitudes: N(0, 0.02), tiny, huge, one outlier over small values,
/// all zeros, all positive (a group whose range must be widened to hold 0).
std::vector<float> awkward_weights(std::int64_t rows, std::int64_t K, std::mt19937& rng) {
  std::vector<float> v(static_cast<std::size_t>(rows * K));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float scale[] = {0.02f, 1e-20f, 1e30f, 1e-3f, 0.0f, 0.5f};
    for (std::int64_t k = 0; k < K; ++k) {
      float x = d(rng) * scale[r % 6];
      if (r % 6 == 5) x = std::fabs(x) + 0.1f;
      v[static_cast<std::size_t>(r * K + k)] = x;
    }
    if (r % 6 == 3) v[static_cast<std::size_t>(r * K + K / 2)] = 7.5f;
  }
  return v;
}

std::vector<float> normal_weights(std::int64_t rows, std::int64_t K, std::mt19937& rng, float stddev = 0.02f) {
  std::vector<float> v(static_cast<std::size_t>(rows * K));
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto& x : v) x = d(rng);
  return v;
}

/// An Int4 CPU weight in the GPU's layout (Int4::pack_for_cuda, in its own group size).
struct PackedInt4 {
  std::vector<std::uint32_t> words, scale_min;
  explicit PackedInt4(const Int4::linear<cpu>& l) { Int4::pack_for_cuda(l, l.group_size, words, scale_min); }
};

/// The bf16 weight the GPU decodes for w[n][k]: bf16(q·s_b + m_b) with one rounding.
float gpu_int4_weight(const Int4::linear<cpu>& w, std::int64_t n, std::int64_t k) {
  const auto g = static_cast<std::size_t>(n * w.groups + k / w.group_size);
  const float s = w.scale[g], sb = bf16_to_f32(f32_to_bf16(s)), mb = bf16_to_f32(f32_to_bf16(-s * w.zero[g]));
  const float q = w.q[static_cast<std::size_t>(n * w.in() + k)];
  return bf16_to_f32(f32_to_bf16(std::fma(q, sb, mb)));
}

struct Stream {
  cudaStream_t s{};
  Stream() { CUDA_REQUIRE(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
};

/// Checks got against want element by element within bound(i); prints the worst error / bound.
template <class Bound>
void check_within(const std::vector<float>& got, const std::vector<float>& want, Bound bound, const char* what) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double b = bound(i) + 1e-30, err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (err <= b) worst = std::max(worst, err / b);
    else if (++bad <= 5) FAIL_CHECK(what << ": y[" << i << "] = " << got[i] << ", want " << want[i] << " ± " << b);
  }
  CHECK(bad == 0);
  std::printf("  %s: worst error / bound %.3g\n", what, worst);
}

struct MatShape {
  std::int64_t N, K;
};

}  // namespace

TEST_CASE("cuda::quantize_rows_int8 gives Int8WeightOnly::quantize's codes and scales bit for bit", "[cuda][int8]") {
  Stream stream;
  std::mt19937 rng(test_seed("cuda::quantize_rows_int8"));
  for (const std::int64_t K : {1, 16, 1000, 4096, 14336}) {
    INFO("K=" << K);
    const std::int64_t rows = 12;
    const auto w = awkward_weights(rows, K, rng);
    const auto want = Int8WeightOnly::quantize(w, rows, K);
    test::DeviceMem dw(w.size() * 4), dq(w.size()), ds(static_cast<std::size_t>(rows) * 4);
    upload(dw, w);
    CUDA_REQUIRE(cudaMemset(dq.p, 0x55, w.size()));
    CUDA_REQUIRE(cudaMemset(ds.p, 0xff, static_cast<std::size_t>(rows) * 4));
    kc::quantize_rows_int8(dw.as<float>(), rows, K, dq.as<std::int8_t>(), ds.as<float>(), stream.s);
    CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
    const auto q = download<std::int8_t>(dq.p, w.size());
    const auto s = download<float>(ds.p, static_cast<std::size_t>(rows));
    int bad = 0;
    for (std::size_t r = 0; r < s.size(); ++r)
      if (std::memcmp(&s[r], &want.scale[r], 4) != 0 && ++bad <= 5)
        FAIL_CHECK("row " << r << ": scale " << s[r] << ", the CPU's " << want.scale[r]);
    for (std::size_t i = 0; i < q.size(); ++i)
      if (q[i] != want.q[i] && ++bad <= 5)
        FAIL_CHECK("value " << i << " (" << w[i] << "): code " << int{q[i]} << ", the CPU's " << int{want.q[i]});
    CHECK(bad == 0);
  }
  test::DeviceMem d(64);
  CHECK_THROWS_AS(kc::quantize_rows_int8(d.as<float>(), -1, 16, d.as<std::int8_t>(), d.as<float>(), stream.s),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::quantize_rows_int8(d.as<float>(), 1, 0, d.as<std::int8_t>(), d.as<float>(), stream.s),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::quantize_rows_int8(d.as<float>(), 1, 16, nullptr, d.as<float>(), stream.s), InvalidArgument);
}

TEST_CASE("Int8WeightOnly on cuda: the GEMV (M = 1..8) and the GEMM path match the CPU's matmul", "[cuda][int8]") {
  Stream stream;
  kc::Gemm gemm;
  // Splits across warps (gemv_split.cuh) of 1, 2 and 4; N odd and off the 2-row group; K ragged against the unroll.
  const MatShape shapes[] = {{1, 16}, {3, 64}, {333, 1008}, {1000, 4096}, {64, 14336}, {77, 8192}};
  std::mt19937 rng(test_seed("Int8WeightOnly on cuda"));
  for (const MatShape& s : shapes) {
    const auto w = Int8WeightOnly::quantize(normal_weights(s.N, s.K, rng), s.N, s.K);
    test::DeviceMem dq(w.q.size()), ds(w.scale.size() * 4);
    upload(dq, w.q);
    upload(ds, w.scale);
    const Int8WeightOnly::linear<cuda> lw{dq.as<std::int8_t>(), ds.as<float>(), s.N, s.K};
    test::DeviceMem scratch(static_cast<std::size_t>(s.N * s.K) * 2);
    CudaMatmulContext ctx{&gemm, stream.s, scratch.as<std::uint16_t>(), static_cast<std::size_t>(s.N * s.K)};
    for (const int M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 40}) {
      const auto xb = random_bf16(static_cast<std::size_t>(M * s.K), rng);
      const auto xf = to_f32(xb);
      std::vector<float> want(static_cast<std::size_t>(M * s.N));
      Int8WeightOnly::matmul(cpu{}, w, xf.data(), M, want.data());
      test::DeviceMem dx(xb.size() * 2), dy(want.size() * 2);
      upload(dx, xb);
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, want.size() * 2));  // NaN
      Int8WeightOnly::matmul(ctx, lw, dx.as<std::uint16_t>(), M, dy.as<std::uint16_t>());
      CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
      const auto got = to_f32(download<std::uint16_t>(dy.p, want.size()));
      const bool gemv = M <= kc::kGemvMaxRows;
      const auto bound = [&](std::size_t i) {
        const auto m = static_cast<std::int64_t>(i) / s.N, n = static_cast<std::int64_t>(i) % s.N;
        double a = 0;
        for (std::int64_t k = 0; k < s.K; ++k)
          a += std::fabs(static_cast<double>(xf[static_cast<std::size_t>(m * s.K + k)]) *
                         w.value(n, k));
        return std::ldexp(std::fabs(static_cast<double>(want[i])), -8) +
               (gemv ? 4.0 * static_cast<double>(s.K) * std::ldexp(a, -24) : std::ldexp(a, -8));
      };
      char what[96];
      std::snprintf(what, sizeof what, "int8 %s M=%d N=%lld K=%lld", gemv ? "GEMV" : "GEMM", M,
                    static_cast<long long>(s.N), static_cast<long long>(s.K));
      INFO(what);
      check_within(got, want, bound, what);
    }
  }
  test::DeviceMem d(4096);
  const auto* q = d.as<std::int8_t>();
  const auto* f = d.as<float>();
  const auto* x = d.as<std::uint16_t>();
  auto* y = d.as<std::uint16_t>();
  CHECK_FALSE(kc::int8_gemv_supports(q, x, 24));
  CHECK_FALSE(kc::int8_gemv_supports(d.as<std::int8_t>(8), x, 32));
  CHECK_THROWS_AS(kc::int8_gemv(q, f, x, 1, 4, 24, y, stream.s), InvalidArgument);
  CHECK_THROWS_AS(kc::int8_gemv(q, f, x, 9, 4, 32, y, stream.s), InvalidArgument);
  CHECK_THROWS_AS(kc::int8_gemv(q, nullptr, x, 1, 4, 32, y, stream.s), InvalidArgument);
  CHECK_THROWS_AS(kc::dequantize_int8_bf16(q, f, 4, 24, y, stream.s), InvalidArgument);
}

TEST_CASE("cuda::quantize_groups_int4 packs Int4::quantize's codes, scales and zeros bit for bit", "[cuda][int4]") {
  Stream stream;
  std::mt19937 rng(test_seed("cuda::quantize_groups_int4"));
  for (const MatShape s : {MatShape{12, 32}, MatShape{12, 128}, MatShape{12, 4096}, MatShape{7, 14336}})
    for (const std::int64_t G : {32, 128}) {
      if (s.K % G != 0) continue;
      INFO("N=" << s.N << " K=" << s.K << " G=" << G);
      const auto w = awkward_weights(s.N, s.K, rng);
      const PackedInt4 want(Int4::quantize(w, s.N, s.K, G));
      test::DeviceMem dw(w.size() * 4), dc(want.words.size() * 4), dsm(want.scale_min.size() * 4);
      upload(dw, w);
      CUDA_REQUIRE(cudaMemset(dc.p, 0x55, want.words.size() * 4));
      CUDA_REQUIRE(cudaMemset(dsm.p, 0xff, want.scale_min.size() * 4));
      kc::quantize_groups_int4(dw.as<float>(), s.N, s.K, G, dc.as<std::uint8_t>(), dsm.as<std::uint32_t>(), stream.s);
      CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
      CHECK(download<std::uint32_t>(dc.p, want.words.size()) == want.words);
      CHECK(download<std::uint32_t>(dsm.p, want.scale_min.size()) == want.scale_min);
    }
  test::DeviceMem d(64);
  CHECK_THROWS_AS(kc::quantize_groups_int4(d.as<float>(), 1, 48, 16, d.as<std::uint8_t>(), d.as<std::uint32_t>(), stream.s),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::quantize_groups_int4(d.as<float>(), 1, 96, 64, d.as<std::uint8_t>(), d.as<std::uint32_t>(), stream.s),
                  InvalidArgument);
}

TEST_CASE("Int4 on cuda: the decoded bf16 weights, the GEMV (M = 1..8) and the GEMM path against the CPU's", "[cuda][int4]") {
  Stream stream;
  kc::Gemm gemm;
  const MatShape shapes[] = {{1, 32}, {3, 128}, {333, 1024}, {1000, 4096}, {64, 14336}, {77, 8192}};
  std::mt19937 rng(test_seed("Int4 on cuda"));
  for (const MatShape& s : shapes)
    for (const bool float_zeros : {false, true}) {
      // Round-to-nearest in groups of 128 (32 where K is smaller), or GGUF Q4_1's float zeros in groups of 32.
      const std::int64_t G = float_zeros ? 32 : std::min<std::int64_t>(128, s.K);
      Int4::linear<cpu> w = Int4::quantize(normal_weights(s.N, s.K, rng), s.N, s.K, G);
      if (float_zeros) {
        std::uniform_real_distribution<float> z(-3.0f, 18.0f);
        for (float& v : w.zero) v = z(rng);
      }
      const PackedInt4 p(w);
      test::DeviceMem dc(p.words.size() * 4), dsm(p.scale_min.size() * 4);
      upload(dc, p.words);
      upload(dsm, p.scale_min);
      const Int4::linear<cuda> lw{dc.as<std::uint8_t>(), dsm.as<std::uint32_t>(), s.N, s.K, G};
      REQUIRE(lw.consistent());
      test::DeviceMem scratch(static_cast<std::size_t>(s.N * s.K) * 2);
      CudaMatmulContext ctx{&gemm, stream.s, scratch.as<std::uint16_t>(), static_cast<std::size_t>(s.N * s.K)};
      std::vector<float> wb(static_cast<std::size_t>(s.N * s.K));  // the GPU's bf16 weights
      {
        int bad = 0;
        for (std::int64_t n = 0; n < s.N; ++n)
          for (std::int64_t k = 0; k < s.K; ++k) {
            const auto i = static_cast<std::size_t>(n * s.K + k);
            wb[i] = gpu_int4_weight(w, n, k);
            const auto g = static_cast<std::size_t>(n * w.groups + k / G);
            const double bound = std::ldexp(1.0 + std::ldexp(1.0, -8), -7) * w.scale[g] * (w.q[i] + std::fabs(w.zero[g]));
            if (std::fabs(static_cast<double>(wb[i]) - w.value(n, k)) > bound && ++bad <= 5)
              FAIL_CHECK("w[" << n << "][" << k << "] decodes to " << wb[i] << ", the CPU's " << w.value(n, k) << " ± " << bound);
          }
        CHECK(bad == 0);
        kc::dequantize_int4_bf16(lw.codes, lw.scale_min, G, s.N, s.K, scratch.as<std::uint16_t>(), stream.s);
        CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
        CHECK(to_f32(download<std::uint16_t>(scratch.p, wb.size())) == wb);  // bit for bit (no NaN here)
      }
      for (const int M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 40}) {
        const auto xb = random_bf16(static_cast<std::size_t>(M * s.K), rng);
        const auto xf = to_f32(xb);
        std::vector<float> want(static_cast<std::size_t>(M * s.N)), exact(want.size());
        Int4::matmul(cpu{}, w, xf.data(), M, want.data());
        std::vector<double> a(want.size()), b(want.size());
        for (int m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < s.N; ++n) {
            double sum = 0;
            const auto i = static_cast<std::size_t>(m * s.N + n);
            for (std::int64_t k = 0; k < s.K; ++k) {
              const double x = xf[static_cast<std::size_t>(m * s.K + k)];
              const auto wi = static_cast<std::size_t>(n * s.K + k);
              const auto g = static_cast<std::size_t>(n * w.groups + k / G);
              sum += x * wb[wi];
              a[i] += std::fabs(x * wb[wi]);
              b[i] += std::fabs(x) * w.scale[g] * (w.q[wi] + std::fabs(w.zero[g]));
            }
            exact[i] = static_cast<float>(sum);
          }
        test::DeviceMem dx(xb.size() * 2), dy(want.size() * 2);
        upload(dx, xb);
        CUDA_REQUIRE(cudaMemset(dy.p, 0xff, want.size() * 2));  // NaN
        Int4::matmul(ctx, lw, dx.as<std::uint16_t>(), M, dy.as<std::uint16_t>());
        CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
        const auto got = to_f32(download<std::uint16_t>(dy.p, want.size()));
        const double k24 = 8.0 * static_cast<double>(s.K) * std::ldexp(1.0, -24);
        char what[128];
        std::snprintf(what, sizeof what, "int4 %s%s M=%d N=%lld K=%lld G=%lld", M <= kc::kGemvMaxRows ? "GEMV" : "GEMM",
                      float_zeros ? " (float zeros)" : "", M, static_cast<long long>(s.N), static_cast<long long>(s.K),
                      static_cast<long long>(G));
        INFO(what);
        check_within(got, exact, [&](std::size_t i) { return std::ldexp(std::fabs(static_cast<double>(exact[i])), -8) + k24 * a[i]; },
                     (std::string(what) + ", against its bf16 weights").c_str());
        check_within(got, want, [&](std::size_t i) {
          return std::ldexp(std::fabs(static_cast<double>(want[i])), -8) + std::ldexp(1.0 + std::ldexp(1.0, -8), -7) * b[i] + k24 * b[i];
        }, (std::string(what) + ", against the CPU's Int4").c_str());
      }
    }
  test::DeviceMem d(4096);
  const auto* c = d.as<std::uint8_t>();
  const auto* f = d.as<std::uint32_t>();
  const auto* x = d.as<std::uint16_t>();
  auto* y = d.as<std::uint16_t>();
  CHECK_FALSE(kc::int4_shape_supported(48, 16));
  CHECK_FALSE(kc::int4_shape_supported(96, 64));
  CHECK_THROWS_AS(kc::int4_gemv(c, f, 16, x, 1, 4, 48, y, stream.s), InvalidArgument);
  CHECK_THROWS_AS(kc::int4_gemv(c, f, 32, x, 9, 4, 64, y, stream.s), InvalidArgument);
  CHECK_THROWS_AS(kc::int4_gemv(c, f, 32, d.as<std::uint16_t>(4), 1, 4, 64, y, stream.s), InvalidArgument);
  CHECK_THROWS_AS(kc::dequantize_int4_bf16(c, f, 64, 4, 96, y, stream.s), InvalidArgument);
}

TEST_CASE("Int4 on cuda loads GPTQ and AWQ checkpoints as the CPU reads them, and refuses act-order by name",
          "[cuda][int4][model]") {
  // The checkpoint route of Int4::load<cuda>: the CPU's loader decodes the packing, pack_for_cuda lays it out.
  // tiny_llama's layers (support/tiny_checkpoint.hpp) packed in groups of 32 (support/int4_checkpoint.hpp).
  Stream stream;
  for (const Packing packing : {Packing::gptq, Packing::awq, Packing::gptq_act_order}) {
    const std::string tag = packing == Packing::awq ? "awq" : packing == Packing::gptq ? "gptq" : "gptq-act-order";
    INFO(tag);
    const auto dir = rewrite_tiny_llama("infer-cuda-int4-" + tag, [&](const std::string& n, const std::vector<float>& w,
                                                                     std::int64_t out, std::int64_t in) {
      return packed_entries(n, w, out, in, packing);
    });
    const ModelSource src = ModelSource::open(dir);
    const ModelConfig& c = src.config();
    const LinearRequest r{src, "blk.1.ffn_down", c.hidden_size, c.intermediate_size};
    CudaWeightStore measuring;
    if (packing == Packing::gptq_act_order) {
      CHECK_THROWS_WITH(Int4::load<cuda>(r, measuring), Catch::Contains("blk.1.ffn_down") && Catch::Contains("act-order"));
      continue;
    }
    (void)Int4::load<cuda>(r, measuring);
    CudaWeightStore store(measuring.measured_bytes(), stream.s);
    const Int4::linear<cuda> l = Int4::load<cuda>(r, store);
    store.finish();
    REQUIRE(l.consistent());
    CHECK(l.group_size == 32);
    const PackedInt4 want(Int4::load<cpu>(r));
    CHECK(download<std::uint32_t>(l.codes, want.words.size()) == want.words);
    CHECK(download<std::uint32_t>(l.scale_min, want.scale_min.size()) == want.scale_min);
  }
}
