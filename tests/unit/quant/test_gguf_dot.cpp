// The integer dot products of quant/gguf_dot.hpp (what the CUDA GGUF GEMV runs) against the dequantized
// blocks: for every type, random blocks and random activations, each segment's segment_dot equals
// Σ dequantize(w)_l · (d_x · q_l) computed in double, up to f32 rounding. This pins the code layouts of
// all ten formats in CI, where no GPU runs; the [cuda] test then checks the GPU against the same functions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/gguf_dot.hpp"

using namespace infer;
using namespace infer::quant;

namespace {

/// Byte offsets of a block's f16 fields, set to finite scales (random bytes there could be NaN).
std::vector<std::size_t> f16_fields(DType t) {
  switch (t) {
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q6_k: return {208};
    default: return {0};
  }
}

std::vector<std::uint8_t> random_blocks(DType t, std::size_t blocks, std::mt19937& rng) {
  const auto bb = static_cast<std::size_t>(info(t).block_bytes);
  std::vector<std::uint8_t> b(blocks * bb);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng() & 0xff);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  for (std::size_t k = 0; k < blocks; ++k)
    for (std::size_t off : f16_fields(t)) {
      const std::uint16_t h = f32_to_f16(u(rng));
      std::memcpy(b.data() + k * bb + off, &h, 2);
    }
  return b;
}

template <DType T>
void check_type(std::mt19937& rng) {
  constexpr int elems = static_cast<int>(info(T).block_elems);
  constexpr int segs = DotFormat<T>::segs;
  const std::size_t blocks = 64;
  const auto w = random_blocks(T, blocks, rng);
  std::vector<float> wf(blocks * elems);
  kernels::cpu::dequantize(T, std::as_bytes(std::span(w)), wf);

  std::normal_distribution<float> n(0.0f, 1.5f);
  std::vector<float> x(blocks * elems);
  for (auto& v : x) v = n(rng);
  for (int z = 0; z < kQ8Block; ++z) x[static_cast<std::size_t>(z)] = 0.0f;  // an all-zero activation block
  std::vector<std::int8_t> xq(x.size());
  std::vector<Q8Scale> xs(x.size() / kQ8Block);
  for (std::size_t k = 0; k < xs.size(); ++k) {
    xs[k] = quantize_q8_block(x.data() + k * kQ8Block, xq.data() + k * kQ8Block);
    int lo = 0, hi = 0;
    for (int i = 0; i < kQ8Block; ++i) {
      const float v = x[k * kQ8Block + static_cast<std::size_t>(i)];
      const int q = xq[k * kQ8Block + static_cast<std::size_t>(i)];
      REQUIRE(std::abs(q) <= 127);
      REQUIRE(std::fabs(xs[k].d * static_cast<float>(q) - v) <= 0.5001f * xs[k].d + 1e-30f);  // rounding to nearest
      (i < 16 ? lo : hi) += q;
    }
    REQUIRE(xs[k].sum_lo == lo);
    REQUIRE(xs[k].sum_hi == hi);
  }
  CHECK(xs[0].d == 0.0f);

  double worst = 0.0;
  for (std::size_t blk = 0; blk < blocks; ++blk) {
    for (int s = 0; s < segs; ++s) {
      SegCodes g;
      decode_segment<T>(w.data() + blk * static_cast<std::size_t>(info(T).block_bytes), s, g);
      const std::size_t v0 = blk * elems + static_cast<std::size_t>(s) * kQ8Block;
      std::uint32_t xw[8];
      std::memcpy(xw, xq.data() + v0, 32);
      const float got = segment_dot<T>(g, xw, xs[v0 / kQ8Block]);
      double want = 0.0, mag = 0.0;
      for (int l = 0; l < kQ8Block; ++l) {
        const double xv = static_cast<double>(xs[v0 / kQ8Block].d) * xq[v0 + static_cast<std::size_t>(l)];
        want += static_cast<double>(wf[v0 + static_cast<std::size_t>(l)]) * xv;
        mag += std::fabs(static_cast<double>(wf[v0 + static_cast<std::size_t>(l)]) * xv);
      }
      // f32 rounding of the scale products and of one sum of up to 32 integer-exact terms, with slack;
      // a wrong code layout misses by the size of a term (~mag / 32), three orders above this bound.
      const double err = std::fabs(static_cast<double>(got) - want), bound = 1e-5 * mag + 1e-30;
      INFO(name(T) << " block " << blk << " segment " << s << ": got " << got << ", want " << want);
      REQUIRE(err <= bound);
      worst = std::max(worst, err / bound);
    }
  }
  INFO(name(T) << " worst error / bound " << worst);
  CHECK(worst <= 1.0);
}

}  // namespace

TEST_CASE("dot4 is dp4a's signed byte dot product", "[quant][gguf_dot]") {
  CHECK(dot4(0x01020304u, 0x01010101u, 0) == 10);
  CHECK(dot4(0xff7f80ffu, 0x02020202u, 5) == 5 + 2 * (-1 + 127 - 128 - 1));
}

TEST_CASE("spread_bits4 moves bit k to bit 8k", "[quant][gguf_dot]") {
  for (std::uint32_t h = 0; h < 16; ++h) {
    std::uint32_t want = 0;
    for (int k = 0; k < 4; ++k) want |= ((h >> k) & 1u) << (8 * k);
    CHECK(spread_bits4(h | 0xfff0u) == want);  // bits above the 4 are ignored
  }
}

TEST_CASE("segment_dot equals the dequantized dot product for every GGUF type", "[quant][gguf_dot]") {
  std::mt19937 rng(20261206);
  check_type<DType::q8_0>(rng);
  check_type<DType::q4_0>(rng);
  check_type<DType::q4_1>(rng);
  check_type<DType::q5_0>(rng);
  check_type<DType::q5_1>(rng);
  check_type<DType::q4_k>(rng);
  check_type<DType::q5_k>(rng);
  check_type<DType::q6_k>(rng);
  check_type<DType::iq4_nl>(rng);
  check_type<DType::iq4_xs>(rng);
  STATIC_REQUIRE(!dot_supports(DType::bf16));
  STATIC_REQUIRE(dot_supports(DType::iq4_xs));
}
