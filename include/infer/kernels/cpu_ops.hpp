#pragma once
/// \file
/// The CPU backend's non-template kernels: the GEMM every Quantizer's CPU matmul ends in (OpenBLAS),
/// and the decoder's elementwise steps (RMSNorm, RoPE, SwiGLU, residual add). Compiled once in
/// kernels/cpu/ops.cpp (part of infer::kernels), so this header needs neither <cblas.h> nor OpenBLAS's
/// include folder: a consumer that only includes infer headers still builds.
///
/// The namespace is `infer::kernels::cpu`, not `infer::cpu`: `infer::cpu` is the backend tag
/// (core/backend.hpp), and a namespace of the same name cannot coexist with it in one translation unit.
///
/// Conventions: row-major, rows are tokens, f32. Sizes are checked by the callers (the model checks
/// shapes once at load), so these functions trust their arguments — they are the hot loop.

#include <cstddef>
#include <cstdint>

#include <span>
#include <string>

#include "infer/core/dtype.hpp"
#include "infer/model/model_config.hpp"

namespace infer::kernels::cpu {

/// y[rows][out] = x[rows][in] · w[out][in]ᵀ (a linear layer without bias). One row goes through
/// sgemv, more through sgemm: OpenBLAS's sgemm with M = 1 is slower than its gemv on small shapes.
void gemm_xwt(const float* x, const float* w, float* y, std::int64_t rows, std::int64_t out, std::int64_t in);

/// Which BLAS the GEMMs run on, as OpenBLAS reports it: its build configuration, the kernel it picked
/// for this CPU, and its thread count (e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64;
/// core SkylakeX; 16 threads"). Printed by the programs that time the CPU path, so a slow run can be told apart
/// from a BLAS that fell back to a generic kernel or to one thread.
std::string blas_info();

/// y[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight, for each of `rows` rows of `dim` values.
/// The mean is accumulated in double so long rows do not lose the small terms. y may equal x.
void rms_norm(const float* x, const float* weight, float* y, std::int64_t rows, std::int64_t dim, float eps);

/// cos/sin of position * inv_freq[i] for each row's position: cos_sin[r][2 * i] = cos,
/// cos_sin[r][2 * i + 1] = sin, i < half. Computed once per step and shared by every layer's q and k.
/// The angle is taken in double: positions of 10^5 times a frequency near 1 lose digits in f32.
void rope_table(const std::int32_t* positions, std::int64_t rows, const float* inv_freq, std::int64_t half,
                float* cos_sin);

/// Rotates `heads` heads of `head_dim` values in each of `rows` rows of x (row stride heads * head_dim)
/// in place, by the angles of `cos_sin` (rope_table's layout, head_dim / 2 pairs per row).
/// neox rotates (i, i + head_dim/2); interleaved rotates (2i, 2i+1): see RopeStyle.
void rope(float* x, std::int64_t rows, std::int64_t heads, std::int64_t head_dim, const float* cos_sin,
          RopeStyle style);

/// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], for n values.
void swiglu(float* gate, const float* up, std::size_t n);

/// y[i] += x[i], for n values (the residual connections).
void add(float* y, const float* x, std::size_t n);

/// y[r][i] += bias[i] for each of `rows` rows of `dim` values (q/k/v biases of Qwen2).
void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t dim);

}  // namespace infer::kernels::cpu
