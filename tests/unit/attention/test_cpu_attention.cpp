// The CPU attention kernel (cpu_attention.hpp) through both policies: against a naive softmax(QKᵀ)V
// in double with GQA, paged (scrambled block table) vs contiguous views, NaN-poisoned unwritten slots,
// extreme scores, and the errors for inconsistent shapes or too-short tables.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "infer/attention/contiguous_attention.hpp"
#include "infer/attention/paged_attention.hpp"
#include "infer/core/error.hpp"

using namespace infer;

namespace {

static_assert(AttentionKernel<PagedAttention<>, cpu>);
static_assert(AttentionKernel<FusedContiguousAttention<>, cpu>);
static_assert(PagedAttention<>::layout == KvLayout::paged);
static_assert(FusedContiguousAttention<>::layout == KvLayout::contiguous);
static_assert(!AttentionKernel<int, cpu>);

/// A tile of 4 rows, so short test sequences cross several tiles (and a partial last one).
struct SmallTiles {
  static constexpr std::int32_t cpu_kv_tile = 4;
};
static_assert(kernels::cpu::detail::cpu_kv_tile<SmallTiles>() == 4);
static_assert(kernels::cpu::detail::cpu_kv_tile<void>() == 64);

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Dense K/V for positions [0, len): [len][kv_heads][head_dim].
struct Dense {
  std::int32_t len, kvh, d;
  std::vector<float> k, v;
  const float* k_at(std::int32_t p, std::int32_t h) const { return &k[(static_cast<std::size_t>(p) * kvh + h) * d]; }
  const float* v_at(std::int32_t p, std::int32_t h) const { return &v[(static_cast<std::size_t>(p) * kvh + h) * d]; }
};

/// softmax(q · kᵀ · scale) · v in double, causal, GQA.
std::vector<double> naive(const AttentionShape& s, const std::vector<float>& q, std::int32_t start, std::int32_t count,
                          const Dense& kv) {
  const std::int32_t G = s.num_heads / s.num_kv_heads, D = s.head_dim;
  std::vector<double> out(static_cast<std::size_t>(count) * s.num_heads * D, 0.0);
  for (std::int32_t i = 0; i < count; ++i)
    for (std::int32_t h = 0; h < s.num_heads; ++h) {
      const float* qr = &q[(static_cast<std::size_t>(i) * s.num_heads + h) * D];
      const std::int32_t n = start + i + 1;
      std::vector<double> sc(static_cast<std::size_t>(n));
      for (std::int32_t p = 0; p < n; ++p) {
        double dot = 0;
        for (std::int32_t d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * kv.k_at(p, h / G)[d];
        sc[static_cast<std::size_t>(p)] = dot * s.scale;
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      double* o = &out[(static_cast<std::size_t>(i) * s.num_heads + h) * D];
      for (std::int32_t p = 0; p < n; ++p)
        for (std::int32_t d = 0; d < D; ++d) o[d] += sc[static_cast<std::size_t>(p)] / sum * kv.v_at(p, h / G)[d];
    }
  return out;
}

/// A KV storage of `num_blocks` blocks, NaN everywhere, then `kv` written into the rows a view maps.
template <class View>
std::vector<float> store(const Dense& kv, std::int32_t num_blocks, std::int32_t block_size, View& view) {
  const std::size_t elems = static_cast<std::size_t>(num_blocks) * block_size * kv.kvh * kv.d;
  std::vector<float> buf(2 * elems, std::numeric_limits<float>::quiet_NaN());
  view.k = buf.data();
  view.v = buf.data() + elems;
  for (std::int32_t p = 0; p < kv.len; ++p)
    for (std::int32_t h = 0; h < kv.kvh; ++h) {
      std::copy_n(kv.k_at(p, h), kv.d, view.k_at(p, h));
      std::copy_n(kv.v_at(p, h), kv.d, view.v_at(p, h));
    }
  return buf;
}

struct Case {
  AttentionShape shape;
  std::int32_t start, count;
};

}  // namespace

TEST_CASE("attention equals naive softmax(QK^T)V with GQA, paged and contiguous", "[attention]") {
  std::mt19937 rng(7);
  const std::vector<Case> cases = {
      {{8, 2, 16, 0.25f}, 0, 1},    // first decode token
      {{8, 2, 16, 0.25f}, 0, 11},   // prefill from scratch
      {{8, 2, 16, 0.25f}, 13, 1},   // decode late in a sequence
      {{8, 2, 16, 0.25f}, 6, 9},    // prefill chunk after cached tokens
      {{4, 4, 8, 0.35f}, 3, 5},     // no GQA
      {{6, 1, 12, 0.3f}, 2, 7},     // MQA, head_dim not a multiple of 8
      {{8, 2, 64, 0.125f}, 70, 3},  // more than one default tile of 64
  };
  for (const auto& c : cases) {
    const std::int32_t len = c.start + c.count;
    INFO("heads " << c.shape.num_heads << "/" << c.shape.num_kv_heads << " dim " << c.shape.head_dim << " start "
                  << c.start << " count " << c.count);
    Dense kv{len, c.shape.num_kv_heads, c.shape.head_dim, {}, {}};
    kv.k = random_vector(static_cast<std::size_t>(len) * kv.kvh * kv.d, rng);
    kv.v = random_vector(kv.k.size(), rng);
    const auto q = random_vector(static_cast<std::size_t>(c.count) * c.shape.num_heads * c.shape.head_dim, rng);
    const auto want = naive(c.shape, q, c.start, c.count, kv);

    // Paged: block size 4, blocks scattered in a pool of 3x what is needed, in scrambled order.
    const std::int32_t bs = 4, nb = (len + bs - 1) / bs, pool = 3 * nb + 1;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pool));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<std::int32_t> table(ids.begin(), ids.begin() + nb);
    auto pv = PagedAttention<>::make_view<float>(nullptr, nullptr, table, bs, kv.kvh, kv.d);
    const auto pbuf = store(kv, pool, bs, pv);
    std::vector<float> out_paged(q.size(), -1.0f), out_paged_small(q.size(), -1.0f);
    PagedAttention<>::attend(cpu{}, c.shape, q.data(), out_paged.data(), c.start, c.count, pv);
    auto pv_small = PagedAttention<SmallTiles>::make_view<float>(pv.k, pv.v, table, bs, kv.kvh, kv.d);
    PagedAttention<SmallTiles>::attend(cpu{}, c.shape, q.data(), out_paged_small.data(), c.start, c.count, pv_small);

    // Contiguous: slot 2 of 4, capacity len + 5 (the rest NaN).
    const std::vector<std::int32_t> slot = {2};
    auto cv = FusedContiguousAttention<>::make_view<float>(nullptr, nullptr, slot, len + 5, kv.kvh, kv.d);
    REQUIRE(cv.slot == 2);
    REQUIRE(cv.capacity == len + 5);
    const auto cbuf = store(kv, 4, len + 5, cv);
    std::vector<float> out_contig(q.size(), -1.0f);
    FusedContiguousAttention<>::attend(cpu{}, c.shape, q.data(), out_contig.data(), c.start, c.count, cv);

    double worst = 0;
    for (std::size_t i = 0; i < q.size(); ++i) {
      REQUIRE(std::isfinite(out_paged[i]));  // no NaN slot was read
      worst = std::max(worst, std::abs(out_paged[i] - want[i]));
      worst = std::max(worst, std::abs(out_paged_small[i] - want[i]));
    }
    CHECK(worst < 2e-6);
    // Same kernel, same summation order: the layout changes where rows are, never the result.
    CHECK(out_contig == out_paged);
  }
}

