// CPU dequantization of every GGUF block type: hand-built blocks with hand-computed values, then
// gguf-py's dequantization of random blocks (tests/fixtures/quant/random_blocks.json), bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/gguf_blocks.hpp"
#include "support/fixtures.hpp"

using namespace infer;

namespace {

/// Little-endian byte buffer written field by field, the way the format defines a block.
struct Bytes {
  std::vector<std::byte> b;
  Bytes& u8(unsigned v) {
    b.push_back(static_cast<std::byte>(v));
    return *this;
  }
  Bytes& u16(unsigned v) { return u8(v & 0xff).u8(v >> 8); }
};

std::vector<float> run(DType t, const std::vector<std::byte>& src, std::size_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  kernels::cpu::dequantize(t, src, out);
  return out;
}

// Q4_K / Q5_K sub-block scales and mins used below, and their 12-byte packing worked out by hand:
//   scales 1 2 3 4 | 33=0b10'0001 50=0b11'0010 63=0b11'1111 17=0b01'0001
//   mins   0 1 10 63 | 20=0b01'0100 35=0b10'0011  5=0b00'0101 48=0b11'0000
//   bytes 0-3: scale j | (bits 4-5 of scale j+4) << 6  -> 0x81 0xC2 0xC3 0x44
//   bytes 4-7: min j   | (bits 4-5 of min j+4) << 6    -> 0x40 0x81 0x0A 0xFF
//   bytes 8-11: low 4 bits of scale j+4 | low 4 bits of min j+4 << 4 -> 0x41 0x32 0x5F 0x01
constexpr float kScale[8] = {1, 2, 3, 4, 33, 50, 63, 17};
constexpr float kMin[8] = {0, 1, 10, 63, 20, 35, 5, 48};
constexpr unsigned kPacked[12] = {0x81, 0xC2, 0xC3, 0x44, 0x40, 0x81, 0x0A, 0xFF, 0x41, 0x32, 0x5F, 0x01};

DType dtype_named(const std::string& s) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  if (s == "Q8_0") return DType::q8_0;
  if (s == "Q4_0") return DType::q4_0;
  if (s == "Q4_1") return DType::q4_1;
  if (s == "Q5_0") return DType::q5_0;
  if (s == "Q5_1") return DType::q5_1;
  if (s == "Q4_K") return DType::q4_k;
  if (s == "Q5_K") return DType::q5_k;
  if (s == "Q6_K") return DType::q6_k;
  if (s == "IQ4_NL") return DType::iq4_nl;
  if (s == "IQ4_XS") return DType::iq4_xs;
  FAIL("unknown type in fixture: " << s);
  return DType::f32;
}

