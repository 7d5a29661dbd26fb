// Linear layers on the GPU (kernels/cuda/gemm.cu, gguf_gemv.cu) against the CPU reference
// cpu::gemm_xwt in f32 on the very same inputs (bf16 x and W as floats; GGUF W through cpu::dequantize,
// rounded to bf16 where the GPU path rounds it). Inputs are random values from printed seeds
// (support/test_seed.hpp); outputs are poisoned with NaN first, so an element never written fails.
//
// Error bound, per element, with A = Σ_k |x_mk·w_nk| (the same GEMM on absolute values):
//   |got − ref| ≤ 2^-8·|ref| + c·K·2^-24·A
// 2^-8: a bf16 output carries ≤ 2^-9 relative rounding error (doubled for slack; f32 outputs use 2^-20).
// K·2^-24·A: the worst-case f32 accumulation error of a K-term sum, for each of GPU and CPU, whose
// summation orders differ; c = 2 for the GEMMs. The GGUF GEMV quantizes x to int8 per 32 values, so its
// reference is the same quantization and integer dot products run on the CPU (quant/gguf_dot.hpp's
// functions, which a CI test pins against dequantization): per segment they may differ from the GPU's only
// by rounding (FMA contraction), and the segments' f32 sum by its order, so c = 8 with A = Σ over segments
// of the magnitudes segment_dot rounds (its scaled integer sums and min term) and of the products |w·x|.
// The worst error / bound of each check is printed, so a run shows how much room each bound leaves.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/gguf_dot.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& f : v) f = bf16_to_f32(f32_to_bf16(f));
  return v;
}

std::vector<float> abs_of(std::vector<float> v) {
  for (auto& f : v) f = std::fabs(f);
  return v;
}

struct Reference {
  std::vector<float> y, abs_y;  // x·wᵀ and |x|·|w|ᵀ, [M][N]
};

Reference reference(const std::vector<float>& x, const std::vector<float>& w, std::int64_t M, std::int64_t N,
                    std::int64_t K) {
  Reference r{std::vector<float>(static_cast<std::size_t>(M * N)), std::vector<float>(static_cast<std::size_t>(M * N))};
  kernels::cpu::gemm_xwt(x.data(), w.data(), r.y.data(), M, N, K);
  const auto ax = abs_of(x), aw = abs_of(w);
  kernels::cpu::gemm_xwt(ax.data(), aw.data(), r.abs_y.data(), M, N, K);
  return r;
}

/// Checks the bound of the file comment; `rel` is 2^-8 for bf16 outputs, `c` the accumulation factor.
void check_close(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& abs_ref,
                 std::int64_t K, double rel, double c) {
  REQUIRE(got.size() == ref.size());
  const double acc = c * static_cast<double>(K) * std::ldexp(1.0, -24);
  int bad = 0;
  double err2 = 0, ref2 = 0, worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double bound = rel * std::fabs(ref[i]) + acc * abs_ref[i] + 1e-30;
    if (d <= bound) worst = std::max(worst, d / bound);
    if (!(d <= bound) && ++bad <= 5) FAIL_CHECK("element " << i << ": got " << got[i] << ", want " << ref[i] << " ± " << bound);
    err2 += std::isfinite(d) ? d * d : 1e30;
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  CHECK(bad == 0);
  std::printf("  worst error / bound %.3g, relative Frobenius error %.3g\n", worst, std::sqrt(err2 / std::max(ref2, 1e-30)));
}

const DType kGemvTypes[] = {DType::q8_0, DType::q4_0, DType::q4_1,  DType::q5_0,   DType::q5_1,
                            DType::q4_k, DType::q5_k, DType::q6_k, DType::iq4_nl, DType::iq4_xs};

/// What gguf_gemv computes, on the CPU: x (bf16 values) quantized per 32 by quant::quantize_q8_block, each
/// weight segment's integer dot product by quant::segment_dot, summed in double; abs_y sums each segment's
/// |contribution| and the magnitudes of its products (A of the file comment).
template <DType T>
Reference q8_reference_of(const std::vector<std::byte>& blocks, const std::vector<float>& x, std::int64_t M,
                          std::int64_t N, std::int64_t K) {
  namespace q = infer::quant;
  const auto xblocks = static_cast<std::size_t>(K / q::kQ8Block);
  std::vector<std::int8_t> xq(static_cast<std::size_t>(M * K));
  std::vector<q::Q8Scale> xs(static_cast<std::size_t>(M) * xblocks);
  for (std::size_t b = 0; b < xs.size(); ++b) xs[b] = q::quantize_q8_block(x.data() + b * q::kQ8Block, xq.data() + b * q::kQ8Block);
  std::vector<float> wf(static_cast<std::size_t>(N * K));
  kernels::cpu::dequantize(T, blocks, wf);
  const auto bb = static_cast<std::size_t>(info(T).block_bytes);
  const auto be = static_cast<std::size_t>(info(T).block_elems);
  const auto* w = reinterpret_cast<const std::uint8_t*>(blocks.data());
  Reference r{std::vector<float>(static_cast<std::size_t>(M * N)), std::vector<float>(static_cast<std::size_t>(M * N))};
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m) {
      double y = 0, a = 0;
      for (std::size_t seg = 0; seg < xblocks; ++seg) {
        const std::size_t blk = static_cast<std::size_t>(n) * (static_cast<std::size_t>(K) / be) + seg * q::kQ8Block / be;
        q::SegCodes g;
        q::decode_segment<T>(w + blk * bb, static_cast<int>(seg % (be / q::kQ8Block)), g);
        const std::size_t xb = static_cast<std::size_t>(m) * xblocks + seg;
        std::uint32_t xw[8];
        std::memcpy(xw, xq.data() + xb * q::kQ8Block, 32);
        const float c = q::segment_dot<T>(g, xw, xs[xb]);
        y += c;
        // The floats segment_dot rounds: the scaled integer sums of each half and the min term, which for
        // formats with a min can be far larger than Σ |w·x| when they cancel (a·q ≈ −b).
        using F = q::DotFormat<T>;
        int lo = 0, hi = 0;
        for (int i = 0; i < 4; ++i) lo = q::dot4(g.q[i], xw[i], lo);
        for (int i = 4; i < 8; ++i) hi = q::dot4(g.q[i], xw[i], hi);
        const double slo = xs[xb].sum_lo, shi = xs[xb].sum_hi;
        a += xs[xb].d * (std::fabs(g.a0 * (lo - F::off * slo)) + std::fabs(g.a1 * (hi - F::off * shi)) +
                         std::fabs(g.b * (slo + shi)));
        for (std::size_t l = 0; l < q::kQ8Block; ++l)
          a += std::fabs(static_cast<double>(wf[static_cast<std::size_t>(n * K) + seg * q::kQ8Block + l]) * xs[xb].d *
                         xq[xb * q::kQ8Block + l]);
      }
      r.y[static_cast<std::size_t>(m * N + n)] = static_cast<float>(y);
      r.abs_y[static_cast<std::size_t>(m * N + n)] = static_cast<float>(a);
    }
  return r;
}

Reference q8_reference(DType t, const std::vector<std::byte>& blocks, const std::vector<float>& x, std::int64_t M,
                       std::int64_t N, std::int64_t K) {
  switch (t) {
    case DType::q8_0: return q8_reference_of<DType::q8_0>(blocks, x, M, N, K);
    case DType::q4_0: return q8_reference_of<DType::q4_0>(blocks, x, M, N, K);
    case DType::q4_1: return q8_reference_of<DType::q4_1>(blocks, x, M, N, K);
    case DType::q5_0: return q8_reference_of<DType::q5_0>(blocks, x, M, N, K);
    case DType::q5_1: return q8_reference_of<DType::q5_1>(blocks, x, M, N, K);
    case DType::q4_k: return q8_reference_of<DType::q4_k>(blocks, x, M, N, K);
    case DType::q5_k: return q8_reference_of<DType::q5_k>(blocks, x, M, N, K);
    case DType::q6_k: return q8_reference_of<DType::q6_k>(blocks, x, M, N, K);
    case DType::iq4_nl: return q8_reference_of<DType::iq4_nl>(blocks, x, M, N, K);
    case DType::iq4_xs: return q8_reference_of<DType::iq4_xs>(blocks, x, M, N, K);
    default: FAIL("no q8 reference for " << name(t)); return {};
  }
}

}  // namespace

