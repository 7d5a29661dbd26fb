#pragma once
/// \file
/// Element types, including the block-quantized GGUF formats. A block format stores `block_elems`
/// values in `block_bytes` bytes; plain types are blocks of one. Sizes here are the single source for
/// every reader and kernel, so a tensor's byte size is always `row_bytes(type, row) * rows`.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace infer {

enum class DType : std::uint8_t {
  f32,
  f16,
  bf16,
  fp8_e4m3,
  int8,
  q8_0,  ///< 32 values: f16 scale + 32 int8
  q4_0,  ///< 32 values: f16 scale + 16 bytes of 4-bit codes (value = scale * (q - 8))
  q4_1,  ///< 32 values: f16 scale, f16 min + 16 bytes of 4-bit codes (value = scale * q + min)
  q5_0,  ///< 32 values: f16 scale, 4 bytes of fifth bits, 16 bytes of 4-bit codes (value = scale * (q - 16))
  q5_1,  ///< 32 values: f16 scale, f16 min, 4 bytes of fifth bits, 16 bytes of 4-bit codes (scale * q + min)
  q4_k,  ///< 256 values: f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales/mins, 128 bytes codes
  q5_k,  ///< 256 values: as q4_k plus 32 bytes of high bits
  q6_k,  ///< 256 values: 128 bytes low 4 bits, 64 bytes high 2 bits, 16 int8 scales, f16 d
  iq4_nl,  ///< 32 values: f16 scale + 16 bytes of 4-bit indices into 16 fixed non-uniform levels
  iq4_xs,  ///< 256 values: f16 d, 6-bit sub-block scales (2 + 4 bytes), 128 bytes of iq4_nl indices
  int32,   ///< packed codes and indices of AWQ/GPTQ checkpoints (qweight, qzeros, g_idx): read by their quantizer
};

struct DTypeInfo {
  std::string_view name;
  std::uint32_t block_elems;
  std::uint32_t block_bytes;
  bool quantized;
};

constexpr DTypeInfo info(DType t) noexcept {
  switch (t) {
    case DType::f32: return {"f32", 1, 4, false};
    case DType::f16: return {"f16", 1, 2, false};
    case DType::bf16: return {"bf16", 1, 2, false};
    case DType::fp8_e4m3: return {"fp8_e4m3", 1, 1, false};
    case DType::int8: return {"int8", 1, 1, false};
    case DType::q8_0: return {"q8_0", 32, 34, true};
    case DType::q4_0: return {"q4_0", 32, 18, true};
    case DType::q4_1: return {"q4_1", 32, 20, true};
    case DType::q5_0: return {"q5_0", 32, 22, true};
    case DType::q5_1: return {"q5_1", 32, 24, true};
    case DType::q4_k: return {"q4_k", 256, 144, true};
    case DType::q5_k: return {"q5_k", 256, 176, true};
    case DType::q6_k: return {"q6_k", 256, 210, true};
    case DType::iq4_nl: return {"iq4_nl", 32, 18, true};
    case DType::iq4_xs: return {"iq4_xs", 256, 136, true};
    case DType::int32: return {"int32", 1, 4, false};
  }
  return {"?", 1, 0, false};
}

constexpr std::string_view name(DType t) noexcept { return info(t).name; }

/// Bytes of one row of `elems` values, or nullopt when `elems` is not a whole number of blocks (a file
/// that claims such a shape is malformed) or the byte count would not fit in 64 bits.
constexpr std::optional<std::uint64_t> row_bytes(DType t, std::uint64_t elems) noexcept {
  const DTypeInfo i = info(t);
  if (elems % i.block_elems != 0) return std::nullopt;
  const std::uint64_t blocks = elems / i.block_elems;
  if (blocks > UINT64_MAX / i.block_bytes) return std::nullopt;
  return blocks * i.block_bytes;
}

}  // namespace infer