std::vector<std::byte> from_hex(const std::string& h) {
  std::vector<std::byte> out(h.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(std::stoul(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

}  // namespace

TEST_CASE("unpack_scale_min_k4 decodes the 12-byte packing", "[quant]") {
  std::uint8_t s[12];
  for (int i = 0; i < 12; ++i) s[i] = static_cast<std::uint8_t>(kPacked[i]);
  for (int j = 0; j < 8; ++j) {
    const auto sm = quant::unpack_scale_min_k4(j, s);
    CHECK(sm.scale == kScale[j]);
    CHECK(sm.min == kMin[j]);
  }
}

TEST_CASE("Q8_0: value = d * q", "[quant]") {
  Bytes b;
  b.u16(0x3400);  // d = 0.25
  for (int i = 0; i < 32; ++i) b.u8(static_cast<unsigned>(static_cast<std::uint8_t>(i - 16)));  // q = -16..15
  const auto v = run(DType::q8_0, b.b, 32);
  for (int i = 0; i < 32; ++i) CHECK(v[i] == 0.25f * static_cast<float>(i - 16));
  CHECK(v[0] == -4.0f);
  CHECK(v[31] == 3.75f);
}

TEST_CASE("Q4_0: value = d * (q - 8), low nibbles first", "[quant]") {
  Bytes b;
  b.u16(0x4000);  // d = 2
  for (unsigned j = 0; j < 16; ++j) b.u8(j | ((15 - j) << 4));
  const auto v = run(DType::q4_0, b.b, 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(v[j] == 2.0f * static_cast<float>(j - 8));
    CHECK(v[16 + j] == 2.0f * static_cast<float>(7 - j));
  }
  CHECK(v[0] == -16.0f);
  CHECK(v[15] == 14.0f);
  CHECK(v[16] == 14.0f);
  CHECK(v[31] == -16.0f);
}

TEST_CASE("Q4_1: d = 0.5, m = -1, codes 0..15", "[quant]") {
  Bytes b;
  b.u16(0x3800).u16(0xBC00);  // d = 0.5, m = -1
  for (unsigned j = 0; j < 16; ++j) b.u8(j | ((15 - j) << 4));
  const auto v = run(DType::q4_1, b.b, 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(v[j] == 0.5f * static_cast<float>(j) - 1.0f);
    CHECK(v[16 + j] == 0.5f * static_cast<float>(15 - j) - 1.0f);
  }
  CHECK(v[0] == -1.0f);
  CHECK(v[15] == 6.5f);
  CHECK(v[16] == 6.5f);
  CHECK(v[31] == -1.0f);
}

// Q5_0 / Q5_1 fifth bits used below: qh = 0xFF00F00F as bytes 0F F0 00 FF, so values 0-3, 12-15 and
// 24-31 have their fifth bit set.
constexpr unsigned kQh[4] = {0x0F, 0xF0, 0x00, 0xFF};
bool fifth_bit(int j) { return (0xFF00F00Fu >> j) & 1u; }

TEST_CASE("Q5_0: value = d * (q - 16), bit j of qh is value j's fifth bit", "[quant]") {
  Bytes b;
  b.u16(0x4000);  // d = 2
  for (unsigned x : kQh) b.u8(x);
  for (unsigned j = 0; j < 16; ++j) b.u8(j | ((15 - j) << 4));
  REQUIRE(b.b.size() == 22);
  const auto v = run(DType::q5_0, b.b, 32);
  for (int j = 0; j < 32; ++j) {
    const int q = (j < 16 ? j : 31 - j) + (fifth_bit(j) ? 16 : 0);
    CHECK(v[j] == 2.0f * static_cast<float>(q - 16));
  }
  CHECK(v[0] == 0.0f);     // q = 0 + 16
  CHECK(v[4] == -24.0f);   // q = 4, no fifth bit
  CHECK(v[15] == 30.0f);   // q = 15 + 16
  CHECK(v[16] == -2.0f);   // high nibble of byte 0 = 15, no fifth bit
  CHECK(v[24] == 14.0f);   // high nibble of byte 8 = 7, + 16
  CHECK(v[31] == 0.0f);    // high nibble of byte 15 = 0, + 16
}

TEST_CASE("Q5_1: value = d * q + m, q 5 bits as Q5_0's", "[quant]") {
  Bytes b;
  b.u16(0x3800).u16(0xBC00);  // d = 0.5, m = -1
  for (unsigned x : kQh) b.u8(x);
  for (unsigned j = 0; j < 16; ++j) b.u8(j | ((15 - j) << 4));
  REQUIRE(b.b.size() == 24);
  const auto v = run(DType::q5_1, b.b, 32);
  for (int j = 0; j < 32; ++j) {
    const int q = (j < 16 ? j : 31 - j) + (fifth_bit(j) ? 16 : 0);
    CHECK(v[j] == 0.5f * static_cast<float>(q) - 1.0f);
  }
  CHECK(v[0] == 7.0f);
  CHECK(v[4] == 1.0f);
  CHECK(v[15] == 14.5f);
  CHECK(v[16] == 6.5f);
  CHECK(v[31] == 7.0f);
}

// IQ4_NL's levels as llama.cpp defines them (kvalues_iq4nl), written out here rather than taken from the
// library so that a wrong table there fails.
constexpr float kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

TEST_CASE("iq4nl_level looks up the 16 IQ4_NL levels", "[quant]") {
  for (int q = 0; q < 16; ++q) {
    CHECK(static_cast<float>(quant::iq4nl_level(q)) == kIq4Levels[q]);
    CHECK(quant::iq4nl_level(q) == quant::kIq4NlLevels[q]);
  }
}

TEST_CASE("IQ4_NL: value = d * level[q], nibbles as Q4_0's", "[quant]") {
  Bytes b;
  b.u16(0x3800);  // d = 0.5
  for (unsigned j = 0; j < 16; ++j) b.u8(j | ((15 - j) << 4));
  const auto v = run(DType::iq4_nl, b.b, 32);
  for (int j = 0; j < 16; ++j) {
    CHECK(v[j] == 0.5f * kIq4Levels[j]);
    CHECK(v[16 + j] == 0.5f * kIq4Levels[15 - j]);
  }
  CHECK(v[0] == -63.5f);
  CHECK(v[8] == 0.5f);
  CHECK(v[15] == 56.5f);
  CHECK(v[16] == 56.5f);
  CHECK(v[31] == -63.5f);
}

TEST_CASE("IQ4_XS: value = (d * (ls_s - 32)) * level[q], 6-bit ls from scales_l and scales_h", "[quant]") {
  // Sub-block scales ls = 0 1 31 32 33 47 48 63 (dl = d * -32 -31 -1 0 1 15 16 31), packed by hand:
  //   low nibbles 0 1 15 0 1 15 0 15, two per byte, sub-block 2k low -> scales_l = 10 0F F1 F0
  //   bits 4-5    0 0 1 2 2 2 3 3, at bits 2s..2s+1 -> scales_h = 0b11'11'10'10'10'01'00'00 = 0xFA90
  constexpr float kDl[8] = {-32, -31, -1, 0, 1, 15, 16, 31};
  Bytes b;
  b.u16(0x3400).u16(0xFA90);  // d = 0.25
  for (unsigned x : {0x10u, 0x0Fu, 0xF1u, 0xF0u}) b.u8(x);
  for (unsigned i = 0; i < 128; ++i) b.u8(i);  // byte i: low nibble i % 16, high nibble i / 16
  REQUIRE(b.b.size() == 136);
  const auto v = run(DType::iq4_xs, b.b, 256);
  // Sub-block s reads bytes 16s + l % 16: low nibbles (l) for l < 16, high nibbles (s) above.
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 32; ++l) {
      const int q = l < 16 ? l : s;
      CHECK(v[32 * s + l] == (0.25f * kDl[s]) * kIq4Levels[q]);
    }
  CHECK(v[0] == 1016.0f);           // s=0: -8 * -127
  CHECK(v[31] == 1016.0f);          // s=0, high nibble 0
  CHECK(v[72] == -0.25f);           // s=2, l=8: -0.25 * 1
  CHECK(v[101] == 0.0f);            // s=3: ls = 32
  CHECK(v[180] == -131.25f);        // s=5, l=20: 3.75 * -35
  CHECK(v[239] == 875.75f);         // s=7, l=15: 7.75 * 113
}

TEST_CASE("Q4_K: value = d * scale_s * q - dmin * min_s", "[quant]") {
  Bytes b;
  b.u16(0x3C00).u16(0x3800);  // d = 1, dmin = 0.5
  for (unsigned x : kPacked) b.u8(x);
  for (unsigned i = 0; i < 128; ++i) b.u8(i);  // byte i: low nibble i % 16, high nibble i / 16
  const auto v = run(DType::q4_k, b.b, 256);
  // Sub-block s reads bytes 32*(s/2) + l: low nibbles (l % 16) for even s, high nibbles
  // (2*(s/2) + l/16) for odd s.
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 32; ++l) {
      const int q = s % 2 == 0 ? l % 16 : 2 * (s / 2) + l / 16;
      CHECK(v[32 * s + l] == kScale[s] * static_cast<float>(q) - 0.5f * kMin[s]);
    }
  CHECK(v[0] == 0.0f);
  CHECK(v[15] == 15.0f);
  CHECK(v[32] == -0.5f);   // s=1: 2*0 - 0.5
  CHECK(v[63] == 1.5f);    // s=1, q=1: 2*1 - 0.5
  CHECK(v[133] == 155.0f);  // s=4, q=5: 33*5 - 10
  CHECK(v[255] == 95.0f);   // s=7, q=7: 17*7 - 24
}

TEST_CASE("Q5_K: the fifth bit of value l of sub-block s is bit s of qh[l]", "[quant]") {
  Bytes b;
  b.u16(0x3C00).u16(0x3800);
  for (unsigned x : kPacked) b.u8(x);
  for (int l = 0; l < 32; ++l) b.u8(l < 16 ? 0xA5 : 0x00);  // high bit set for sub-blocks 0,2,5,7 when l < 16
  for (unsigned i = 0; i < 128; ++i) b.u8(i);
  REQUIRE(b.b.size() == 176);
  const auto v = run(DType::q5_k, b.b, 256);
  for (int s = 0; s < 8; ++s)
    for (int l = 0; l < 32; ++l) {
      const int lo = s % 2 == 0 ? l % 16 : 2 * (s / 2) + l / 16;
      const int hi = (l < 16 && ((0xA5 >> s) & 1)) ? 16 : 0;
      CHECK(v[32 * s + l] == kScale[s] * static_cast<float>(lo + hi) - 0.5f * kMin[s]);
    }
  CHECK(v[0] == 16.0f);    // s=0: 1*(0+16) - 0
  CHECK(v[32] == -0.5f);   // s=1 has no high bit
  CHECK(v[224] == 350.0f);  // s=7, l=0: 17*(6+16) - 24
  CHECK(v[240] == 95.0f);   // s=7, l=16: 17*7 - 24
}

TEST_CASE("Q6_K: value = (d * scale) * (q - 32), q = 4 bits of ql and 2 bits of qh", "[quant]") {
  Bytes b;
  for (unsigned i = 0; i < 128; ++i) b.u8(i);              // ql
  for (int i = 0; i < 64; ++i) b.u8(0xE4);                   // qh: bit pairs 0,1,2,3 -> run k gets k
  const int scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -8};
  for (int s : scales) b.u8(static_cast<unsigned>(static_cast<std::uint8_t>(s)));
  b.u16(0x3800);  // d = 0.5
  REQUIRE(b.b.size() == 210);
  const auto v = run(DType::q6_k, b.b, 256);
  for (int j = 0; j < 256; ++j) {
    const int h = j / 128, k = (j % 128) / 32, l = j % 32;
    const int byte = 64 * h + l + 32 * (k & 1);  // ql[byte] == byte
    const int lo = k < 2 ? byte % 16 : byte / 16;
    const int q = (lo | (k << 4)) - 32;
    CHECK(v[j] == 0.5f * static_cast<float>(scales[8 * h + l / 16 + 2 * k]) * static_cast<float>(q));
  }
  CHECK(v[0] == -16.0f);   // q = -32, scale 1
  CHECK(v[40] == -8.0f);   // k=1, l=8: q = (8|16)-32 = -8, scale 2
  CHECK(v[200] == 14.0f);  // h=1, k=2, l=8: q = (4|32)-32 = 4, scale 7
  CHECK(v[255] == -92.0f);  // h=1, k=3, l=31: q = (7|48)-32 = 23, scale -8
}

