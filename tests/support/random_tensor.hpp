#pragma once
// Random tensors in any type the reader knows, for tests on either backend: normal values for float types,
// random code bytes with small finite f16 scales for GGUF block types.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"

namespace infer::test {

/// Offsets of the f16 scales within a GGUF block (kept finite and small; random bits would give inf/NaN).
/// IQ4_XS's u16 at offset 2 holds bits of its sub-block scales, where any value is valid.
inline std::vector<std::size_t> scale_offsets(DType t) {
  switch (t) {
    case DType::q8_0:
    case DType::q4_0:
    case DType::q5_0:
    case DType::iq4_nl:
    case DType::iq4_xs: return {0};
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q6_k: return {208};
    default: return {};
  }
}

/// `elems` values of type `t`: N(0, 2) for f32/f16/bf16; for block types random code bytes with f16
/// scales uniform in ±0.05.
inline std::vector<std::byte> random_tensor(DType t, std::size_t elems, std::mt19937& rng) {
  const DTypeInfo ti = info(t);
  std::vector<std::byte> b(*row_bytes(t, elems));
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::normal_distribution<float> n(0.0f, 2.0f);
  auto put16 = [&](std::size_t at, std::uint16_t h) { std::memcpy(b.data() + at, &h, 2); };
  if (t == DType::f32) {
    for (std::size_t i = 0; i < elems; ++i) {
      const float v = n(rng);
      std::memcpy(b.data() + 4 * i, &v, 4);
    }
  } else if (t == DType::f16) {
    for (std::size_t i = 0; i < elems; ++i) put16(2 * i, f32_to_f16(n(rng)));
  } else if (t == DType::bf16) {
    for (std::size_t i = 0; i < elems; ++i) put16(2 * i, f32_to_bf16(n(rng)));
  } else {
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
    for (std::size_t blk = 0; blk < elems / ti.block_elems; ++blk)
      for (std::size_t off : scale_offsets(t)) put16(blk * ti.block_bytes + off, f32_to_f16(u(rng)));
  }
  return b;
}

}  // namespace infer::test
