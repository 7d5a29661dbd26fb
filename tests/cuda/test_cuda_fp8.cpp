// FP8 (e4m3) linear kernels (kernels/cuda/fp8_linear.cu) against the CPU's Fp8 (quant/fp8.hpp) on the same
// inputs, from printed seeds (support/test_seed.hpp); outputs poisoned with NaN first.
//
// quantize_rows_e4m3 must give the CPU's codes and scales bit for bit: the same f32 division and the same
// rounding (f32_to_e4m3 is the GPU's cvt.rn.satfinite by definition).
//
// fp8_gemv against Fp8::matmul on the same codes (x quantized by the CPU from the same bf16 values), per
// element, with A = Σ_k |x̂_mk·ŵ_nk| (x̂, ŵ the decoded, scaled values):
//   |got − ref| ≤ 2^-8·|ref| + 2·2·K·2^-24·A
// 2^-8: the bf16 output's rounding (8 significant bits, to nearest: at most 2^-8 of the value). Each product of two e4m3 codes is exact in
// f32; the CPU multiplies pre-scaled values (two more roundings per term, 2^-24 each) and both sides sum K
// f32 terms in different orders (≤ K·2^-24·A each): 2·K·2^-24·A, doubled for the scaling. Its tensor-core
// kernel (the default; INFER_FP8_GEMV=cuda_cores picks the other) adds 2^-13·A: Hopper's FP8 tensor cores add with ~14 significant bits
// (DeepSeek-V3's report, §3.3.2) within each k-step of 64 products, which the kernel then adds in f32, so
// the sum carries up to ~2^-14·A more; doubled for slack. Both paths are checked.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/fp8.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/quant/fp8.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

/// Rows of bf16 values at very different magnitudes: N(0, 1), tiny (most codes subnormal), huge (near
/// bf16's and f32's large values), a single outlier over small values, and all zeros.
std::vector<std::uint16_t> awkward_rows(std::int64_t rows, std::int64_t K, std::mt19937& rng) {
  std::vector<std::uint16_t> v;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float scale[] = {1.0f, 1e-6f, 1e30f, 1e-3f, 0.0f};
    auto row = random_bf16(static_cast<std::size_t>(K), rng, scale[r % 5]);
    if (r % 5 == 3) row[static_cast<std::size_t>(K / 2)] = f32_to_bf16(1000.0f);
    v.insert(v.end(), row.begin(), row.end());
  }
  return v;
}

/// M rows of K values quantized by the CPU (Fp8::quantize_row): codes [M][K] and one scale per row.
struct QuantizedRows {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  QuantizedRows(const std::vector<float>& x, int M, std::int64_t K) : codes(x.size()), scales(static_cast<std::size_t>(M)) {
    for (int m = 0; m < M; ++m)
      scales[static_cast<std::size_t>(m)] = Fp8::quantize_row(
          std::span(x).subspan(static_cast<std::size_t>(m * K), static_cast<std::size_t>(K)), codes.data() + m * K);
  }
};

}  // namespace