TEST_CASE("cuda::Gemm bf16 -> bf16 matches gemm_xwt", "[cuda][gemm]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  kc::Gemm gemm;
  struct Shape {
    std::int64_t M, N, K;
  };
  // M = 1..8 and 100+; N, K off every tile size (odd K: rows only 2-byte aligned).
  const Shape shapes[] = {{1, 64, 256},  {2, 333, 77},  {3, 1000, 1000}, {4, 17, 8},    {5, 128, 129},
                          {6, 1, 512},   {7, 255, 300}, {8, 2048, 512},  {100, 333, 77}, {128, 1000, 1000},
                          {257, 130, 64}};
  std::uint32_t seed = test_seed("cuda::Gemm bf16 -> bf16");
  for (const Shape& s : shapes) {
    for (std::size_t shift : {0, 1}) {  // shift: every pointer one element off its 256-byte alignment
      ++seed;
      INFO("M=" << s.M << " N=" << s.N << " K=" << s.K << " pointer shift " << shift << " seed " << seed);
      std::mt19937 rng(seed);
      const auto xb = random_bf16(static_cast<std::size_t>(s.M * s.K), rng);
      const auto wb = random_bf16(static_cast<std::size_t>(s.N * s.K), rng);
      const Reference r = reference(to_f32(xb), to_f32(wb), s.M, s.N, s.K);
      test::DeviceMem dx((xb.size() + shift) * 2), dw((wb.size() + shift) * 2), dy((r.y.size() + shift) * 2);
      CUDA_REQUIRE(cudaMemcpy(dx.as<std::uint16_t>(2 * shift), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemcpy(dw.as<std::uint16_t>(2 * shift), wb.data(), wb.size() * 2, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, (r.y.size() + shift) * 2));  // 0xffff: bf16 NaN
      gemm.run(dx.as<std::uint16_t>(2 * shift), dw.as<std::uint16_t>(2 * shift), dy.as<std::uint16_t>(2 * shift), s.M,
               s.N, s.K, stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto got = to_f32(download<std::uint16_t>(dy.as<std::uint16_t>(2 * shift), r.y.size()));
      check_close(got, r.y, r.abs_y, s.K, std::ldexp(1.0, -8), 2.0);
    }
  }
  // One plan per distinct (shape, alignment); a repeated call reuses it.
  const std::size_t plans = gemm.cached_plans();
  CHECK(plans == 2 * std::size(shapes));
  {
    test::DeviceMem dx(2 * 64), dw(2 * 64 * 256), dy(2 * 64);
    gemm.run(dx.as<std::uint16_t>(), dw.as<std::uint16_t>(), dy.as<std::uint16_t>(), 0, 64, 256, stream);  // M = 0: no-op
    CHECK(gemm.cached_plans() == plans);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

struct GemmShape {
  std::int64_t M, N, K;
};

/// Runs `gemm` on each shape in turn (fresh random operands; each shape's first call is where it is tuned) and
/// checks every product against the CPU; then the tuned buckets and the plans made.
void check_tuned_products(kc::Gemm& gemm, std::span<const GemmShape> shapes, const char* seed_name,
                          std::size_t buckets) {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::uint32_t seed = test_seed(seed_name);
  for (const GemmShape& s : shapes) {
    INFO("M=" << s.M << " N=" << s.N << " K=" << s.K);
    std::mt19937 rng(++seed);
    const auto xb = random_bf16(static_cast<std::size_t>(s.M * s.K), rng);
    const auto wb = random_bf16(static_cast<std::size_t>(s.N * s.K), rng);
    const Reference r = reference(to_f32(xb), to_f32(wb), s.M, s.N, s.K);
    test::DeviceMem dx(xb.size() * 2), dw(wb.size() * 2), dy(r.y.size() * 2);
    upload(dx.p, xb);
    upload(dw.p, wb);
    CUDA_REQUIRE(cudaMemset(dy.p, 0xff, r.y.size() * 2));
    gemm.run(dx.as<std::uint16_t>(), dw.as<std::uint16_t>(), dy.as<std::uint16_t>(), s.M, s.N, s.K, stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    check_close(to_f32(download<std::uint16_t>(dy.p, r.y.size())), r.y, r.abs_y, s.K, std::ldexp(1.0, -8), 2.0);
  }
  CHECK(gemm.tuned_buckets() == buckets);
  CHECK(gemm.cached_plans() == shapes.size());
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::Gemm GemmTuning::measured: one timed pick per M bucket, every pick computes the product",
          "[cuda][gemm]") {
  kc::Gemm gemm(kc::Gemm::kDefaultWorkspaceBytes, kc::GemmTuning::measured);
  // 300 and 400 share bucket 512 (the second reuses the first's pick), 64 is the smallest tuned M; 2000
  // is past kTunedMaxRows, 8 below kTunedMinRows and 100 x 64 x 64 below kTunedMinFlops (heuristic only).
  const GemmShape shapes[] = {{300, 4096, 2048}, {400, 4096, 2048}, {64, 8000, 4000},
                              {2000, 256, 256},  {8, 1024, 512},    {100, 64, 64}};
  check_tuned_products(gemm, shapes, "cuda::Gemm tuning", 2);
}

TEST_CASE("cuda::Gemm GemmTuning::measured_at_cap: prefill-sized M timed at the power cap, the pick computes the "
          "product", "[cuda][gemm]") {
  kc::Gemm gemm(kc::Gemm::kDefaultWorkspaceBytes, kc::GemmTuning::measured_at_cap);
  // 2048 x 4096 x 4096 (69 GFLOP) is timed; 1600 shares its bucket (52 GFLOP, the pick reused where cuBLASLt
  // takes it); 2048 x 256 x 256 is under kSustainedMinFlops (the heuristic's).
  const GemmShape shapes[] = {{2048, 4096, 4096}, {1600, 4096, 4096}, {2048, 256, 256}};
  check_tuned_products(gemm, shapes, "cuda::Gemm tuning at the cap", 1);
}

TEST_CASE("cuda::Gemm picks tuned ahead travel as text: another Gemm takes them and computes the same bits",
          "[cuda][gemm]") {
  // What infer-build does (tune, write measured_algorithms into the engine file) and what loading the file
  // does (adopt_measured_algorithms): the adopting Gemm times nothing and multiplies with the same algorithms.
  using Catch::Contains;
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  kc::Gemm built;
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{4096, 2048}, {1024, 512}};
  built.tune(shapes, stream);
  // 4096 x 2048 is timed at M = 256..1024 (kTunedMinFlops), 1024 x 512 at none.
  CHECK(built.tuned_buckets() == 3);
  const auto picks = built.measured_algorithms();
  REQUIRE(picks.size() == 4);  // the three buckets and the cuBLASLt version
  CHECK(picks.count("cublaslt") == 1);
  CHECK(picks.count("bf16 m512 n4096 k2048 bf16 a256/256/256 ldy0") == 1);

  kc::Gemm loaded;
  CHECK(loaded.adopt_measured_algorithms(picks) == 3);
  CHECK(loaded.tuned_buckets() == 3);
  std::mt19937 rng(test_seed("cuda::Gemm adopted picks"));
  for (const std::int64_t M : {300, 512, 1000}) {
    INFO("M=" << M);
    const std::int64_t N = 4096, K = 2048;
    const auto xb = random_bf16(static_cast<std::size_t>(M * K), rng);
    const auto wb = random_bf16(static_cast<std::size_t>(N * K), rng);
    test::DeviceMem dx(xb.size() * 2), dw(wb.size() * 2), y1(static_cast<std::size_t>(M * N) * 2),
        y2(static_cast<std::size_t>(M * N) * 2);
    upload(dx.p, xb);
    upload(dw.p, wb);
    built.run(dx.as<std::uint16_t>(), dw.as<std::uint16_t>(), y1.as<std::uint16_t>(), M, N, K, stream);
    loaded.run(dx.as<std::uint16_t>(), dw.as<std::uint16_t>(), y2.as<std::uint16_t>(), M, N, K, stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(download<std::uint16_t>(y1.p, static_cast<std::size_t>(M * N)) ==
          download<std::uint16_t>(y2.p, static_cast<std::size_t>(M * N)));
  }
  CHECK(loaded.tuned_buckets() == 3);  // nothing timed: every bucket came with the picks

  kc::Gemm other;
  auto from_other_version = picks;
  from_other_version["cublaslt"] = "1";
  CHECK(other.adopt_measured_algorithms(from_other_version) == 0);
  auto bad_key = picks;
  bad_key["bf16 m64 n4096"] = picks.begin()->second;
  CHECK_THROWS_WITH(other.adopt_measured_algorithms(bad_key), Contains("'bf16 m64 n4096'"));
  auto bad_value = picks;
  bad_value["bf16 m512 n4096 k2048 bf16 a256/256/256 ldy0"] = "zz";
  CHECK_THROWS_WITH(other.adopt_measured_algorithms(bad_value), Contains("hex digits"));
  auto no_version = picks;
  no_version.erase("cublaslt");
  CHECK_THROWS_AS(other.adopt_measured_algorithms(no_version), FormatError);
  CHECK(other.tuned_buckets() == 0);  // a refused set takes nothing
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::Gemm bf16 -> f32 with beta accumulates in place", "[cuda][gemm]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  kc::Gemm gemm;
  struct Case {
    std::int64_t M, N, K;
    float beta;
  };
  const Case cases[] = {{1, 576, 1536, 1.0f}, {3, 333, 77, 0.5f}, {8, 1000, 256, 0.0f},
                        {100, 257, 320, 1.0f}, {130, 64, 1000, -2.0f}, {5, 7, 32, 0.0f}};
  std::uint32_t seed = test_seed("cuda::Gemm bf16 -> f32");
  for (const Case& c : cases) {
    ++seed;
    INFO("M=" << c.M << " N=" << c.N << " K=" << c.K << " beta " << c.beta << " seed " << seed);
    std::mt19937 rng(seed);
    const auto xb = random_bf16(static_cast<std::size_t>(c.M * c.K), rng);
    const auto wb = random_bf16(static_cast<std::size_t>(c.N * c.K), rng);
    Reference r = reference(to_f32(xb), to_f32(wb), c.M, c.N, c.K);
    // y0: the residual stream; with beta = 0 it is NaN and must be ignored.
    std::vector<float> y0(r.y.size());
    std::normal_distribution<float> nd(0.0f, 4.0f);
    for (auto& v : y0) v = c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : nd(rng);
    for (std::size_t i = 0; i < y0.size(); ++i) {
      if (c.beta != 0.0f) {
        r.y[i] += c.beta * y0[i];
        r.abs_y[i] += std::fabs(c.beta * y0[i]);
      }
    }
    test::DeviceMem dx(xb.size() * 2), dw(wb.size() * 2), dy(y0.size() * 4);
    upload(dx.p, xb);
    upload(dw.p, wb);
    upload(dy.p, y0);
    gemm.run(dx.as<std::uint16_t>(), dw.as<std::uint16_t>(), dy.as<float>(), c.M, c.N, c.K, c.beta, stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const auto got = download<float>(dy.p, y0.size());
    check_close(got, r.y, r.abs_y, c.K, std::ldexp(1.0, -20), 2.0);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::gguf_gemv matches dequantize + gemm_xwt for every type", "[cuda][gemm]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::uint32_t seed = test_seed("cuda::gguf_gemv");
  for (DType t : kGemvTypes) {
    const std::int64_t be = info(t).block_elems;
    struct Shape {
      std::int64_t N, K;
    };
    // Odd block counts per row (rows off 16-byte alignment), one and several pipeline steps per row,
    // N not a multiple of the 8 warps of a CTA, N large enough that a CTA holds many rows; K = 14,336
    // (Llama-3-8B's down projection) at M = 8 is the most shared memory one launch takes. N = 60,000 at
    // K = 256 gives a CTA more rows than its partial sums hold at once (several chunks); K = 28,672 (70B's
    // down projection) has 8 or more steps a row for Q5_K, Q6_K and Q8_0 (every warp on every row), and at
    // M = 8 two launches of 4 rows of x, 1,200 rows over one CTA an SM (two chunks).
    const Shape shapes[] = {{333, be * (be == 32 ? 67 : 9)}, {7, be},        {5000, 4096},  {61, 14336},
                            {60000, 256},                    {37, 28672},   {1200, 28672}};
    for (const Shape& s : shapes) {
      for (int M = 1; M <= kc::kGemvMaxRows; ++M) {
        if ((s.N == 5000 || s.K == 14336) && M != 1 && M != 3 && M != 8) continue;  // keep the CPU reference quick
        if (s.N == 60000 && M != 1 && M != 4) continue;
        if (s.K == 28672 && (s.N == 37 ? (M != 1 && M != 3) : M != 8)) continue;
        ++seed;
        // Odd M: the weights start 2 bytes past a 16-byte boundary (the kernel's unaligned edges).
        const std::size_t w_shift = (M % 2) ? 2 : 0;
        INFO("type " << name(t) << " M=" << M << " N=" << s.N << " K=" << s.K << " weight shift " << w_shift
                     << " seed " << seed);
        std::mt19937 rng(seed);
        const auto blocks = test::random_tensor(t, static_cast<std::size_t>(s.N * s.K), rng);
        const auto xb = random_bf16(static_cast<std::size_t>(M * s.K), rng);
        const Reference r = q8_reference(t, blocks, to_f32(xb), M, s.N, s.K);

        test::DeviceMem dw(blocks.size() + w_shift), dx(xb.size() * 2), dy(r.y.size() * 2);
        CUDA_REQUIRE(cudaMemcpy(dw.as<std::byte>(w_shift), blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
        upload(dx.p, xb);
        CUDA_REQUIRE(cudaMemset(dy.p, 0xff, r.y.size() * 2));
        kc::gguf_gemv(t, dw.as<std::byte>(w_shift), dx.as<std::uint16_t>(), M, s.N, s.K, dy.as<std::uint16_t>(),
                      stream);
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        const auto got_bits = download<std::uint16_t>(dy.p, r.y.size());
        check_close(to_f32(got_bits), r.y, r.abs_y, s.K, std::ldexp(1.0, -8), 8.0);
        // Partial sums are added in a fixed order: a second call gives the same bits (graph replays and
        // eager runs of a decode step must agree).
        CUDA_REQUIRE(cudaMemset(dy.p, 0xff, r.y.size() * 2));
        kc::gguf_gemv(t, dw.as<std::byte>(w_shift), dx.as<std::uint16_t>(), M, s.N, s.K, dy.as<std::uint16_t>(),
                      stream);
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        CHECK(download<std::uint16_t>(dy.p, r.y.size()) == got_bits);
      }
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::gguf_gemv writes f32 logits and strided columns", "[cuda][gemm]") {
  // The LM head writes f32 rows of a wider logits buffer; stacked parts of different types write their
  // columns of one output (row stride ldy > N). Elements outside the columns must stay untouched.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::uint32_t seed = test_seed("cuda::gguf_gemv strided");
  for (DType t : {DType::q6_k, DType::q8_0, DType::q4_k}) {
    for (int M : {1, 5}) {
      ++seed;
      const std::int64_t N = 301, K = 1024, ldy = N + 13, col = 7;
      INFO("type " << name(t) << " M=" << M << " seed " << seed);
      std::mt19937 rng(seed);
      const auto blocks = test::random_tensor(t, static_cast<std::size_t>(N * K), rng);
      const auto xb = random_bf16(static_cast<std::size_t>(M * K), rng);
      const Reference r = q8_reference(t, blocks, to_f32(xb), M, N, K);
      const auto out = static_cast<std::size_t>(M * ldy);
      test::DeviceMem dw(blocks.size()), dx(xb.size() * 2), df(out * 4), db(out * 2);
      upload(dw.p, blocks);
      upload(dx.p, xb);
      CUDA_REQUIRE(cudaMemset(df.p, 0xff, out * 4));
      CUDA_REQUIRE(cudaMemset(db.p, 0xff, out * 2));
      kc::gguf_gemv(t, dw.p, dx.as<std::uint16_t>(), M, N, K, df.as<float>() + col, stream, ldy);
      kc::gguf_gemv(t, dw.p, dx.as<std::uint16_t>(), M, N, K, db.as<std::uint16_t>() + col, stream, ldy);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto gf = download<float>(df.p, out);
      const auto gb = to_f32(download<std::uint16_t>(db.p, out));
      std::vector<float> f(r.y.size()), b(r.y.size());
      int touched = 0;
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t c = 0; c < ldy; ++c) {
          const auto i = static_cast<std::size_t>(m * ldy + c);
          if (c >= col && c < col + N) {
            f[static_cast<std::size_t>(m * N + c - col)] = gf[i];
            b[static_cast<std::size_t>(m * N + c - col)] = gb[i];
          } else if (!std::isnan(gf[i]) || !std::isnan(gb[i])) {
            ++touched;
          }
        }
      CHECK(touched == 0);
      check_close(f, r.y, r.abs_y, K, std::ldexp(1.0, -20), 8.0);
      check_close(b, r.y, r.abs_y, K, std::ldexp(1.0, -8), 8.0);
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::gguf_mmq matches the integer reference for every type, 9..64 rows", "[cuda][gemm]") {
  // The int8 tensor-core matmul: N off the CTA's 128 rows, K off its 256-value chunks (32-value types), rows
  // off 16-byte alignment, K split over CTAs (N small, K wide), every m16 tile count, f32 and strided outputs.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::uint32_t seed = test_seed("cuda::gguf_mmq");
  for (DType t : kGemvTypes) {
    const std::int64_t be = info(t).block_elems;
    struct Shape {
      std::int64_t N, K;
      int M;
    };
    const Shape shapes[] = {{333, be * (be == 32 ? 67 : 9), 9},  {333, be * (be == 32 ? 67 : 9), 64},
                            {130, be, 17},                      {61, 14336, 33},
                            {1000, 4096, 48},                   {7, 512, 16}};
    for (const Shape& s : shapes) {
      ++seed;
      const std::size_t w_shift = (s.M % 2) ? 2 : 0;
      const bool f32 = s.M == 33 || s.M == 16;
      const std::int64_t ldy = s.M == 48 ? s.N + 5 : s.N;
      INFO("type " << name(t) << " M=" << s.M << " N=" << s.N << " K=" << s.K << " weight shift " << w_shift
                   << (f32 ? " f32" : " bf16") << " ldy " << ldy << " seed " << seed);
      std::mt19937 rng(seed);
      const auto blocks = test::random_tensor(t, static_cast<std::size_t>(s.N * s.K), rng);
      const auto xb = random_bf16(static_cast<std::size_t>(s.M * s.K), rng);
      const Reference r = q8_reference(t, blocks, to_f32(xb), s.M, s.N, s.K);
      const std::size_t ws = kc::gguf_mmq_workspace_bytes(t, s.N, s.K);
      REQUIRE(ws > 0);
      const auto out = static_cast<std::size_t>(s.M * ldy);
      test::DeviceMem dw(blocks.size() + w_shift), dx(xb.size() * 2), dy(out * 4), dws(ws);
      CUDA_REQUIRE(cudaMemcpy(dw.as<std::byte>(w_shift), blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
      upload(dx.p, xb);
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, out * 4));
      CUDA_REQUIRE(cudaMemset(dws.p, 0x7f, ws));  // stale workspace must not matter
      if (f32)
        kc::gguf_mmq(t, dw.as<std::byte>(w_shift), dx.as<std::uint16_t>(), s.M, s.N, s.K, dy.as<float>(), dws.p, ws,
                     stream, ldy);
      else
        kc::gguf_mmq(t, dw.as<std::byte>(w_shift), dx.as<std::uint16_t>(), s.M, s.N, s.K, dy.as<std::uint16_t>(),
                     dws.p, ws, stream, ldy);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      std::vector<float> got(r.y.size());
      int touched = 0;
      const auto gf = download<float>(dy.p, out);
      const auto gb = to_f32(download<std::uint16_t>(dy.p, out));
      for (std::int64_t m = 0; m < s.M; ++m)
        for (std::int64_t c = 0; c < ldy; ++c) {
          const auto i = static_cast<std::size_t>(m * ldy + c);
          const float v = f32 ? gf[i] : gb[i];
          if (c < s.N) got[static_cast<std::size_t>(m * s.N + c)] = v;
          else if (!std::isnan(v)) ++touched;  // the columns past N stay as they were (NaN)
        }
      CHECK(touched == 0);
      check_close(got, r.y, r.abs_y, s.K, f32 ? std::ldexp(1.0, -20) : std::ldexp(1.0, -8), 8.0);
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::gguf_linear at every row count 1..64 for every type", "[cuda][gemm]") {
  // Rows 1..8 take the GEMV, 9..32 the int8 MMA (both on int8 activations: the integer reference), 33..64
  // dequantize + bf16 GEMM (the reference on bf16-rounded weights), and 64 also the MMQ directly. Each row
  // count on fresh random blocks, with the scratch gguf_scratch_elems asks for.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  kc::Gemm gemm;
  std::uint32_t seed = test_seed("cuda::gguf_gemm");
  for (DType t : kGemvTypes) {
    const std::int64_t N = 75, K = info(t).block_elems == 32 ? 32 * 11 : 256 * 2;
    std::printf("  %s, M = 1..64:\n", std::string(name(t)).c_str());
    for (std::int64_t M = 1; M <= 64; ++M) {
      ++seed;
      INFO("type " << name(t) << " M=" << M << " N=" << N << " K=" << K << " seed " << seed);
      std::mt19937 rng(seed);
      const auto blocks = test::random_tensor(t, static_cast<std::size_t>(N * K), rng);
      const auto xb = random_bf16(static_cast<std::size_t>(M * K), rng);
      static_assert(infer::quant::kGgufDotMaxRows == kc::kMmqPreferredRows);
      const bool integer = M <= kc::kMmqPreferredRows;  // the GEMV or the MMQ; above, dequantize + GEMM
      std::vector<float> w(static_cast<std::size_t>(N * K));
      kernels::cpu::dequantize(t, blocks, w);
      const Reference r = integer ? q8_reference(t, blocks, to_f32(xb), M, N, K)
                                  : reference(to_f32(xb), round_bf16(std::move(w)), M, N, K);  // the GEMM's bf16 weights

      const std::size_t scratch_elems = kc::gguf_scratch_elems(t, N, K);
      REQUIRE(scratch_elems >= static_cast<std::size_t>(N * K));
      test::DeviceMem dw(blocks.size()), dx(xb.size() * 2), dy(r.y.size() * 2), scratch(scratch_elems * 2);
      upload(dw.p, blocks);
      upload(dx.p, xb);
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, r.y.size() * 2));
      kc::gguf_linear(gemm, t, dw.p, dx.as<std::uint16_t>(), M, N, K,
                      M <= kc::kGemvMaxRows ? nullptr : scratch.as<std::uint16_t>(), dy.as<std::uint16_t>(), stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto got = to_f32(download<std::uint16_t>(dy.p, r.y.size()));
      check_close(got, r.y, r.abs_y, K, std::ldexp(1.0, -8), integer ? 8.0 : 2.0);
      if (M == 64) {  // the MMQ takes 64 rows too, where the decoder prefers the GEMM
        const Reference rq = q8_reference(t, blocks, to_f32(xb), M, N, K);
        const std::size_t ws = kc::gguf_mmq_workspace_bytes(t, N, K);
        test::DeviceMem dws(ws);
        CUDA_REQUIRE(cudaMemset(dy.p, 0xff, r.y.size() * 2));
        kc::gguf_mmq(t, dw.p, dx.as<std::uint16_t>(), static_cast<int>(M), N, K, dy.as<std::uint16_t>(), dws.p, ws,
                     stream);
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        check_close(to_f32(download<std::uint16_t>(dy.p, rq.y.size())), rq.y, rq.abs_y, K, std::ldexp(1.0, -8), 8.0);
      }
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda linear layers reject bad arguments", "[cuda][gemm]") {
  test::DeviceMem w(1 << 16), x(1 << 16), y(1 << 16);
  const auto* xp = x.as<std::uint16_t>();
  auto* yp = y.as<std::uint16_t>();
  using Catch::Contains;
  // gguf_gemv
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q4_k, w.p, xp, 9, 16, 256, yp, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q4_k, w.p, xp, 9, 16, 256, yp, nullptr), Contains("M = 9") && Contains("gguf_gemm"));
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q4_k, w.p, xp, 0, 16, 256, yp, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q4_k, w.p, xp, 1, 16, 100, yp, nullptr), Contains("K=100") && Contains("256"));
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q8_0, w.p, xp, 1, 16, 48, yp, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q8_0, w.p, xp, 1, 16, 0, yp, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q8_0, w.p, xp, 1, -1, 32, yp, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::gguf_gemv(DType::f16, w.p, xp, 1, 16, 256, yp, nullptr), UnsupportedError);
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q8_0, w.p, xp, 1, 16, 32, yp, nullptr, 15), Contains("stride 15"));
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q8_0, w.p, xp, 1, 16, 32 * 8192, yp, nullptr), Contains("too wide"));
  CHECK_THROWS_AS(kc::gguf_gemv(DType::f32, w.p, xp, 1, 16, 256, yp, nullptr), UnsupportedError);
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q8_0, nullptr, xp, 1, 16, 32, yp, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q8_0, w.p, xp + 1, 1, 16, 32, yp, nullptr), Contains("16-byte aligned"));
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q8_0, w.as<char>(1), xp, 1, 16, 32, yp, nullptr), InvalidArgument);
  CHECK_NOTHROW(kc::gguf_gemv(DType::q8_0, nullptr, nullptr, 1, 0, 32, static_cast<std::uint16_t*>(nullptr), nullptr));  // N = 0: nothing to do
  // gguf_mmq
  {
    const std::size_t ws = kc::gguf_mmq_workspace_bytes(DType::q4_k, 16, 256);
    test::DeviceMem dws(ws);
    CHECK(kc::gguf_mmq_workspace_bytes(DType::f16, 16, 256) == 0);
    CHECK(kc::gguf_mmq_workspace_bytes(DType::q4_k, 16, 100) == 0);
    CHECK_THROWS_WITH(kc::gguf_mmq(DType::q4_k, w.p, xp, 65, 16, 256, yp, dws.p, ws, nullptr),
                      Contains("M = 65") && Contains("gguf_gemm"));
    CHECK_THROWS_AS(kc::gguf_mmq(DType::q4_k, w.p, xp, 0, 16, 256, yp, dws.p, ws, nullptr), InvalidArgument);
    CHECK_THROWS_WITH(kc::gguf_mmq(DType::q4_k, w.p, xp, 9, 16, 100, yp, dws.p, ws, nullptr), Contains("K=100"));
    CHECK_THROWS_AS(kc::gguf_mmq(DType::f16, w.p, xp, 9, 16, 256, yp, dws.p, ws, nullptr), UnsupportedError);
    const std::size_t ws9 = kc::gguf_mmq_workspace_bytes(DType::q4_k, 16, 256, 9);  // what 9 rows need
    CHECK(ws9 <= ws);
    CHECK_THROWS_WITH(kc::gguf_mmq(DType::q4_k, w.p, xp, 9, 16, 256, yp, dws.p, ws9 - 16, nullptr),
                      Contains("workspace") && Contains("needs"));
    CHECK_THROWS_WITH(kc::gguf_mmq(DType::q4_k, w.p, xp, 9, 16, 256, yp, nullptr, ws, nullptr), Contains("workspace"));
    CHECK_THROWS_WITH(kc::gguf_mmq(DType::q4_k, w.p, xp + 1, 9, 16, 256, yp, dws.p, ws, nullptr),
                      Contains("16-byte aligned"));
    CHECK_THROWS_WITH(kc::gguf_mmq(DType::q4_k, w.p, xp, 9, 16, 256, yp, dws.p, ws, nullptr, 15), Contains("stride 15"));
  }
  // Gemm
  kc::Gemm gemm;
  CHECK_THROWS_AS(gemm.run(xp, xp, yp, 1, 16, 0, nullptr), InvalidArgument);
  CHECK_THROWS_AS(gemm.run(xp, xp, yp, -1, 16, 16, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(gemm.run(xp, nullptr, yp, 1, 16, 16, nullptr), Contains("null w"));
  CHECK_THROWS_AS(gemm.run(xp, xp, static_cast<float*>(nullptr), 1, 16, 16, 1.0f, nullptr), InvalidArgument);
  CHECK_NOTHROW(gemm.run(nullptr, nullptr, yp, 1, 0, 16, nullptr));
  CHECK(gemm.cached_plans() == 0);
  // gguf_gemm
  CHECK_THROWS_WITH(kc::gguf_gemm(gemm, DType::q4_k, w.p, xp, 64, 16, 100, yp, yp, nullptr), Contains("block size 256"));
  CHECK_THROWS_WITH(kc::gguf_gemm(gemm, DType::q4_k, w.p, xp, 64, 16, 256, nullptr, yp, nullptr), Contains("scratch"));
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

// ---- measurement (hidden; run with test_cuda "[gemm_bench]") --------------------------------------------

namespace {

/// Median over 20 samples (after 3 warm-up samples) of the per-call time in ms of `call(i)`, where one
/// sample is `calls` consecutive calls between two CUDA events.
template <class F>
double median_ms(int calls, cudaStream_t stream, F&& call) {
  cudaEvent_t a, b;
  CUDA_REQUIRE(cudaEventCreate(&a));
  CUDA_REQUIRE(cudaEventCreate(&b));
  std::vector<double> t;
  for (int sample = 0; sample < 23; ++sample) {
    CUDA_REQUIRE(cudaEventRecord(a, stream));
    for (int i = 0; i < calls; ++i) call(i);
    CUDA_REQUIRE(cudaEventRecord(b, stream));
    CUDA_REQUIRE(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, a, b));
    if (sample >= 3) t.push_back(static_cast<double>(ms) / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Like median_ms, with the calls captured once into a CUDA graph and replayed: a decode step's cost of a kernel
/// (no host launch work between calls, chained launches kept as programmatic edges).
template <class F>
double graph_median_ms(int calls, cudaStream_t stream, F&& call) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) call(i);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = median_ms(calls, stream, [&](int i) {
    if (i == 0) CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
  });
  CUDA_REQUIRE(cudaGraphExecDestroy(exec));
  CUDA_REQUIRE(cudaGraphDestroy(graph));
  return ms;
}

}  // namespace

TEST_CASE("cuda::bf16_gemv matches gemm_xwt for M = 1..8, bf16 and f32 outputs", "[cuda][gemm]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  struct Shape {
    std::int64_t N, K;
  };
  // N odd and off the 2-row warp tile; K from one chunk to past the 4 x 32-chunk unroll, and ragged. The
  // split across warps (bf16_gemv.cu's split_for): 1 up to 255 chunks of 8 (K < 2048), 2 for {77, 2056}
  // (257 chunks: a ragged second pass), 4 for {1000, 4096} and {64, 14336}.
  const Shape shapes[] = {{1, 8}, {3, 64}, {333, 1000}, {1000, 4096}, {257, 1032}, {64, 14336}, {77, 2056}};
  // Both kernels (Bf16GemvPath): the tensor-core one (16-row blocks, eight warps' slices of 32-value k-steps)
  // meets ragged N and K in the same shapes.
  // The tensor-core kernel also with its first weights copied before the chained wait (early copies).
  std::mt19937 rng(test_seed("cuda::bf16_gemv"));
  for (const int early : {0, 1})
  for (const auto path : {kc::Bf16GemvPath::cuda_cores, kc::Bf16GemvPath::tensor_cores})
  for (const Shape& s : shapes) {
    if (early && path == kc::Bf16GemvPath::cuda_cores) continue;
    kc::set_bf16_gemv_path(path);
    kc::set_tensor_core_gemv_early_copies(early);
    for (int M = 1; M <= kc::kGemvMaxRows; ++M) {
      INFO((path == kc::Bf16GemvPath::tensor_cores ? "tensor cores" : "CUDA cores") << (early ? ", early copies" : "")
                                                                                    << ", M=" << M << " N=" << s.N
                                                                                    << " K=" << s.K);
      const auto xb = random_bf16(static_cast<std::size_t>(M * s.K), rng);
      const auto wb = random_bf16(static_cast<std::size_t>(s.N * s.K), rng);
      const Reference r = reference(to_f32(xb), to_f32(wb), M, s.N, s.K);
      test::DeviceMem dx(xb.size() * 2), dw(wb.size() * 2), dy(r.y.size() * 2), dyf(r.y.size() * 4);
      upload(dx, xb);
      upload(dw, wb);
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, r.y.size() * 2));   // NaN
      CUDA_REQUIRE(cudaMemset(dyf.p, 0xff, r.y.size() * 4));  // NaN
      REQUIRE(kc::bf16_gemv_supports(dw.p, dx.p, s.K));
      kc::bf16_gemv(dw.as<std::uint16_t>(), dx.as<std::uint16_t>(), M, s.N, s.K, dy.as<std::uint16_t>(), stream);
      kc::bf16_gemv(dw.as<std::uint16_t>(), dx.as<std::uint16_t>(), M, s.N, s.K, dyf.as<float>(), stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      check_close(to_f32(download<std::uint16_t>(dy.p, r.y.size())), r.y, r.abs_y, s.K, std::ldexp(1.0, -8), 2.0);
      check_close(download<float>(dyf.p, r.y.size()), r.y, r.abs_y, s.K, std::ldexp(1.0, -20), 2.0);
    }
  }
  kc::set_bf16_gemv_path(kc::Bf16GemvPath::automatic);
  kc::set_tensor_core_gemv_early_copies(-1);
  SECTION("operands it cannot take are refused, not miscomputed") {
    test::DeviceMem d(4096);
    CHECK_FALSE(kc::bf16_gemv_supports(d.p, d.p, 12));
    CHECK_FALSE(kc::bf16_gemv_supports(d.as<std::uint16_t>(2), d.p, 16));
    CHECK_THROWS_AS(kc::bf16_gemv(d.as<std::uint16_t>(), d.as<std::uint16_t>(), 1, 4, 12, d.as<std::uint16_t>(), stream),
                    InvalidArgument);
    CHECK_THROWS_AS(kc::bf16_gemv(d.as<std::uint16_t>(), d.as<std::uint16_t>(), 9, 4, 16, d.as<std::uint16_t>(), stream),
                    InvalidArgument);
    CHECK_THROWS_AS(kc::bf16_gemv(d.as<std::uint16_t>(), d.as<std::uint16_t>(), 1, 4, 16, static_cast<float*>(nullptr),
                                  stream),
                    InvalidArgument);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::bf16_gemv_swiglu matches gemm_xwt followed by SwiGLU", "[cuda][gemm]") {
  // W = [gate; up] ([2I][K]); y[m][i] = silu(g) * u with g = x[m]·gate_i, u = x[m]·up_i. Against the f32
  // reference of g and u (gemm_xwt) and silu in double, per value:
  //   |Δy| <= 2^-8 |y| + 1.1 e_g |u| + |silu(g)| e_u + 1e-6 |y|,
  // e_g, e_u being the dot products' f32 accumulation bounds (check_close's 2·K·2^-24 · |x|·|w|), 1.1 the
  // largest |silu'|, 2^-8 |y| the output's rounding to bf16 and 1e-6 |y| silu's own f32 arithmetic.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  struct Shape {
    std::int64_t I, K;
  };
  const Shape shapes[] = {{1, 8}, {3, 64}, {333, 1000}, {1000, 4096}, {64, 14336}, {77, 2056}};  // splits 1, 4, 2
  std::mt19937 rng(test_seed("cuda::bf16_gemv_swiglu"));
  for (const Shape& s : shapes) {
    for (int M = 1; M <= kc::kGemvMaxRows; ++M) {
      INFO("M=" << M << " I=" << s.I << " K=" << s.K);
      const std::int64_t N = 2 * s.I;
      const auto xb = random_bf16(static_cast<std::size_t>(M * s.K), rng);
      const auto wb = random_bf16(static_cast<std::size_t>(N * s.K), rng);
      const Reference r = reference(to_f32(xb), to_f32(wb), M, N, s.K);
      const double acc = 2.0 * static_cast<double>(s.K) * std::ldexp(1.0, -24);
      test::DeviceMem dx(xb.size() * 2), dw(wb.size() * 2), dy(static_cast<std::size_t>(M * s.I) * 2);
      upload(dx, xb);
      upload(dw, wb);
      CUDA_REQUIRE(cudaMemset(dy.p, 0xff, static_cast<std::size_t>(M * s.I) * 2));  // NaN
      kc::bf16_gemv_swiglu(dw.as<std::uint16_t>(), dx.as<std::uint16_t>(), M, s.I, s.K, dy.as<std::uint16_t>(), stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto got = to_f32(download<std::uint16_t>(dy.p, static_cast<std::size_t>(M * s.I)));
      int bad = 0;
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t i = 0; i < s.I; ++i) {
          const auto gi = static_cast<std::size_t>(m * N + i), ui = static_cast<std::size_t>(m * N + s.I + i);
          const double g = r.y[gi], u = r.y[ui];
          const double silu = g / (1.0 + std::exp(-g)), want = silu * u;
          const double bound = std::ldexp(std::fabs(want), -8) + 1.1 * acc * r.abs_y[gi] * std::fabs(u) +
                               std::fabs(silu) * acc * r.abs_y[ui] + 1e-6 * std::fabs(want) + 1e-30;
          const double have = got[static_cast<std::size_t>(m * s.I + i)];
          if (!(std::fabs(have - want) <= bound) && ++bad <= 5)
            FAIL_CHECK("y[" << m << "][" << i << "] = " << have << ", want " << want << " ± " << bound);
        }
      CHECK(bad == 0);
    }
  }
  SECTION("operands bf16_gemv refuses are refused here too") {
    test::DeviceMem d(4096);
    CHECK_THROWS_AS(kc::bf16_gemv_swiglu(d.as<std::uint16_t>(), d.as<std::uint16_t>(), 1, 4, 12, d.as<std::uint16_t>(),
                                         stream),
                    InvalidArgument);
    CHECK_THROWS_AS(kc::bf16_gemv_swiglu(d.as<std::uint16_t>(), d.as<std::uint16_t>(), 9, 4, 16, d.as<std::uint16_t>(),
                                         stream),
                    InvalidArgument);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::gguf_gemv_swiglu matches the integer reference followed by SwiGLU, every type", "[cuda][gemm]") {
  // W = [gate; up] ([2I][K]) in GGUF blocks; y[m][i] = silu(g) * u with g and u as gguf_gemv computes them
  // (q8_reference: x quantized per 32, integer dot products per segment), silu in double. Per value:
  //   |Δy| <= 2^-8 |y| + 1.1 e_g |u| + |silu(g)| e_u + 1e-6 |y|,
  // e_g, e_u the dot products' f32 bounds (gguf_gemv's test: 8·K·2^-24 · A), 1.1 the largest |silu'|.
  // Both walks of the GEMV: Q4_K/Q5_K weights 16-byte aligned take the pair walk, shifted by 2 bytes the
  // segment walk. I = 333 is not a multiple of a CTA's 8 warps.
  using Catch::Contains;
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::uint32_t seed = test_seed("cuda::gguf_gemv_swiglu");
  // I = 30,000 at K = 256 and M = 4: a CTA holds ~76 outputs, more than its partial sums hold at once (three
  // chunks of gate and up rows).
  struct Shape {
    std::int64_t I, K;
    int M;
  };
  const Shape shapes[] = {{333, 1024, 1}, {333, 1024, 2}, {333, 1024, 5}, {333, 1024, 8}, {30000, 256, 4}};
  for (DType t : kGemvTypes) {
    for (std::size_t w_shift : {std::size_t{0}, std::size_t{2}}) {
      for (const Shape& sh : shapes) {
        ++seed;
        const int M = sh.M;
        const std::int64_t I = sh.I, N = 2 * I, K = sh.K;
        INFO("type " << name(t) << " M=" << M << " I=" << I << " K=" << K << " weight shift " << w_shift << " seed "
                     << seed);
        std::mt19937 rng(seed);
        const auto blocks = test::random_tensor(t, static_cast<std::size_t>(N * K), rng);
        const auto xb = random_bf16(static_cast<std::size_t>(M * K), rng);
        const Reference r = q8_reference(t, blocks, to_f32(xb), M, N, K);
        test::DeviceMem dw(blocks.size() + w_shift), dx(xb.size() * 2), dy(static_cast<std::size_t>(M * I) * 2);
        CUDA_REQUIRE(cudaMemcpy(dw.as<std::byte>(w_shift), blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
        upload(dx.p, xb);
        CUDA_REQUIRE(cudaMemset(dy.p, 0xff, static_cast<std::size_t>(M * I) * 2));  // NaN
        kc::gguf_gemv_swiglu(t, dw.as<std::byte>(w_shift), dx.as<std::uint16_t>(), M, I, K, dy.as<std::uint16_t>(),
                             stream);
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        const auto got = to_f32(download<std::uint16_t>(dy.p, static_cast<std::size_t>(M * I)));
        const double acc = 8.0 * static_cast<double>(K) * std::ldexp(1.0, -24);
        int bad = 0;
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t i = 0; i < I; ++i) {
            const auto gi = static_cast<std::size_t>(m * N + i), ui = static_cast<std::size_t>(m * N + I + i);
            const double g = r.y[gi], u = r.y[ui];
            const double silu = g / (1.0 + std::exp(-g)), want = silu * u;
            const double bound = std::ldexp(std::fabs(want), -8) + 1.1 * acc * r.abs_y[gi] * std::fabs(u) +
                                 std::fabs(silu) * acc * r.abs_y[ui] + 1e-6 * std::fabs(want) + 1e-30;
            const double have = got[static_cast<std::size_t>(m * I + i)];
            if (!(std::fabs(have - want) <= bound) && ++bad <= 5)
              FAIL_CHECK("y[" << m << "][" << i << "] = " << have << ", want " << want << " ± " << bound);
          }
        CHECK(bad == 0);
      }
    }
  }
  test::DeviceMem d(4096);
  CHECK_THROWS_WITH(kc::gguf_gemv_swiglu(DType::q4_k, d.p, d.as<std::uint16_t>(), 9, 4, 256, d.as<std::uint16_t>(), stream),
                    Contains("M = 9"));
  CHECK_THROWS_AS(kc::gguf_gemv_swiglu(DType::q4_k, d.p, d.as<std::uint16_t>(), 1, -1, 256, d.as<std::uint16_t>(), stream),
                  InvalidArgument);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("cuda::gguf_gemv with x as a pre-norm: the norm's bits, then the plain GEMV's bits", "[cuda][gemm]") {
  // The decoder's residual add + RMSNorm computed in the GEMV's prologue (ResidualNorm). Checked in two steps:
  // what it writes (r = residual + delta bit for bit; x within an ulp of the CPU's norm and of the standalone
  // kernel, whose sum of squares runs in another order), and that y is the plain gguf_gemv's bits on that x: the
  // same quantization and dot products, so the x the kernel multiplied is the x it wrote. Every type (each walk's
  // x layout), 1, 3 and 8 rows, plain, SwiGLU and f32 logits without outputs; K = 28,672 at M = 8 (two launches
  // of 4 rows: the norm's pointers are offset per launch).
  using Catch::Contains;
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  std::uint32_t seed = test_seed("cuda::gguf_gemv pre-norm");
  const float eps = 1e-5f;
  struct Shape {
    std::int64_t N, K;
    int M;
  };
  for (DType t : kGemvTypes) {
    const std::int64_t be = info(t).block_elems;
    const std::int64_t k = be == 32 ? 576 : 9 * be;  // SmolLM2's width for the 32-value blocks
    const Shape shapes[] = {{333, k, 1}, {333, k, 3}, {333, k, 8}, {37, 28672, 8}};
    for (const Shape& sh : shapes) {
      ++seed;
      const std::int64_t N = sh.N, K = sh.K;
      const int M = sh.M;
      INFO("type " << name(t) << " M=" << M << " N=" << N << " K=" << K << " seed " << seed);
      std::mt19937 rng(seed);
      const auto blocks = test::random_tensor(t, static_cast<std::size_t>(N * K), rng);
      const auto n = static_cast<std::size_t>(M * K);
      std::normal_distribution<float> nd(0.0f, 2.0f), nw(1.0f, 0.3f);
      std::vector<float> residual(n), weight(static_cast<std::size_t>(K));
      for (auto& v : residual) v = nd(rng);
      for (auto& v : weight) v = nw(rng);
      const auto delta = random_bf16(n, rng);
      std::vector<float> sum(n);
      for (std::size_t i = 0; i < n; ++i) sum[i] = residual[i] + bf16_to_f32(delta[i]);

      test::DeviceMem dw(blocks.size()), dres(n * 4), ddelta(n * 2), dnw(weight.size() * 4), dsum(n * 4), dxn(n * 2),
          dref_sum(n * 4), dref_xn(n * 2), dy(static_cast<std::size_t>(M * N) * 4), dy2(static_cast<std::size_t>(M * N) * 4);
      upload(dw.p, blocks);
      upload(dres.p, residual);
      upload(ddelta.p, delta);
      upload(dnw.p, weight);
      CUDA_REQUIRE(cudaMemset(dsum.p, 0xff, n * 4));
      CUDA_REQUIRE(cudaMemset(dxn.p, 0xff, n * 2));
      const kc::ResidualNorm norm{dres.as<float>(), ddelta.as<std::uint16_t>(), dnw.as<float>(), eps, dsum.as<float>(),
                                  dxn.as<std::uint16_t>()};
      kc::gguf_gemv(t, dw.p, norm, M, N, K, dy.as<std::uint16_t>(), stream);
      // The standalone kernel on the same input.
      kc::residual_norm({dres.as<float>(), ddelta.as<std::uint16_t>(), dnw.as<float>(), eps, dref_sum.as<float>(),
                         dref_xn.as<std::uint16_t>()},
                        M, K, stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      const auto got_sum = download<float>(dsum.p, n);
      CHECK(std::memcmp(got_sum.data(), sum.data(), n * 4) == 0);
      CHECK(download<float>(dres.p, n) == residual);  // the input is not written
      const auto xn = download<std::uint16_t>(dxn.p, n), ref_xn = download<std::uint16_t>(dref_xn.p, n);
      std::vector<float> cpu(n);
      kernels::cpu::rms_norm(sum.data(), weight.data(), cpu.data(), M, K, eps);
      int far = 0, differ = 0;
      for (std::size_t i = 0; i < n; ++i) {
        // One bf16 ulp of the value, from the inverse norm's rounding (rsqrtf, summation order).
        const float ulp = std::ldexp(std::fabs(cpu[i]), -7) + 1e-30f;
        if (!(std::fabs(bf16_to_f32(xn[i]) - cpu[i]) <= ulp) && ++far <= 5)
          FAIL_CHECK("x[" << i << "] = " << bf16_to_f32(xn[i]) << ", the CPU's norm " << cpu[i]);
        const int d = static_cast<int>(xn[i]) - static_cast<int>(ref_xn[i]);
        if (d != 0) ++differ;
        if (d < -1 || d > 1) FAIL_CHECK("x[" << i << "] bits " << xn[i] << ", the norm kernel's " << ref_xn[i]);
      }
      CHECK(far == 0);
      std::printf("  %s M=%d K=%lld: %d of %zu x values an ulp from the norm kernel's\n", name(t).data(), M,
                  static_cast<long long>(K), differ, n);
      // y: the plain GEMV's bits on the x written.
      const auto y = download<std::uint16_t>(dy.p, static_cast<std::size_t>(M * N));
      kc::gguf_gemv(t, dw.p, dxn.as<std::uint16_t>(), M, N, K, dy2.as<std::uint16_t>(), stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));
      CHECK(download<std::uint16_t>(dy2.p, static_cast<std::size_t>(M * N)) == y);
      const Reference r = q8_reference(t, blocks, to_f32(xn), M, N, K);
      check_close(to_f32(y), r.y, r.abs_y, K, std::ldexp(1.0, -8), 8.0);

      // SwiGLU on [gate; up] (N rows, N / 2 outputs) and f32 logits, neither writing r nor x.
      if (K != 28672) {
        const std::int64_t I = N / 2;  // the weight's first 2I rows as [gate; up]
        kc::ResidualNorm bare = norm;
        bare.residual_out = nullptr;
        bare.normed_out = nullptr;
        CUDA_REQUIRE(cudaMemset(dsum.p, 0xff, n * 4));
        kc::gguf_gemv_swiglu(t, dw.p, bare, M, I, K, dy.as<std::uint16_t>(), stream);
        kc::gguf_gemv_swiglu(t, dw.p, dxn.as<std::uint16_t>(), M, I, K, dy2.as<std::uint16_t>(), stream);
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        CHECK(download<std::uint16_t>(dy.p, static_cast<std::size_t>(M * I)) ==
              download<std::uint16_t>(dy2.p, static_cast<std::size_t>(M * I)));
        kc::gguf_gemv(t, dw.p, bare, M, N, K, dy.as<float>(), stream);
        kc::gguf_gemv(t, dw.p, dxn.as<std::uint16_t>(), M, N, K, dy2.as<float>(), stream);
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        CHECK(download<float>(dy.p, static_cast<std::size_t>(M * N)) ==
              download<float>(dy2.p, static_cast<std::size_t>(M * N)));
        const auto untouched = download<std::uint32_t>(dsum.p, n);
        CHECK(std::all_of(untouched.begin(), untouched.end(), [](std::uint32_t v) { return v == 0xffffffffu; }));
      }
    }
  }
  // Refused, not miscomputed: r written over the residual other CTAs read; misaligned operands; no weight.
  test::DeviceMem d(1 << 16);
  kc::ResidualNorm in_place{d.as<float>(), nullptr, d.as<float>(), eps, d.as<float>(), nullptr};
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q4_0, d.p, in_place, 1, 4, 64, d.as<std::uint16_t>(), stream),
                    Contains("another buffer"));
  kc::ResidualNorm odd{d.as<float>() + 1, nullptr, d.as<float>(), eps, nullptr, nullptr};
  CHECK_THROWS_WITH(kc::gguf_gemv(DType::q4_0, d.p, odd, 1, 4, 64, d.as<std::uint16_t>(), stream),
                    Contains("16-byte aligned"));
  CHECK_THROWS_AS(kc::gguf_gemv(DType::q4_0, d.p, kc::ResidualNorm{}, 1, 4, 64, d.as<std::uint16_t>(), stream),
                  InvalidArgument);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("bench: GGUF matmul paths at 1..64 rows on Llama-3-8B's layers", "[cuda][.bench][gemm_bench]") {
  // Which path wins where: the integer GEMV (M <= 8), the int8 MMA (gguf_mmq, any M <= 64) and dequantize +
  // bf16 GEMM (gguf_gemm), per layer and block type; each with enough copies of the weight to defeat the L2.
  // The GEMV is timed twice: launched call by call, and replayed from a graph as a decode step runs it.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  kc::Gemm gemm;
  struct Layer {
    const char* name;
    std::int64_t N, K;
  };
  const Layer layers[] = {{"q", 4096, 4096}, {"kv", 1024, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336},
                          {"lm_head", 128256, 4096}};
  {
    // The copy rate of this GPU in this run, for the GB/s below: a device-to-device copy of 1 GiB reads and
    // writes it, so its rate is 2 GiB over the time (what ncu's dram__bytes counts), as the GPU tool's notes
    // quote it (4.27 TB/s on the H200).
    const std::size_t bytes = std::size_t{1} << 30;
    test::DeviceMem src(bytes), dst(bytes);
    CUDA_REQUIRE(cudaMemset(src.p, 0x11, bytes));
    const double ms = median_ms(1, stream, [&](int) {
      CUDA_REQUIRE(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, stream));
    });
    std::printf("copy: 1 GiB device to device %.3f ms, %.0f GB/s read + written\n", ms,
                2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  {
    // What a decode step pays for a small kernel between two GEMVs: the residual add + RMSNorm of one row of
    // 4,096 (chained, as in the step), replayed from a graph of 200. A fusion that removes such a kernel
    // saves about this much.
    test::DeviceMem res(4096 * 4), delta(4096 * 2), wn(4096 * 4), out(4096 * 2);
    CUDA_REQUIRE(cudaMemset(res.p, 0, 4096 * 4));
    CUDA_REQUIRE(cudaMemset(delta.p, 0, 4096 * 2));
    CUDA_REQUIRE(cudaMemset(wn.p, 0, 4096 * 4));
    const double ms = graph_median_ms(200, stream, [&](int) {
      kc::add_bf16_rmsnorm(res.as<float>(), delta.as<std::uint16_t>(), wn.as<float>(), 1, 4096, 1e-5f,
                           out.as<std::uint16_t>(), stream);
    });
    std::printf("add_bf16_rmsnorm, 1 x 4096, in a graph: %.2f us a kernel\n", ms * 1e3);
  }
  {
    // The pre-norm in the GEMV's prologue against the norm kernel before the GEMV, one row, in a graph: SmolLM2's
    // qkv and gate_up (Q4_1, K = 576) and Llama-3-8B's (Q4_K, K = 4096).
    struct Fused {
      const char* name;
      DType t;
      std::int64_t N, K;
      bool swiglu;
    };
    const Fused cases[] = {{"smollm2 qkv", DType::q4_1, 960, 576, false},
                           {"smollm2 gate_up", DType::q4_1, 3072, 576, true},
                           {"8b qkv", DType::q4_k, 6144, 4096, false},
                           {"8b gate_up", DType::q4_k, 28672, 4096, true}};
    for (const Fused& f : cases) {
      const std::size_t bytes = *row_bytes(f.t, static_cast<std::uint64_t>(f.N * f.K));
      const int copies = static_cast<int>(std::max<std::size_t>(2, (400u << 20) / bytes));
      const auto K = static_cast<std::size_t>(f.K);
      test::DeviceMem w(bytes * static_cast<std::size_t>(copies)), res(2 * K * 4), delta(K * 2), wn(K * 4), xn(K * 2),
          y(static_cast<std::size_t>(f.N) * 2);
      CUDA_REQUIRE(cudaMemset(w.p, 0x11, bytes * static_cast<std::size_t>(copies)));
      CUDA_REQUIRE(cudaMemset(res.p, 0, 2 * K * 4));
      CUDA_REQUIRE(cudaMemset(delta.p, 0, K * 2));
      CUDA_REQUIRE(cudaMemset(wn.p, 0, K * 4));
      const auto wi = [&](int i) { return w.as<std::byte>(bytes * static_cast<std::size_t>(i)); };
      const kc::ResidualNorm norm{res.as<float>(), delta.as<std::uint16_t>(), wn.as<float>(), 1e-5f,
                                  res.as<float>() + K, xn.as<std::uint16_t>()};
      const double apart = graph_median_ms(copies, stream, [&](int i) {
        kc::residual_norm(norm, 1, f.K, stream);
        if (f.swiglu) kc::gguf_gemv_swiglu(f.t, wi(i), xn.as<std::uint16_t>(), 1, f.N / 2, f.K, y.as<std::uint16_t>(), stream);
        else kc::gguf_gemv(f.t, wi(i), xn.as<std::uint16_t>(), 1, f.N, f.K, y.as<std::uint16_t>(), stream);
      });
      const double fused = graph_median_ms(copies, stream, [&](int i) {
        if (f.swiglu) kc::gguf_gemv_swiglu(f.t, wi(i), norm, 1, f.N / 2, f.K, y.as<std::uint16_t>(), stream);
        else kc::gguf_gemv(f.t, wi(i), norm, 1, f.N, f.K, y.as<std::uint16_t>(), stream);
      });
      std::printf("pre-norm %-15s %s M=1, in a graph: norm kernel + gemv %7.2f us, gemv with the norm %7.2f us\n",
                  f.name, std::string(name(f.t)).c_str(), apart * 1e3, fused * 1e3);
    }
  }
  for (DType t : {DType::q4_k, DType::q6_k, DType::q8_0, DType::q4_0}) {
    for (const Layer& l : layers) {
      const std::size_t bytes = *row_bytes(t, static_cast<std::uint64_t>(l.N * l.K));
      const int copies = static_cast<int>(std::max<std::size_t>(2, (400u << 20) / bytes));
      test::DeviceMem w(bytes * static_cast<std::size_t>(copies)), x(static_cast<std::size_t>(l.K) * 2 * 64),
          y(static_cast<std::size_t>(l.N) * 2 * 64), scratch(kc::gguf_scratch_elems(t, l.N, l.K) * 2);
      CUDA_REQUIRE(cudaMemset(w.p, 0x11, bytes * static_cast<std::size_t>(copies)));  // finite f16 scales
      CUDA_REQUIRE(cudaMemset(x.p, 0x3c, static_cast<std::size_t>(l.K) * 2 * 64));
      const auto wi = [&](int i) { return w.as<std::byte>(bytes * static_cast<std::size_t>(i)); };
      const std::size_t ws = kc::gguf_mmq_workspace_bytes(t, l.N, l.K);
      const auto gbs = [&](double ms) { return static_cast<double>(bytes) / (ms * 1e-3) / 1e9; };
      for (int M : {1, 2, 4, 8, 9, 16, 24, 32, 48, 64}) {
        const double mmq = median_ms(copies, stream, [&](int i) {
          kc::gguf_mmq(t, wi(i), x.as<std::uint16_t>(), M, l.N, l.K, y.as<std::uint16_t>(), scratch.p, ws, stream);
        });
        std::printf("%-6s %-7s M=%2d: mmq %8.2f us %6.0f GB/s", std::string(name(t)).c_str(), l.name, M, mmq * 1e3,
                    gbs(mmq));
        if (M <= kc::kGemvMaxRows) {
          const double gemv = median_ms(copies, stream, [&](int i) {
            kc::gguf_gemv(t, wi(i), x.as<std::uint16_t>(), M, l.N, l.K, y.as<std::uint16_t>(), stream);
          });
          const double graphed = graph_median_ms(copies, stream, [&](int i) {
            kc::gguf_gemv(t, wi(i), x.as<std::uint16_t>(), M, l.N, l.K, y.as<std::uint16_t>(), stream);
          });
          std::printf(" | gemv %8.2f us %6.0f GB/s | in a graph %8.2f us %6.0f GB/s", gemv * 1e3, gbs(gemv),
                      graphed * 1e3, gbs(graphed));
        } else {
          const double deq = median_ms(copies, stream, [&](int i) {
            kc::gguf_gemm(gemm, t, wi(i), x.as<std::uint16_t>(), M, l.N, l.K, scratch.as<std::uint16_t>(),
                          y.as<std::uint16_t>(), stream);
          });
          std::printf(" | dequantize+gemm %8.2f us", deq * 1e3);
        }
        std::printf("\n");
      }
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("bench: gguf_gemv GB/s and bf16 Gemm TFLOP/s", "[cuda][.bench][gemm_bench]") {
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  const std::int64_t N = 14336, K = 4096;  // Llama-3-8B's MLP up/gate projection
  test::DeviceMem x(static_cast<std::size_t>(K) * 2 * 8), y(static_cast<std::size_t>(N) * 2 * 8);
  CUDA_REQUIRE(cudaMemset(x.p, 0x3c, static_cast<std::size_t>(K) * 2 * 8));
  for (DType t : {DType::q4_k, DType::q8_0, DType::q6_k, DType::q4_0}) {
    const std::size_t bytes = *row_bytes(t, static_cast<std::uint64_t>(N * K));
    // Enough copies of the weights that they are ~8× the 50 MiB L2: every call reads from HBM.
    const int copies = static_cast<int>(std::max<std::size_t>(2, (400u << 20) / bytes));
    test::DeviceMem w(bytes * static_cast<std::size_t>(copies));
    CUDA_REQUIRE(cudaMemset(w.p, 0x11, bytes * static_cast<std::size_t>(copies)));  // finite f16 scales
    for (int M : {1, 8}) {
      const double ms = median_ms(copies, stream, [&](int i) {
        kc::gguf_gemv(t, w.as<std::byte>(bytes * static_cast<std::size_t>(i)), x.as<std::uint16_t>(), M, N, K,
                      y.as<std::uint16_t>(), stream);
      });
      std::printf("gguf_gemv %-5s M=%d N=%lld K=%lld: %8.2f us, %7.1f GB/s of weights (%.0f%% of 4270 GB/s copy)\n",
                  std::string(name(t)).c_str(), M, static_cast<long long>(N), static_cast<long long>(K), ms * 1e3,
                  static_cast<double>(bytes) / (ms * 1e-3) / 1e9, static_cast<double>(bytes) / (ms * 1e-3) / 4.27e12 * 100);
    }
  }
  {
    // bf16 weights at decode batch sizes: the streaming GEMV against cuBLASLt, on Llama-3-8B's layers
    // (qkv, o, gate_up, down, LM head), each with enough copies to defeat the L2.
    struct Layer {
      const char* name;
      std::int64_t N, K;
    };
    kc::Gemm gemm;
    for (const Layer& l : {Layer{"qkv", 6144, 4096}, Layer{"o", 4096, 4096}, Layer{"gate_up", 28672, 4096},
                           Layer{"down", 4096, 14336}, Layer{"lm_head", 128256, 4096}}) {
      const std::size_t bytes = static_cast<std::size_t>(l.N * l.K) * 2;
      const int copies = static_cast<int>(std::max<std::size_t>(2, (400u << 20) / bytes));
      test::DeviceMem w(bytes * static_cast<std::size_t>(copies)), xs(static_cast<std::size_t>(l.K) * 2 * 8),
          ys(static_cast<std::size_t>(l.N) * 2 * 8);
      CUDA_REQUIRE(cudaMemset(w.p, 0x3c, bytes * static_cast<std::size_t>(copies)));
      CUDA_REQUIRE(cudaMemset(xs.p, 0x3c, static_cast<std::size_t>(l.K) * 2 * 8));
      for (int M : {1, 8}) {
        const auto wi = [&](int i) { return w.as<std::uint16_t>(bytes * static_cast<std::size_t>(i)); };
        const double gemv = median_ms(copies, stream, [&](int i) {
          kc::bf16_gemv(wi(i), xs.as<std::uint16_t>(), M, l.N, l.K, ys.as<std::uint16_t>(), stream);
        });
        const double blas = median_ms(copies, stream, [&](int i) {
          gemm.run(xs.as<std::uint16_t>(), wi(i), ys.as<std::uint16_t>(), M, l.N, l.K, stream);
        });
        std::printf("bf16 %-7s M=%d N=%6lld K=%5lld: bf16_gemv %7.2f us %6.0f GB/s (%.0f%% of copy), cuBLASLt %7.2f us "
                    "%6.0f GB/s\n",
                    l.name, M, static_cast<long long>(l.N), static_cast<long long>(l.K), gemv * 1e3,
                    static_cast<double>(bytes) / (gemv * 1e-3) / 1e9,
                    static_cast<double>(bytes) / (gemv * 1e-3) / 4.27e12 * 100, blas * 1e3,
                    static_cast<double>(bytes) / (blas * 1e-3) / 1e9);
      }
    }
  }
  {
    // Mid-sized M (a large decode batch, a prefill chunk): cuBLASLt's heuristic pick against the fastest
    // of its first candidates (GemmTuning::measured), on Llama-3-8B's layers.
    struct Layer {
      const char* name;
      std::int64_t N, K;
    };
    kc::Gemm heuristic(kc::Gemm::kDefaultWorkspaceBytes, kc::GemmTuning::heuristic);
    kc::Gemm measured(kc::Gemm::kDefaultWorkspaceBytes, kc::GemmTuning::measured);
    constexpr std::int64_t kMaxM = 4096;
    for (const Layer& l : {Layer{"qkv", 6144, 4096}, Layer{"o", 4096, 4096}, Layer{"gate_up", 28672, 4096},
                           Layer{"down", 4096, 14336}, Layer{"lm_head", 128256, 4096}}) {
      test::DeviceMem w(static_cast<std::size_t>(l.N * l.K) * 2), xs(static_cast<std::size_t>(kMaxM * l.K) * 2),
          ys(static_cast<std::size_t>(kMaxM * l.N) * 2);
      CUDA_REQUIRE(cudaMemset(w.p, 0x3c, static_cast<std::size_t>(l.N * l.K) * 2));
      CUDA_REQUIRE(cudaMemset(xs.p, 0x3c, static_cast<std::size_t>(kMaxM * l.K) * 2));
      for (std::int64_t M : {256, 512, 1024, 2048, 4096}) {
        const auto time = [&](kc::Gemm& g) {
          return median_ms(1, stream, [&](int) {
            g.run(xs.as<std::uint16_t>(), w.as<std::uint16_t>(), ys.as<std::uint16_t>(), M, l.N, l.K, stream);
          });
        };
        const double h = time(heuristic), m = time(measured);
        const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(l.N) * static_cast<double>(l.K);
        std::printf("Gemm bf16 %-7s M=%4lld N=%6lld K=%5lld: heuristic %8.1f us %6.1f TFLOP/s, measured %8.1f us "
                    "%6.1f TFLOP/s (%+.1f%%)\n",
                    l.name, static_cast<long long>(M), static_cast<long long>(l.N), static_cast<long long>(l.K), h * 1e3,
                    flop / (h * 1e-3) / 1e12, m * 1e3, flop / (m * 1e-3) / 1e12, (h / m - 1.0) * 100);
      }
    }
    std::printf("GemmTuning::measured: %zu buckets timed, %zu chose another algorithm than the heuristic\n",
                measured.tuned_buckets(), measured.tuned_overrides());
  }
  {
    const std::int64_t S = 8192;
    test::DeviceMem a(static_cast<std::size_t>(S * S) * 2), b(static_cast<std::size_t>(S * S) * 2),
        c(static_cast<std::size_t>(S * S) * 2);
    std::mt19937 rng(7);
    const auto host = random_bf16(static_cast<std::size_t>(S * S), rng);
    upload(a.p, host);
    upload(b.p, host);
    kc::Gemm gemm;
    const double ms = median_ms(1, stream, [&](int) {
      gemm.run(a.as<std::uint16_t>(), b.as<std::uint16_t>(), c.as<std::uint16_t>(), S, S, S, stream);
    });
    std::printf("Gemm bf16 M=N=K=%lld: %8.3f ms, %6.1f TFLOP/s (torch: 786)\n", static_cast<long long>(S), ms,
                2.0 * static_cast<double>(S) * S * S / (ms * 1e-3) / 1e12);
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("bench: prefill GEMMs at the power cap, cuBLASLt's heuristic against the picks timed there",
          "[cuda][.bench][gemm_cap]") {
  // Issue 16's TTFT: a 2,048-token Llama-3-8B prefill holds the GPU at its power cap, where the clock sits well
  // under its maximum. Per layer shape at M = 2048, random operands (power follows the bits that toggle):
  // each Gemm's algorithm in windows of ~50 ms of back-to-back calls, alternating, and then the prefill's GEMM
  // sequence (32 x qkv, o, gate_up, down), alternating. GemmTuning::measured_at_cap's picks against heuristic.
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  struct Layer {
    const char* name;
    std::int64_t N, K;
  };
  const Layer layers[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  const std::int64_t M = 2048, max_k = 14336, max_n = 28672;
  std::mt19937 rng(11);
  test::DeviceMem x(static_cast<std::size_t>(M * max_k) * 2), y(static_cast<std::size_t>(M * max_n) * 2);
  upload(x.p, random_bf16(static_cast<std::size_t>(M * max_k), rng));
  std::vector<std::unique_ptr<test::DeviceMem>> w;
  for (const Layer& l : layers) {
    w.push_back(std::make_unique<test::DeviceMem>(static_cast<std::size_t>(l.N * l.K) * 2));
    upload(w.back()->p, random_bf16(static_cast<std::size_t>(l.N * l.K), rng, 0.02f));
  }
  kc::Gemm heuristic(kc::Gemm::kDefaultWorkspaceBytes, kc::GemmTuning::heuristic);
  kc::Gemm at_cap(kc::Gemm::kDefaultWorkspaceBytes, kc::GemmTuning::measured_at_cap);
  const auto run = [&](kc::Gemm& g, std::size_t i) {
    g.run(x.as<std::uint16_t>(), w[i]->as<std::uint16_t>(), y.as<std::uint16_t>(), M, layers[i].N, layers[i].K, stream);
  };
  for (std::size_t i = 0; i < std::size(layers); ++i) {  // plans made (and at_cap's timed) before any window
    run(heuristic, i);
    run(at_cap, i);
  }
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  std::printf("GemmTuning::measured_at_cap: %zu buckets timed, %zu chose another algorithm than the heuristic\n",
              at_cap.tuned_buckets(), at_cap.tuned_overrides());
  cudaEvent_t a, b;
  CUDA_REQUIRE(cudaEventCreate(&a));
  CUDA_REQUIRE(cudaEventCreate(&b));
  const auto window_ms = [&](int calls, auto&& body) {
    CUDA_REQUIRE(cudaEventRecord(a, stream));
    for (int c = 0; c < calls; ++c) body();
    CUDA_REQUIRE(cudaEventRecord(b, stream));
    CUDA_REQUIRE(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms);
  };
  for (std::size_t i = 0; i < std::size(layers); ++i) {
    const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(layers[i].N) * static_cast<double>(layers[i].K);
    const int calls = std::max(10, static_cast<int>(50e-3 / (flop / 700e12)));
    double sum[2] = {0, 0};
    constexpr int kRounds = 5;
    window_ms(calls, [&] { run(heuristic, i); });  // to the cap
    for (int r = 0; r < kRounds; ++r) {
      sum[0] += window_ms(calls, [&] { run(heuristic, i); }) / calls;
      sum[1] += window_ms(calls, [&] { run(at_cap, i); }) / calls;
    }
    std::printf("%-7s M=%lld N=%6lld K=%5lld, %d calls a window: heuristic %8.1f us %6.1f TFLOP/s, at-cap pick %8.1f us "
                "%6.1f TFLOP/s (%+.1f%%)\n",
                layers[i].name, static_cast<long long>(M), static_cast<long long>(layers[i].N),
                static_cast<long long>(layers[i].K), calls, sum[0] / kRounds * 1e3, flop / (sum[0] / kRounds * 1e-3) / 1e12,
                sum[1] / kRounds * 1e3, flop / (sum[1] / kRounds * 1e-3) / 1e12, (sum[0] / sum[1] - 1.0) * 100);
  }
  const auto prefill = [&](kc::Gemm& g) {
    for (int layer = 0; layer < 32; ++layer)
      for (std::size_t i = 0; i < std::size(layers); ++i) run(g, i);
  };
  double total[2] = {0, 0};
  constexpr int kPrefills = 6;
  window_ms(1, [&] { prefill(heuristic); });
  for (int r = 0; r < kPrefills; ++r) {
    total[0] += window_ms(1, [&] { prefill(heuristic); });
    total[1] += window_ms(1, [&] { prefill(at_cap); });
  }
  std::printf("the prefill's GEMMs (32 layers, M=2048), %d alternating: heuristic %.2f ms, at-cap picks %.2f ms (%+.1f%%)\n",
              kPrefills, total[0] / kPrefills, total[1] / kPrefills, (total[0] / total[1] - 1.0) * 100);
  CUDA_REQUIRE(cudaEventDestroy(a));
  CUDA_REQUIRE(cudaEventDestroy(b));
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}
