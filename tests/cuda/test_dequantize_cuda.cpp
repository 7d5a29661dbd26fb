// CUDA dequantization against the CPU reference: random blocks of every type from printed seeds (finite f16
// scales), outputs poisoned with NaN first; f32 output must match bit for bit, bf16 output must be the
// round-to-nearest-even of the CPU value.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/dequantize.hpp"

using namespace infer;
using namespace infer::test;

namespace {

// New types at the end: each type's random blocks come from one generator in this order, so the earlier
// types keep the inputs of runs already recorded.
const DType kTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0, DType::q4_0,   DType::q4_1,  DType::q4_k,
                        DType::q5_k, DType::q6_k, DType::q5_0, DType::q5_1, DType::iq4_nl, DType::iq4_xs};

}  // namespace

TEST_CASE("CUDA dequantize matches the CPU reference for every type", "[cuda][quant]") {
  std::mt19937 rng(test_seed("CUDA dequantize, every type"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (DType t : kTypes) {
    // 16-byte aligned output (vector stores) and an output shifted by one element (scalar stores).
    for (std::size_t shift : {0, 1}) {
      const std::size_t elems = static_cast<std::size_t>(info(t).block_elems) * (257 + rng() % 700);
      INFO("type " << name(t) << ", " << elems << " values, output shifted by " << shift);
      const auto src = random_tensor(t, elems, rng);
      std::vector<float> ref(elems);
      kernels::cpu::dequantize(t, src, ref);

      test::DeviceMem d_src(src.size()), d_f32((elems + shift) * 4), d_bf16((elems + shift) * 2);
      CUDA_REQUIRE(cudaMemcpy(d_src.p, src.data(), src.size(), cudaMemcpyHostToDevice));
      const std::vector<float> poison(elems + shift, std::numeric_limits<float>::quiet_NaN());
      CUDA_REQUIRE(cudaMemcpy(d_f32.p, poison.data(), poison.size() * 4, cudaMemcpyHostToDevice));
      CUDA_REQUIRE(cudaMemset(d_bf16.p, 0xff, (elems + shift) * 2));  // 0xffff is a bf16 NaN

      float* out32 = static_cast<float*>(d_f32.p) + shift;
      auto* out16 = static_cast<std::uint16_t*>(d_bf16.p) + shift;
      kernels::cuda::dequantize(t, d_src.p, out32, elems, stream);
      kernels::cuda::dequantize(t, d_src.p, out16, elems, stream);
      CUDA_REQUIRE(cudaStreamSynchronize(stream));

      std::vector<float> got32(elems + shift);
      std::vector<std::uint16_t> got16(elems + shift);
      CUDA_REQUIRE(cudaMemcpy(got32.data(), d_f32.p, got32.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_REQUIRE(cudaMemcpy(got16.data(), d_bf16.p, got16.size() * 2, cudaMemcpyDeviceToHost));
      if (shift) {
        CHECK(std::isnan(got32[0]));  // nothing written before the output
        CHECK(got16[0] == 0xffff);
      }
      int bad32 = 0, bad16 = 0;
      for (std::size_t i = 0; i < elems; ++i) {
        const float g = got32[i + shift], r = ref[i];
        if (std::memcmp(&g, &r, 4) != 0 && ++bad32 <= 5) FAIL_CHECK("f32 value " << i << ": " << g << " != " << r);
        const std::uint16_t h = got16[i + shift];
        const float hf = bf16_to_f32(h);
        const bool ok = h == f32_to_bf16(r) && std::fabs(hf - r) <= std::ldexp(std::fabs(r), -8);
        if (!ok && ++bad16 <= 5) FAIL_CHECK("bf16 value " << i << ": " << hf << " vs " << r);
      }
      CHECK(bad32 == 0);
      CHECK(bad16 == 0);
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("CUDA dequantize of a large tensor (grid-stride path)", "[cuda][quant]") {
  std::mt19937 rng(99);
  // 1.28M groups of 8: more than the 4096 x 256 threads of the largest grid, so threads loop.
  const std::size_t elems = std::size_t{256} * 40000;
  const auto src = random_tensor(DType::q4_k, elems, rng);
  std::vector<float> ref(elems);
  kernels::cpu::dequantize(DType::q4_k, src, ref);
  test::DeviceMem d_src(src.size()), d_out(elems * 4);
  CUDA_REQUIRE(cudaMemcpy(d_src.p, src.data(), src.size(), cudaMemcpyHostToDevice));
  CUDA_REQUIRE(cudaMemset(d_out.p, 0xff, elems * 4));
  kernels::cuda::dequantize(DType::q4_k, d_src.p, static_cast<float*>(d_out.p), elems, nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<float> got(elems);
  CUDA_REQUIRE(cudaMemcpy(got.data(), d_out.p, elems * 4, cudaMemcpyDeviceToHost));
  CHECK(std::memcmp(got.data(), ref.data(), elems * 4) == 0);
}

TEST_CASE("CUDA dequantize rejects bad arguments", "[cuda][quant]") {
  test::DeviceMem src(1024), dst(1024);
  auto* out = static_cast<float*>(dst.p);
  CHECK_THROWS_AS(kernels::cuda::dequantize(DType::q4_k, src.p, out, 100, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kernels::cuda::dequantize(DType::q4_k, src.p, out, 100, nullptr),
                    Catch::Contains("100 values") && Catch::Contains("block size 256"));
  CHECK_THROWS_AS(kernels::cuda::dequantize(DType::q8_0, nullptr, out, 32, nullptr), InvalidArgument);
  CHECK_THROWS_WITH(kernels::cuda::dequantize(DType::q8_0, src.p, static_cast<float*>(nullptr), 32, nullptr),
                    Catch::Contains("destination"));
  CHECK_THROWS_AS(kernels::cuda::dequantize(DType::f32, static_cast<char*>(src.p) + 2, out, 4, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kernels::cuda::dequantize(DType::int8, src.p, out, 4, nullptr), UnsupportedError);
  CHECK_NOTHROW(kernels::cuda::dequantize(DType::q8_0, nullptr, out, 0, nullptr));
}

TEST_CASE("CUDA dequantize_rows gathers embedding rows equal to the CPU's", "[cuda][quant]") {
  // An embedding kept in its GGUF blocks: rows picked by id (repeats and the last row included), each equal to
  // cpu::dequantize of that row bit for bit; the output poisoned first.
  std::mt19937 rng(test_seed("CUDA dequantize_rows"));
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreate(&stream));
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q4_k, DType::q5_k,
                  DType::q6_k, DType::iq4_nl, DType::iq4_xs}) {
    const std::int64_t rows = 37, cols = info(t).block_elems == 32 ? 32 * 45 : 256 * 6;
    INFO("type " << name(t));
    const auto blocks = random_tensor(t, static_cast<std::size_t>(rows * cols), rng);
    std::vector<float> all(static_cast<std::size_t>(rows * cols));
    kernels::cpu::dequantize(t, blocks, all);
    const std::vector<std::int32_t> ids = {5, 0, 36, 5, 17, 36, 1};
    test::DeviceMem dw(blocks.size()), di(ids.size() * 4), dx(ids.size() * static_cast<std::size_t>(cols) * 4);
    upload(dw.p, blocks);
    upload(di.p, ids);
    CUDA_REQUIRE(cudaMemset(dx.p, 0xff, ids.size() * static_cast<std::size_t>(cols) * 4));
    kernels::cuda::dequantize_rows(t, dw.p, di.as<std::int32_t>(), static_cast<std::int64_t>(ids.size()), cols,
                                   dx.as<float>(), stream);
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const auto got = download<float>(dx.p, ids.size() * static_cast<std::size_t>(cols));
    int bad = 0;
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (std::int64_t c = 0; c < cols; ++c) {
        const float want = all[static_cast<std::size_t>(ids[i] * cols + c)];
        const float g = got[i * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
        if (std::memcmp(&want, &g, 4) != 0 && ++bad <= 3) FAIL_CHECK("row " << i << " col " << c << ": " << g << " vs " << want);
      }
    CHECK(bad == 0);
  }
  CHECK_THROWS_AS(kernels::cuda::dequantize_rows(DType::bf16, nullptr, nullptr, 1, 32, nullptr, nullptr), UnsupportedError);
  CHECK_THROWS_AS(kernels::cuda::dequantize_rows(DType::q4_k, nullptr, nullptr, 1, 100, nullptr, nullptr), InvalidArgument);
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}