TEST_CASE("attention is stable for huge scores and picks the dominant key", "[attention]") {
  // Scores of ±1e4: a naive exp would overflow to inf; the online softmax must not.
  const AttentionShape s{2, 1, 8, 1.0f};
  const std::int32_t len = 9;
  Dense kv{len, 1, 8, std::vector<float>(len * 8, 0.0f), std::vector<float>(len * 8, 0.0f)};
  for (std::int32_t p = 0; p < len; ++p) {
    kv.k[static_cast<std::size_t>(p) * 8] = p == 5 ? 100.0f : -100.0f + static_cast<float>(p);
    kv.v[static_cast<std::size_t>(p) * 8 + 1] = static_cast<float>(p);
  }
  std::vector<float> q(2 * 8, 0.0f);
  q[0] = 100.0f;   // head 0: score 1e4 at position 5
  q[8] = -100.0f;  // head 1: largest score at position 0 (1e4), others smaller
  const std::vector<std::int32_t> table = {0, 1, 2};
  auto view = PagedAttention<SmallTiles>::make_view<float>(nullptr, nullptr, table, 4, 1, 8);
  const auto buf = store(kv, 3, 4, view);
  std::vector<float> out(q.size());
  PagedAttention<SmallTiles>::attend(cpu{}, s, q.data(), out.data(), len - 1, 1, view);
  for (float x : out) REQUIRE(std::isfinite(x));
  CHECK(out[1] == Approx(5.0f));
  CHECK(out[8 + 1] == Approx(0.0f).margin(1e-6));
}

