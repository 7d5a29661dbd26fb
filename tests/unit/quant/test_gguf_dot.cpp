// The integer dot products of quant/gguf_dot.hpp (what the CUDA GGUF GEMV runs) against the dequantized
// blocks: for every type, random blocks and random activations, each segment's segment_dot equals
// Σ dequantize(w)_l · (d_x · q_l) computed in double, up to f32 rounding. This pins the code layouts of
// all ten formats in CI, where no GPU runs; the [cuda] test then checks the GPU against the same functions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/gguf_dot.hpp"
#include "infer/quant/gguf_units.hpp"

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


/// The CUDA GEMV's unit walk of one row of weights (K values) against one row of x, on the CPU with the same
/// functions (quant/gguf_units.hpp): x laid out in pieces by pair_piece_of / q6_run_piece_of as the kernel's
/// store lays it out, every unit decoded and dotted, the units' contributions summed. Returns the sum.
template <DType T>
double unit_walk_row(const std::uint8_t* row, const std::vector<std::int8_t>& xq, const std::vector<Q8Scale>& xs,
                     std::size_t K) {
  constexpr bool kQ6 = T == DType::q6_k;
  const std::size_t U = K / kUnitVals;
  const auto place = [](std::uint32_t v) { return kQ6 ? q6_run_piece_of(v) : pair_piece_of(v); };
  std::vector<std::int8_t> pieces(4 * U * 16, 0);
  std::vector<PieceScale> scales(kQ6 ? 4 * U : 2 * U, PieceScale{-1.0f, -1.0f});
  std::vector<int> placed(pieces.size(), 0);
  for (std::uint32_t v = 0; v < K; ++v) {
    const PiecePos p = place(v);
    const std::size_t at = (p.piece * U + p.unit) * 16 + p.at;
    REQUIRE(at < pieces.size());
    pieces[at] = xq[v];
    ++placed[at];
  }
  for (int n : placed) REQUIRE(n == 1);  // the layout is a permutation of the row
  for (std::uint32_t b = 0; b < K / kQ8Block; ++b) {
    const Q8Scale sc = xs[b];
    if (kQ6) {
      const PiecePos p0 = place(32 * b), p1 = place(32 * b + 16);
      scales[p0.piece * U + p0.unit] = {sc.d, sc.d * static_cast<float>(sc.sum_lo)};
      scales[p1.piece * U + p1.unit] = {sc.d, sc.d * static_cast<float>(sc.sum_hi)};
    } else {
      const PiecePos p = place(32 * b);
      REQUIRE(p.piece % 2 == 0);
      scales[(p.piece / 2) * U + p.unit] = {sc.d, sc.d * static_cast<float>(sc.sum_lo + sc.sum_hi)};
    }
  }
  const auto bb = static_cast<std::size_t>(info(T).block_bytes);
  double sum = 0.0;
  for (std::size_t u = 0; u < U; ++u) {
    std::uint32_t xw[4][4];
    for (std::size_t r = 0; r < 4; ++r) std::memcpy(xw[r], pieces.data() + (r * U + u) * 16, 16);
    if constexpr (kQ6) {
      const PieceScale sc[4] = {scales[u], scales[U + u], scales[2 * U + u], scales[3 * U + u]};
      Q6RunCodes g;
      decode_q6_run(row + (u / 4) * bb, static_cast<int>((u % 4) / 2), static_cast<int>(u % 2), g);
      sum += q6_run_dot(g, xw, sc);
    } else {
      const PieceScale sc[2] = {scales[u], scales[U + u]};
      PairCodes g;
      if constexpr (T == DType::q8_0) decode_q8_pair(row + u * 2 * bb, g);
      else decode_kpair<T>(row + (u / 4) * bb, static_cast<int>(u % 4), g);
      sum += pair_dot<T>(g, xw, sc);
    }
  }
  return sum;
}

template <DType T>
void check_units(std::mt19937& rng) {
  constexpr std::size_t K = 2048;  // 8 Q6_K blocks: the least a 16-byte aligned Q6_K row holds
  const std::size_t blocks = K / static_cast<std::size_t>(info(T).block_elems);
  const auto w = random_blocks(T, blocks, rng);
  std::normal_distribution<float> n(0.0f, 1.5f);
  std::vector<float> x(K);
  for (auto& v : x) v = n(rng);
  std::vector<std::int8_t> xq(K);
  std::vector<Q8Scale> xs(K / kQ8Block);
  for (std::size_t k = 0; k < xs.size(); ++k) xs[k] = quantize_q8_block(x.data() + k * kQ8Block, xq.data() + k * kQ8Block);
  double want = 0.0, mag = 0.0;  // the segment walk: Σ segment_dot
  for (std::size_t seg = 0; seg < K / kQ8Block; ++seg) {
    constexpr int segs = DotFormat<T>::segs;
    SegCodes g;
    decode_segment<T>(w.data() + (seg / segs) * static_cast<std::size_t>(info(T).block_bytes), static_cast<int>(seg % segs), g);
    std::uint32_t xw[8];
    std::memcpy(xw, xq.data() + seg * kQ8Block, 32);
    const float c = segment_dot<T>(g, xw, xs[seg]);
    want += c;
    mag += std::fabs(c) + std::fabs(static_cast<double>(g.b) * xs[seg].d * (xs[seg].sum_lo + xs[seg].sum_hi));
  }
  const double got = unit_walk_row<T>(w.data(), xq, xs, K);
  INFO(name(T) << ": unit walk " << got << ", segment walk " << want << ", magnitude " << mag);
  // The two sum the same exact integer products with different f32 roundings of the scale products.
  CHECK(std::fabs(got - want) <= 1e-5 * mag + 1e-30);
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

TEST_CASE("the GEMV's unit walks equal the segment walk (Q4_K, Q5_K, Q6_K, Q8_0)", "[quant][gguf_dot]") {
  std::mt19937 rng(20261207);
  for (int rep = 0; rep < 8; ++rep) {
    check_units<DType::q4_k>(rng);
    check_units<DType::q5_k>(rng);
    check_units<DType::q6_k>(rng);
    check_units<DType::q8_0>(rng);
  }
  // The piece layouts of a unit: pairs are 64 consecutive values; a Q6_K run unit 16 positions of each run.
  CHECK(pair_piece_of(64 * 3 + 37).unit == 3);
  CHECK(pair_piece_of(64 * 3 + 37).piece == 2);
  CHECK(pair_piece_of(64 * 3 + 37).at == 5);
  const PiecePos q6 = q6_run_piece_of(256 + 128 + 2 * 32 + 20);  // block 1, half 1, run 2, position 20
  CHECK(q6.unit == 4 + 2 + 1);
  CHECK(q6.piece == 2);
  CHECK(q6.at == 4);
}