TEST_CASE("F16, BF16 and F32 decode exactly", "[quant]") {
  Bytes h;
  for (unsigned x : {0x3C00u, 0xC000u, 0x7BFFu, 0x0001u, 0x3555u, 0x8000u}) h.u16(x);
  const auto f16 = run(DType::f16, h.b, 6);
  CHECK(f16[0] == 1.0f);
  CHECK(f16[1] == -2.0f);
  CHECK(f16[2] == 65504.0f);
  CHECK(f16[3] == std::ldexp(1.0f, -24));
  CHECK(f16[4] == 0.333251953125f);
  CHECK((f16[5] == 0.0f && std::signbit(f16[5])));

  Bytes bf;
  for (unsigned x : {0x3F80u, 0xC040u, 0x4049u, 0x0001u, 0x7F80u}) bf.u16(x);
  const auto b16 = run(DType::bf16, bf.b, 5);
  CHECK(b16[0] == 1.0f);
  CHECK(b16[1] == -3.0f);
  CHECK(b16[2] == 3.140625f);
  CHECK(b16[3] == std::ldexp(1.0f, -133));
  CHECK(std::isinf(b16[4]));

  std::vector<std::byte> f(8);
  const float in[2] = {-1.25f, 3e38f};
  std::memcpy(f.data(), in, 8);
  const auto f32 = run(DType::f32, f, 2);
  CHECK(f32[0] == -1.25f);
  CHECK(f32[1] == 3e38f);
}