TEST_CASE("attention rejects inconsistent shapes and positions beyond the table", "[attention]") {
  std::vector<float> k(4 * 4 * 2 * 8), v(k.size()), q(8 * 8), out(q.size());
  const std::vector<std::int32_t> table = {0, 1};
  const auto view = PagedAttention<>::make_view<float>(k.data(), v.data(), table, 4, 2, 8);
  // 3 KV heads in the shape, 2 in the view.
  CHECK_THROWS_AS(PagedAttention<>::attend(cpu{}, {6, 3, 8, 1.0f}, q.data(), out.data(), 0, 1, view), InvalidArgument);
  // num_kv_heads does not divide num_heads.
  CHECK_THROWS_AS(PagedAttention<>::attend(cpu{}, {3, 2, 8, 1.0f}, q.data(), out.data(), 0, 1, view), InvalidArgument);
  // Positions 0..8 need 3 blocks of 4; the table has 2.
  CHECK_THROWS_AS(PagedAttention<>::attend(cpu{}, {4, 2, 8, 1.0f}, q.data(), out.data(), 7, 2, view), InvalidArgument);
  CHECK_NOTHROW(PagedAttention<>::attend(cpu{}, {4, 2, 8, 1.0f}, q.data(), out.data(), 6, 2, view));
  CHECK_THROWS_AS(PagedAttention<>::attend(cpu{}, {4, 2, 8, 1.0f}, q.data(), out.data(), -1, 1, view), InvalidArgument);

  const std::vector<std::int32_t> slot = {1};
  const auto cv = FusedContiguousAttention<>::make_view<float>(k.data(), v.data(), slot, 8, 2, 8);
  CHECK_THROWS_AS(FusedContiguousAttention<>::attend(cpu{}, {4, 2, 8, 1.0f}, q.data(), out.data(), 8, 1, cv),
                  InvalidArgument);
  const std::vector<std::int32_t> none;
  CHECK_THROWS_AS(FusedContiguousAttention<>::make_view<float>(k.data(), v.data(), none, 8, 2, 8), InvalidArgument);
  // A slot of two blocks of 4: blocks {4, 5} are slot 2, rows 16..23; a table off a slot boundary is refused.
  const std::vector<std::int32_t> two = {4, 5}, off = {3, 4};
  const auto cv2 = FusedContiguousAttention<>::make_view<float>(k.data(), v.data(), two, 4, 2, 8);
  CHECK(cv2.slot == 2);
  CHECK(cv2.capacity == 8);
  CHECK(cv2.k_at(0, 0) == k.data() + 16 * 2 * 8);
  CHECK_THROWS_WITH(FusedContiguousAttention<>::make_view<float>(k.data(), v.data(), off, 4, 2, 8),
                    Catch::Contains("not at a slot of 2 blocks"));
}