TEST_CASE("cuda::quantize_rows_e4m3 gives Fp8::quantize_row's codes and scales bit for bit", "[cuda][fp8]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::mt19937 rng(test_seed("cuda::quantize_rows_e4m3"));
  for (const std::int64_t K : {1, 16, 1000, 4096, 14336}) {
    const std::int64_t rows = 10;
    INFO("K=" << K);
    const auto xb = awkward_rows(rows, K, rng);
    const auto xf = to_f32(xb);
    std::vector<std::uint8_t> want_q(xf.size());
    std::vector<float> want_s(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r)
      want_s[static_cast<std::size_t>(r)] = Fp8::quantize_row(
          std::span(xf).subspan(static_cast<std::size_t>(r * K), static_cast<std::size_t>(K)), want_q.data() + r * K);
    test::DeviceMem dxb(xb.size() * 2), dxf(xf.size() * 4), dq(xf.size()), ds(want_s.size() * 4);
    upload(dxb, xb);
    upload(dxf, xf);
    for (const bool from_f32 : {false, true}) {
      INFO((from_f32 ? "f32 input" : "bf16 input"));
      CUDA_REQUIRE(cudaMemset(dq.p, 0xaa, xf.size()));
      CUDA_REQUIRE(cudaMemset(ds.p, 0xff, want_s.size() * 4));  // NaN
      if (from_f32) kc::quantize_rows_e4m3(dxf.as<float>(), rows, K, dq.as<std::uint8_t>(), ds.as<float>(), stream);
      else kc::quantize_rows_e4m3(dxb.as<std::uint16_t>(), rows, K, dq.as<std::uint8_t>(), ds.as<float>(), stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto got_q = download<std::uint8_t>(dq.p, xf.size());
      const auto got_s = download<float>(ds.p, want_s.size());
      int bad = 0;
      for (std::size_t i = 0; i < want_s.size(); ++i)
        if (std::memcmp(&got_s[i], &want_s[i], 4) != 0 && ++bad <= 5)
          FAIL_CHECK("row " << i << ": scale " << got_s[i] << ", the CPU's " << want_s[i]);
      for (std::size_t i = 0; i < want_q.size(); ++i)
        if (got_q[i] != want_q[i] && ++bad <= 5)
          FAIL_CHECK("value " << i << " (" << xf[i] << "): code " << int{got_q[i]} << ", the CPU's " << int{want_q[i]});
      CHECK(bad == 0);
    }
  }
  SECTION("bad arguments are refused") {
    test::DeviceMem d(64);
    CHECK_THROWS_AS(kc::quantize_rows_e4m3(d.as<float>(), -1, 16, d.as<std::uint8_t>(), d.as<float>(), stream),
                    InvalidArgument);
    CHECK_THROWS_AS(kc::quantize_rows_e4m3(d.as<float>(), 1, 0, d.as<std::uint8_t>(), d.as<float>(), stream),
                    InvalidArgument);
    CHECK_THROWS_AS(kc::quantize_rows_e4m3(d.as<float>(), 1, 16, nullptr, d.as<float>(), stream), InvalidArgument);
    CHECK_NOTHROW(kc::quantize_rows_e4m3(d.as<float>(), 0, 16, nullptr, nullptr, stream));
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::fp8_gemv matches Fp8::matmul on the same codes for M = 1..8", "[cuda][fp8]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  struct Shape {
    std::int64_t N, K;
  };
  // The split across warps (gemv_split.cuh): 1 for {333, 1008} (63 chunks of 16), 2 for {1000, 4096} (256
  // chunks), 4 for {64, 14336} and {77, 8192}; N odd and off the 2-row group, K ragged against the unroll.
  const Shape shapes[] = {{1, 16}, {3, 64}, {333, 1008}, {1000, 4096}, {64, 14336}, {77, 8192}};
  // The tensor-core kernel also with its first weights copied before the chained wait (early copies).
  std::mt19937 rng(test_seed("cuda::fp8_gemv"));
  for (const int early : {0, 1})
  for (const auto path : {kc::Fp8GemvPath::tensor_cores, kc::Fp8GemvPath::cuda_cores})
  for (const Shape& s : shapes) {
    const bool tensor_cores = path == kc::Fp8GemvPath::tensor_cores;
    if (early && !tensor_cores) continue;
    kc::set_fp8_gemv_path(path);
    kc::set_tensor_core_gemv_early_copies(early);
    std::vector<float> wf(static_cast<std::size_t>(s.N * s.K));
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (auto& v : wf) v = d(rng);
    const Fp8::linear<cpu> w = Fp8::quantize(wf, s.N, s.K);
    test::DeviceMem dwq(w.q.size()), dws(w.scale.size() * 4);
    upload(dwq, w.q);
    upload(dws, w.scale);
    double worst = 0;
    for (int M = 1; M <= kc::kGemvMaxRows; ++M) {
      INFO((tensor_cores ? "tensor cores" : "CUDA cores") << (early ? ", early copies" : "") << ", M=" << M
                                                         << " N=" << s.N << " K=" << s.K);
      const auto xf = to_f32(random_bf16(static_cast<std::size_t>(M * s.K), rng));
      const QuantizedRows qx(xf, M, s.K);
      const std::vector<std::uint8_t>& xq = qx.codes;
      const std::vector<float>& xs = qx.scales;
      std::vector<float> want(static_cast<std::size_t>(M * s.N));
      Fp8::matmul(cpu{}, w, xf.data(), M, want.data());
      test::DeviceMem dxq(xq.size()), dxs(xs.size() * 4), dy(want.size() * 2);
      upload(dxq, xq);
      upload(dxs, xs);
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, want.size() * 2));  // NaN
      kc::fp8_gemv(dwq.as<std::uint8_t>(), dws.as<float>(), dxq.as<std::uint8_t>(), dxs.as<float>(), M, s.N, s.K,
                   dy.as<std::uint16_t>(), stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto got = to_f32(download<std::uint16_t>(dy.p, want.size()));
      const auto& table = e4m3_table();
      std::vector<double> xa(xq.size());  // |x̂|
      for (std::size_t i = 0; i < xq.size(); ++i)
        xa[i] = std::fabs(static_cast<double>(table[xq[i]]) * xs[i / static_cast<std::size_t>(s.K)]);
      int bad = 0;
      for (int m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < s.N; ++n) {
          double a = 0;
          const double sw = w.scale[static_cast<std::size_t>(n)];
          for (std::int64_t k = 0; k < s.K; ++k)
            a += xa[static_cast<std::size_t>(m * s.K + k)] * std::fabs(table[w.q[static_cast<std::size_t>(n * s.K + k)]] * sw);
          const std::size_t i = static_cast<std::size_t>(m * s.N + n);
          const double bound = std::ldexp(std::fabs(static_cast<double>(want[i])), -8) +
                               4.0 * static_cast<double>(s.K) * std::ldexp(1.0, -24) * a +
                               (tensor_cores ? std::ldexp(a, -13) : 0.0) + 1e-30;
          const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
          if (err <= bound) worst = std::max(worst, err / bound);
          else if (++bad <= 5) FAIL_CHECK("y[" << m << "][" << n << "] = " << got[i] << ", want " << want[i] << " ± " << bound);
        }
      CHECK(bad == 0);
    }
    std::printf("  fp8_gemv (%s) N=%lld K=%lld: worst error / bound %.3g\n", tensor_cores ? "tensor cores" : "CUDA cores",
                static_cast<long long>(s.N), static_cast<long long>(s.K), worst);
  }
  kc::set_fp8_gemv_path(kc::Fp8GemvPath::automatic);
  kc::set_tensor_core_gemv_early_copies(-1);
  SECTION("operands it cannot take are refused, not miscomputed") {
    test::DeviceMem d(4096);
    const auto* q = d.as<std::uint8_t>();
    const auto* f = d.as<float>();
    auto* y = d.as<std::uint16_t>();
    CHECK_FALSE(kc::fp8_gemv_supports(q, q, 24));
    CHECK_FALSE(kc::fp8_gemv_supports(d.as<std::uint8_t>(8), q, 32));
    CHECK_THROWS_AS(kc::fp8_gemv(q, f, q, f, 1, 4, 24, y, stream), InvalidArgument);
    CHECK_THROWS_AS(kc::fp8_gemv(q, f, q, f, 9, 4, 32, y, stream), InvalidArgument);
    CHECK_THROWS_AS(kc::fp8_gemv(q, f, q, f, 0, 4, 32, y, stream), InvalidArgument);
    CHECK_THROWS_AS(kc::fp8_gemv(q, nullptr, q, f, 1, 4, 32, y, stream), InvalidArgument);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::Gemm::run_e4m3 (cuBLASLt FP8, per-row scales) matches Fp8::matmul", "[cuda][fp8]") {
  // The prefill / large-batch path of Fp8 on the GPU. Bound per element as fp8_gemv's (file comment), with
  // two changes. The output is rounded to bf16 twice (the unscaled sums cuBLASLt writes, then the scaled
  // values: run_e4m3's comment), so 2^-7·|ref| instead of 2^-8 (≤ 2^-8 each). And
  // 2^-13·A: Hopper's FP8 tensor cores accumulate with ~14 significant bits (DeepSeek-V3's report, §3.3.2)
  // between cuBLASLt's promotions to f32 (fast accumulation is left off), so each promoted partial sum
  // carries up to ~2^-14 of its terms' absolute sum; doubled for slack.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  kc::Gemm gemm;
  struct Shape {
    std::int64_t M, N, K;
  };
  const Shape shapes[] = {{9, 1024, 4096}, {64, 1000, 1024}, {200, 1024, 4096}, {33, 4096, 1024}};
  std::mt19937 rng(test_seed("cuda::Gemm::run_e4m3"));
  const auto& table = e4m3_table();
  for (const Shape& s : shapes) {
    INFO("M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::vector<float> wf(static_cast<std::size_t>(s.N * s.K));
    std::normal_distribution<float> d(0.0f, 0.02f);
    for (auto& v : wf) v = d(rng);
    const Fp8::linear<cpu> w = Fp8::quantize(wf, s.N, s.K);
    const auto xb = random_bf16(static_cast<std::size_t>(s.M * s.K), rng);
    const auto xf = to_f32(xb);
    std::vector<float> want(static_cast<std::size_t>(s.M * s.N));
    Fp8::matmul(cpu{}, w, xf.data(), static_cast<std::int32_t>(s.M), want.data());
    // x quantized on the GPU (its codes are the CPU's: the test above), W's codes from the CPU.
    test::DeviceMem dwq(w.q.size()), dws(w.scale.size() * 4), dx(xb.size() * 2), dxq(xf.size()),
        dxs(static_cast<std::size_t>(s.M) * 4), dy(want.size() * 2);
    upload(dwq, w.q);
    upload(dws, w.scale);
    upload(dx, xb);
    CUDA_REQUIRE(cudaMemset(dy.p, 0xff, want.size() * 2));  // NaN
    kc::quantize_rows_e4m3(dx.as<std::uint16_t>(), s.M, s.K, dxq.as<std::uint8_t>(), dxs.as<float>(), stream);
    gemm.run_e4m3(dxq.as<std::uint8_t>(), dxs.as<float>(), dwq.as<std::uint8_t>(), dws.as<float>(), dy.as<std::uint16_t>(),
                  s.M, s.N, s.K, stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const auto got = to_f32(download<std::uint16_t>(dy.p, want.size()));
    const auto xq = download<std::uint8_t>(dxq.p, xf.size());
    const auto xs = download<float>(dxs.p, static_cast<std::size_t>(s.M));
    int bad = 0;
    double worst = 0;
    for (std::int64_t m = 0; m < s.M; ++m)
      for (std::int64_t n = 0; n < s.N; ++n) {
        double a = 0;
        for (std::int64_t k = 0; k < s.K; ++k)
          a += std::fabs(static_cast<double>(table[xq[static_cast<std::size_t>(m * s.K + k)]]) *
                         table[w.q[static_cast<std::size_t>(n * s.K + k)]]);
        a *= static_cast<double>(xs[static_cast<std::size_t>(m)]) * w.scale[static_cast<std::size_t>(n)];
        const std::size_t i = static_cast<std::size_t>(m * s.N + n);
        const double bound = std::ldexp(std::fabs(static_cast<double>(want[i])), -7) +
                             (std::ldexp(1.0, -13) + 4.0 * static_cast<double>(s.K) * std::ldexp(1.0, -24)) * a + 1e-30;
        const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
        if (err <= bound) worst = std::max(worst, err / bound);
        else if (++bad <= 5) FAIL_CHECK("y[" << m << "][" << n << "] = " << got[i] << ", want " << want[i] << " ± " << bound);
      }
    CHECK(bad == 0);
    std::printf("  run_e4m3 M=%lld N=%lld K=%lld: worst error / bound %.3g\n", static_cast<long long>(s.M),
                static_cast<long long>(s.N), static_cast<long long>(s.K), worst);
  }
  SECTION("shapes and operands it cannot take are refused") {
    test::DeviceMem d(4096);
    const auto* q = d.as<std::uint8_t>();
    const auto* f = d.as<float>();
    auto* y = d.as<std::uint16_t>();
    CHECK_THROWS_AS(gemm.run_e4m3(q, f, q, f, y, 16, 16, 24, stream), InvalidArgument);  // K not a multiple of 16
    CHECK_THROWS_AS(gemm.run_e4m3(d.as<std::uint8_t>(8), f, q, f, y, 16, 16, 32, stream), InvalidArgument);
    CHECK_THROWS_AS(gemm.run_e4m3(q, nullptr, q, f, y, 16, 16, 32, stream), InvalidArgument);
    CHECK_NOTHROW(gemm.run_e4m3(q, f, q, f, y, 0, 16, 32, stream));
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}