TEST_CASE("every block type refuses partial blocks and source sizes that disagree", "[quant]") {
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q4_k, DType::q5_k,
                  DType::q6_k, DType::iq4_nl, DType::iq4_xs}) {
    const DTypeInfo ti = info(t);
    INFO("type " << ti.name);
    std::vector<float> one_block(ti.block_elems);
    for (std::size_t bytes : {std::size_t{0}, std::size_t{ti.block_bytes} - 1, std::size_t{ti.block_bytes} + 1}) {
      const std::vector<std::byte> src(bytes);
      CHECK_THROWS_AS(kernels::cpu::dequantize(t, src, one_block), InvalidArgument);
      CHECK_THROWS_WITH(kernels::cpu::dequantize(t, src, one_block),
                        Catch::Contains(std::string(ti.name)) &&
                            Catch::Contains(std::to_string(ti.block_bytes) + " bytes, but the source holds " +
                                            std::to_string(bytes)));
    }
    std::vector<float> partial(ti.block_elems + 8);
    CHECK_THROWS_AS(kernels::cpu::dequantize(t, std::vector<std::byte>(ti.block_bytes), partial), InvalidArgument);
    CHECK_THROWS_WITH(kernels::cpu::dequantize(t, std::vector<std::byte>(ti.block_bytes), partial),
                      Catch::Contains(std::string(ti.name)) &&
                          Catch::Contains("not a multiple of the block size " + std::to_string(ti.block_elems)));
  }
}

