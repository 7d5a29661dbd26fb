#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"

using namespace infer;

TEST_CASE("f16 decodes normals, subnormals, zeros, inf and NaN exactly", "[core][half]") {
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(std::signbit(f16_to_f32(0x8000)));
  CHECK(std::isinf(f16_to_f32(0x7c00)));
  CHECK(std::isnan(f16_to_f32(0x7e00)));
}

TEST_CASE("f16 round-trips every finite value and rounds to nearest even", "[core][half]") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf/NaN
    REQUIRE(f32_to_f16(f16_to_f32(bits)) == bits);
  }
  // 1 + 2^-11 is halfway between 1 and the next f16 (1 + 2^-10): ties go to the even mantissa (1).
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(f32_to_f16(1e6f) == 0x7c00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // halfway to the smallest subnormal: even
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps NaN", "[core][half]") {
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie → even
  CHECK(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie → even (up)
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("block formats have the sizes GGUF defines", "[core][dtype]") {
  CHECK(row_bytes(DType::q4_1, 576) == 576 / 32 * 20);
  CHECK(row_bytes(DType::q6_k, 512) == 2 * 210);
  CHECK_FALSE(row_bytes(DType::q4_k, 100).has_value());
  CHECK(row_bytes(DType::bf16, 7) == 14);
  CHECK_FALSE(row_bytes(DType::f32, 1ull << 62).has_value());  // 2^64 bytes: would wrap to 0
  CHECK(row_bytes(DType::f32, (1ull << 62) - 1) == ((1ull << 62) - 1) * 4);
}
