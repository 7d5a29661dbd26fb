#pragma once
/// \file
/// The CPU matmul of a weight kept in a compact form (INT8, FP8 codes with scales): rows of the weight are
/// decoded to f32 a tile at a time and each tile goes through the CPU GEMM, so the product is exactly
/// x · (decoded W)ᵀ in f32 and the whole f32 matrix is never held.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "infer/kernels/cpu_ops.hpp"

namespace infer::detail {

inline constexpr std::int64_t kDecodeTileRows = 256;

/// y[rows][out] = x[rows][in] · Wᵀ, where decode(o0, n, tile) writes rows [o0, o0 + n) of W into `tile`
/// ([n][in], f32).
template <class Decode>
void tiled_gemm_xwt(const float* x, std::int32_t rows, std::int64_t out, std::int64_t in, float* y, Decode&& decode) {
  thread_local std::vector<float> tile, part;
  for (std::int64_t o0 = 0; o0 < out; o0 += kDecodeTileRows) {
    const std::int64_t n = std::min(kDecodeTileRows, out - o0);
    tile.resize(static_cast<std::size_t>(n * in));
    decode(o0, n, tile.data());
    if (n == out) {  // one tile: the GEMM writes y directly
      kernels::cpu::gemm_xwt(x, tile.data(), y, rows, n, in);
      return;
    }
    part.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(n));
    kernels::cpu::gemm_xwt(x, tile.data(), part.data(), rows, n, in);
    for (std::int32_t r = 0; r < rows; ++r)
      std::memcpy(y + r * out + o0, part.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(n),
                  static_cast<std::size_t>(n) * sizeof(float));
  }
}

}  // namespace infer::detail