TEST_CASE("dequantize rejects sizes that disagree", "[quant]") {
  std::vector<float> out(32);
  std::vector<std::byte> src(33);
  CHECK_THROWS_AS(kernels::cpu::dequantize(DType::q8_0, src, out), InvalidArgument);
  CHECK_THROWS_WITH(kernels::cpu::dequantize(DType::q8_0, src, out),
                    Catch::Contains("q8_0") && Catch::Contains("34 bytes") && Catch::Contains("33"));
  std::vector<float> odd(33);
  CHECK_THROWS_WITH(kernels::cpu::dequantize(DType::q4_k, std::span<const std::byte>(), odd),
                    Catch::Contains("not a multiple of the block size 256"));
  std::vector<float> two(2);
  CHECK_THROWS_AS(kernels::cpu::dequantize(DType::f16, std::vector<std::byte>(3), two), InvalidArgument);
  CHECK_THROWS_AS(kernels::cpu::dequantize(DType::int8, std::vector<std::byte>(2), two), UnsupportedError);
  CHECK_NOTHROW(kernels::cpu::dequantize(DType::q6_k, std::span<const std::byte>(), std::span<float>()));
}

TEST_CASE("unaligned sources decode like aligned ones", "[quant]") {
  std::mt19937 rng(7);
  std::vector<std::byte> buf(1 + 3 * 144);
  for (auto& x : buf) x = static_cast<std::byte>(rng() & 0xff);
  for (int blk = 0; blk < 3; ++blk) {  // finite scales
    buf[1 + blk * 144] = std::byte{0x00};
    buf[2 + blk * 144] = std::byte{0x30};
    buf[3 + blk * 144] = std::byte{0x00};
    buf[4 + blk * 144] = std::byte{0x2c};
  }
  std::vector<std::byte> aligned(buf.begin() + 1, buf.end());
  const auto a = run(DType::q4_k, aligned, 768);
  std::vector<float> u(768);
  kernels::cpu::dequantize(DType::q4_k, std::span<const std::byte>(buf).subspan(1), u);
  CHECK(a == u);
}

TEST_CASE("large tensors split over threads give the serial result", "[quant]") {
  // Above the threading threshold, with a block count that does not divide evenly.
  const std::size_t n_blocks = (std::size_t{1} << 17) + 7;
  std::vector<std::byte> src(n_blocks * sizeof(quant::BlockQ4_1));
  std::mt19937 rng(42);
  for (auto& x : src) x = static_cast<std::byte>(rng() & 0xff);
  for (std::size_t b = 0; b < n_blocks; ++b) {  // scales in [2^-8, 2^-7)
    src[b * 20 + 1] = std::byte{0x1c};
    src[b * 20 + 3] = std::byte{0x9c};
  }
  const auto v = run(DType::q4_1, src, n_blocks * 32);
  bool same = true;
  for (std::size_t b = 0; b < n_blocks && same; ++b) {
    quant::BlockQ4_1 blk;
    std::memcpy(&blk, src.data() + b * 20, 20);
    float ref[32];
    quant::dequantize_block(blk, ref);
    same = std::memcmp(ref, v.data() + b * 32, sizeof ref) == 0;
    if (!same) FAIL_CHECK("block " << b << " differs");
  }
  CHECK(same);
}

TEST_CASE("gguf-py dequantization of random blocks of every type", "[quant]") {
  std::ifstream in(test::fixture("quant/random_blocks.json"));
  REQUIRE(in);
  const auto j = nlohmann::json::parse(in);
  int types = 0;
  for (const auto& c : j.at("cases")) {
    const std::string type = c.at("type");
    INFO("type " << type);
    const DType t = dtype_named(type);
    const auto src = from_hex(c.at("hex"));
    const auto expected = c.at("values").get<std::vector<double>>();
    REQUIRE(src.size() == *row_bytes(t, expected.size()));
    const auto got = run(t, src, expected.size());
    // gguf-py computes in f32 with the same operations in the same order, so every value must be equal to
    // the bit (the sign of zero included); the JSON's doubles are those f32 values, which is checked too.
    int bad = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const auto e = static_cast<float>(expected[i]);
      REQUIRE(static_cast<double>(e) == expected[i]);
      if (std::memcmp(&e, &got[i], sizeof e) != 0 && ++bad <= 5)
        FAIL_CHECK("value " << i << ": got " << std::setprecision(9) << got[i] << ", expected " << e);
    }
    CHECK(bad == 0);
    ++types;
  }
  CHECK(types == 13);
}
