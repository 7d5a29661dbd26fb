#pragma once
/// \file
/// The inputs of a decoder pre-norm (kernels::cuda::ResidualNorm) for the [cuda] tests of the GEMVs that compute it
/// in their prologue (gguf_gemv, bf16_gemv, fp8_gemv), and the check of the x they write against the CPU's norm.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "infer/core/half.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "support/cuda_test_support.hpp"

namespace infer::test {

/// M rows of K: residual ~ N(0, 2) f32, delta ~ N(0, 1) bf16, the norm's weight ~ N(1, 0.3) (K values), and r =
/// residual + f32(delta), what the kernels must write bit for bit.
struct PreNormCase {
  std::vector<float> residual, weight, sum;
  std::vector<std::uint16_t> delta;
  PreNormCase(int M, std::int64_t K, std::mt19937& rng)
      : residual(static_cast<std::size_t>(M * K)), weight(static_cast<std::size_t>(K)), sum(residual.size()) {
    std::normal_distribution<float> nd(0.0f, 2.0f), nw(1.0f, 0.3f);
    for (auto& v : residual) v = nd(rng);
    for (auto& v : weight) v = nw(rng);
    delta = random_bf16(residual.size(), rng);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + bf16_to_f32(delta[i]);
  }

  /// Checks x (bf16, M rows of K) against the CPU's RMSNorm of r: within one bf16 ulp of the value (the inverse
  /// norm's rounding: rsqrtf, the order of the sum of squares). Up to five failures are named.
  void check_x(const std::vector<std::uint16_t>& xn, int M, std::int64_t K, float eps) const {
    std::vector<float> cpu(sum.size());
    kernels::cpu::rms_norm(sum.data(), weight.data(), cpu.data(), M, K, eps);
    int far = 0;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      const float ulp = std::ldexp(std::fabs(cpu[i]), -7) + 1e-30f;
      if (!(std::fabs(bf16_to_f32(xn[i]) - cpu[i]) <= ulp) && ++far <= 5)
        FAIL_CHECK("x[" << i << "] = " << bf16_to_f32(xn[i]) << ", the CPU's norm " << cpu[i]);
    }
    CHECK(far == 0);
  }
};

}  // namespace infer::test
