// The CPU backend's GEMM (OpenBLAS) and the decoder's elementwise kernels. Plain loops the compiler
// vectorizes; the GEMMs are where the time goes, and OpenBLAS threads those.
#include "infer/kernels/cpu_ops.hpp"

#include <cblas.h>

#include <cmath>
#include <limits>

#include "infer/core/error.hpp"
#include "infer/quant/dequantize.hpp"

namespace infer::kernels::cpu {
namespace {

/// cblas takes int sizes (OpenBLAS's default blasint); a larger one would silently wrap.
blasint blas_size(std::int64_t n, const char* what) {
  if (n < 0 || n > std::numeric_limits<blasint>::max())
    throw InvalidArgument(detail::cat("gemm_xwt: ", what, " = ", n, " does not fit OpenBLAS's ",
                                      sizeof(blasint) * 8, "-bit sizes"));
  return static_cast<blasint>(n);
}

}  // namespace

void gemm_xwt(const float* x, const float* w, float* y, std::int64_t rows, std::int64_t out, std::int64_t in) {
  const blasint m = blas_size(rows, "rows"), n = blas_size(out, "out"), k = blas_size(in, "in");
  if (m == 0 || n == 0) return;
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
}

std::string blas_info() {
  return detail::cat(openblas_get_config(), "; core ", openblas_get_corename(), "; ", openblas_get_num_threads(),
                     " threads");
}

void rms_norm(const float* x, const float* weight, float* y, std::int64_t rows, std::int64_t dim, float eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (std::int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(dim) + eps));
    for (std::int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void rope_table(const std::int32_t* positions, std::int64_t rows, const float* inv_freq, std::int64_t half,
                float* cos_sin) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* cs = cos_sin + r * 2 * half;
    const double pos = positions[r];
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = pos * static_cast<double>(inv_freq[i]);
      cs[2 * i] = static_cast<float>(std::cos(angle));
      cs[2 * i + 1] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope(float* x, std::int64_t rows, std::int64_t heads, std::int64_t head_dim, const float* cos_sin,
          RopeStyle style) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* cs = cos_sin + r * 2 * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      // The pair (a, b) at distance `stride` starting at `first(i)`; both styles rotate by the same angles.
      const std::int64_t stride = style == RopeStyle::neox ? half : 1;
      const std::int64_t step = style == RopeStyle::neox ? 1 : 2;
      for (std::int64_t i = 0; i < half; ++i) {
        float& a = v[i * step];
        float& b = v[i * step + stride];
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = a0 * s + b0 * c;
      }
    }
  }
}

void swiglu(float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(float* y, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t dim) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * dim;
    for (std::int64_t i = 0; i < dim; ++i) yr[i] += bias[i];
  }
}

}  // namespace infer::kernels::cpu
