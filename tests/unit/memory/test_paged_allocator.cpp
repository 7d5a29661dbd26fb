#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/paged_allocator.hpp"

using namespace infer;

namespace {

std::vector<std::int32_t> iota(std::int32_t n, std::int32_t first) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Sequence make_seq(SeqId id, std::vector<std::int32_t> tokens, std::int32_t num_computed = 0) {
  Sequence s;
  s.id = id;
  s.tokens = std::move(tokens);
  s.prompt_len = s.len();
  s.num_computed = num_computed;
  s.max_len = s.len() + 64;
  return s;
}

std::vector<std::int32_t> table(const auto& alloc, const Sequence& s) {
  const auto t = alloc.block_table(s);
  return {t.begin(), t.end()};
}

/// Admits and "computes" the whole sequence, as an engine would: num_computed from the cache hit, then
/// every token computed and committed.
template <class A>
std::int32_t admit_and_compute(A& alloc, Sequence& s) {
  const auto cached = alloc.allocate(s);
  REQUIRE(cached.has_value());
  s.num_computed = s.len();
  alloc.commit(s, s.num_computed);
  return *cached;
}

}  // namespace

static_assert(BlockAllocator<PagedBlockAllocator<8>>);
static_assert(BlockAllocator<PagedBlockAllocator<32>>);
static_assert(PagedBlockAllocator<16>::layout == KvLayout::paged);

TEST_CASE("paged allocator validates its size and budget", "[memory][paged]") {
  CHECK_THROWS_AS(PagedBlockAllocator<16>(0), InvalidArgument);
  CHECK_THROWS_WITH(PagedBlockAllocator<16>(-1), Catch::Contains("num_blocks is -1"));
  // 4 tokens per block, 16 bytes per token: 64 bytes per block.
  CHECK(PagedBlockAllocator<4>::blocks_for_budget(640, 16) == 10);
  CHECK(PagedBlockAllocator<4>::blocks_for_budget(639, 16) == 9);
  CHECK(PagedBlockAllocator<4>::blocks_for_budget(63, 16) == 0);
  CHECK(PagedBlockAllocator<4>::blocks_for_budget(SIZE_MAX, 1) == INT32_MAX);
  CHECK_THROWS_WITH(PagedBlockAllocator<4>::blocks_for_budget(640, 0), Catch::Contains("kv_bytes_per_token is 0"));
}

TEST_CASE("can_ever_fit is exact at the block boundary", "[memory][paged]") {
  const PagedBlockAllocator<4> a(3);
  CHECK(a.can_ever_fit(0));
  CHECK(a.can_ever_fit(12));
  CHECK_FALSE(a.can_ever_fit(13));
}

TEST_CASE("allocate covers every token with ceil(len / block) blocks", "[memory][paged]") {
  PagedBlockAllocator<4> a(8);
  auto s = make_seq(1, iota(9, 100));
  CHECK(a.allocate(s) == 0);
  CHECK(table(a, s) == std::vector<std::int32_t>{0, 1, 2});
  CHECK(a.num_free_blocks() == 5);
  const auto st = a.stats();
  CHECK(st.block_size == 4);
  CHECK(st.total_blocks == 8);
  CHECK(st.used_blocks == 3);
  CHECK(st.tokens_stored == 9);
  CHECK(st.wasted_slots() == 3);
  CHECK(st.live_sequences == 1);
  CHECK(st.prefix_queried_tokens == 9);
  CHECK(st.prefix_hit_tokens == 0);

  auto exact = make_seq(2, iota(8, 0));  // exactly two blocks: no third
  CHECK(a.allocate(exact) == 0);
  CHECK(table(a, exact).size() == 2);
}

TEST_CASE("allocate rejects what could never work, changing nothing", "[memory][paged]") {
  PagedBlockAllocator<4> a(3);
  auto empty = make_seq(1, {});
  CHECK_THROWS_WITH(a.allocate(empty), Catch::Contains("has no tokens"));
  auto big = make_seq(2, iota(13, 0));
  CHECK_THROWS_AS(a.allocate(big), InvalidArgument);
  CHECK_THROWS_WITH(a.allocate(big), Catch::Contains("needing 4 blocks") && Catch::Contains("only 3 blocks"));
  auto s = make_seq(3, iota(4, 0));
  REQUIRE(a.allocate(s));
  CHECK_THROWS_WITH(a.allocate(s), Catch::Contains("already holds blocks"));
  CHECK(a.num_free_blocks() == 2);
  CHECK(table(a, s) == std::vector<std::int32_t>{0});
}

TEST_CASE("exhaustion: allocate and grow fail whole and change nothing", "[memory][paged]") {
  PagedBlockAllocator<16> a(4);
  auto s1 = make_seq(1, iota(40, 0));  // 3 blocks
  REQUIRE(a.allocate(s1) == 0);
  auto s2 = make_seq(2, iota(20, 1000));  // 2 blocks, 1 free
  const auto before = a.stats();
  CHECK_FALSE(a.allocate(s2).has_value());
  CHECK(a.num_free_blocks() == 1);
  CHECK(a.block_table(s2).empty());
  CHECK(a.stats().tokens_stored == before.tokens_stored);
  CHECK(a.stats().live_sequences == 1);
  CHECK(a.stats().prefix_queried_tokens == before.prefix_queried_tokens);  // a failed try is not a query

  s1.num_computed = 40;
  CHECK(a.grow(s1, 48));  // still within block 2
  CHECK(a.num_free_blocks() == 1);
  CHECK(a.grow(s1, 64));  // exactly 4 blocks
  CHECK(a.num_free_blocks() == 0);
  CHECK_FALSE(a.grow(s1, 65));
  CHECK(table(a, s1) == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(a.stats().tokens_stored == 64);

  a.free(s1);
  CHECK(a.num_free_blocks() == 4);
  CHECK(a.allocate(s2) == 0);
}

TEST_CASE("grow adds a block exactly when the token count crosses a block boundary", "[memory][paged]") {
  PagedBlockAllocator<8> a(4);
  auto s = make_seq(1, iota(8, 0), 8);
  REQUIRE(a.allocate(s));
  CHECK(a.grow(s, 8));
  CHECK(a.block_table(s).size() == 1);
  CHECK(a.grow(s, 9));
  CHECK(a.block_table(s).size() == 2);
  CHECK(a.grow(s, 16));
  CHECK(a.block_table(s).size() == 2);
  CHECK(a.grow(s, 5));  // shrinking is a no-op
  CHECK(a.block_table(s).size() == 2);
  CHECK(a.stats().tokens_stored == 16);
  CHECK(a.take_copies().empty());
  auto unknown = make_seq(9, iota(3, 0));
  CHECK_THROWS_WITH(a.grow(unknown, 4), Catch::Contains("sequence 9 holds no blocks"));
  CHECK_THROWS_WITH(a.grow(s, -1), Catch::Contains("asked for -1 tokens"));
}

TEST_CASE("fork shares every block, free drops the references again", "[memory][paged]") {
  PagedBlockAllocator<4> a(8);
  auto parent = make_seq(1, iota(6, 0), 6);
  REQUIRE(a.allocate(parent));
  auto child = make_seq(2, parent.tokens, 6);
  a.fork(parent, child);
  CHECK(table(a, child) == table(a, parent));
  for (const auto id : a.block_table(parent)) CHECK(a.pool().block(id).ref_count == 2);
  CHECK(a.num_free_blocks() == 6);  // nothing new taken
  auto st = a.stats();
  CHECK(st.used_blocks == 2);
  CHECK(st.tokens_stored == 6);  // shared tokens count once
  CHECK(st.live_sequences == 2);
  CHECK(st.wasted_slots() == 2);

  CHECK_THROWS_WITH(a.fork(parent, child), Catch::Contains("already holds blocks"));
  CHECK_THROWS_WITH(a.fork(parent, parent), Catch::Contains("both sequence 1"));
  auto orphan = make_seq(3, {1});
  CHECK_THROWS_WITH(a.fork(orphan, child), Catch::Contains("sequence 3 holds no blocks"));

  a.free(parent);
  for (const auto id : a.block_table(child)) CHECK(a.pool().block(id).ref_count == 1);
  CHECK(a.num_free_blocks() == 6);
  CHECK(a.stats().tokens_stored == 6);
  a.free(child);
  CHECK(a.num_free_blocks() == 8);
  CHECK(a.stats().tokens_stored == 0);
  a.free(child);  // unknown now: a no-op
  CHECK(a.num_free_blocks() == 8);
}

TEST_CASE("copy-on-write happens exactly when a shared partial block is written", "[memory][paged]") {
  PagedBlockAllocator<4> a(8);
  auto parent = make_seq(1, iota(6, 0), 6);  // block 0 full, block 1 holds tokens 4, 5
  REQUIRE(a.allocate(parent));
  auto child = make_seq(2, parent.tokens, 6);
  a.fork(parent, child);
  const auto shared = table(a, parent);  // {0, 1}

  child.tokens.push_back(77);  // the child's 7th token lands in shared block 1
  REQUIRE(a.grow(child, 7));
  const auto copies = a.take_copies();
  REQUIRE(copies.size() == 1);
  CHECK(copies[0] == BlockCopy{shared[1], 2});
  CHECK(table(a, child) == std::vector<std::int32_t>{shared[0], 2});
  CHECK(table(a, parent) == shared);
  CHECK(a.pool().block(shared[0]).ref_count == 2);  // full and not written: still shared
  CHECK(a.pool().block(shared[1]).ref_count == 1);
  CHECK(a.pool().block(2).ref_count == 1);
  CHECK(a.take_copies().empty());  // taken once
  auto st = a.stats();
  CHECK(st.used_blocks == 3);
  CHECK(st.tokens_stored == 4 + 2 + 3);

  // The parent now owns block 1 alone: writing it copies nothing.
  parent.tokens.push_back(88);
  REQUIRE(a.grow(parent, 7));
  CHECK(a.take_copies().empty());
  CHECK(table(a, parent) == shared);
}

TEST_CASE("a full shared block that is not written is never copied", "[memory][paged]") {
  PagedBlockAllocator<4> a(8);
  auto parent = make_seq(1, iota(8, 0), 8);  // two full blocks
  REQUIRE(a.allocate(parent));
  auto child = make_seq(2, parent.tokens, 8);
  a.fork(parent, child);
  child.tokens.push_back(9);
  REQUIRE(a.grow(child, 9));  // the write lands in a new block 2
  CHECK(a.take_copies().empty());
  CHECK(table(a, child) == std::vector<std::int32_t>{0, 1, 2});
  CHECK(a.pool().block(0).ref_count == 2);
  CHECK(a.pool().block(1).ref_count == 2);
}

TEST_CASE("copy-on-write covers a partly computed block, an uncomputed shared block is replaced without a copy",
          "[memory][paged]") {
  PagedBlockAllocator<4> a(8);
  // 8 tokens allocated, 7 computed: block 1 holds computed rows 4..6 and the pending token 7.
  auto parent = make_seq(1, iota(8, 0), 7);
  REQUIRE(a.allocate(parent));
  auto child = make_seq(2, parent.tokens, 7);
  a.fork(parent, child);
  REQUIRE(a.grow(child, 8));
  CHECK(a.take_copies() == std::vector<BlockCopy>{{1, 2}});
  CHECK(table(a, child) == std::vector<std::int32_t>{0, 2});

  // A sibling forked before any of block 1 was computed gets a fresh block 1 and no copy.
  auto early = make_seq(3, iota(8, 0), 4);
  REQUIRE(a.allocate(early));  // blocks 3, 4
  auto sibling = make_seq(4, early.tokens, 4);
  a.fork(early, sibling);
  REQUIRE(a.grow(sibling, 8));
  CHECK(a.take_copies().empty());
  CHECK(table(a, sibling) == std::vector<std::int32_t>{3, 5});
  CHECK(a.pool().block(4).ref_count == 1);
}

TEST_CASE("grow that needs a copy fails whole when no block is free", "[memory][paged]") {
  PagedBlockAllocator<4> a(2);
  auto parent = make_seq(1, iota(6, 0), 6);
  REQUIRE(a.allocate(parent));  // both blocks
  auto child = make_seq(2, parent.tokens, 6);
  a.fork(parent, child);
  CHECK_FALSE(a.grow(child, 7));
  CHECK(a.take_copies().empty());
  CHECK(table(a, child) == table(a, parent));
  CHECK(a.pool().block(1).ref_count == 2);
}

TEST_CASE("a second prompt with the same three full blocks hits exactly those blocks", "[memory][paged][prefix]") {
  PagedBlockAllocator<16> a(16);
  const auto prefix = iota(48, 1);
  auto first = make_seq(1, concat(prefix, iota(5, 500)));
  CHECK(admit_and_compute(a, first) == 0);
  const auto first_table = table(a, first);
  CHECK(a.pool().num_cached() == 3);  // block 3 is partial: not cached

  auto second = make_seq(2, concat(prefix, iota(7, 900)));
  CHECK(a.allocate(second) == 48);
  const auto t = table(a, second);
  REQUIRE(t.size() == 4);
  CHECK(t[0] == first_table[0]);
  CHECK(t[1] == first_table[1]);
  CHECK(t[2] == first_table[2]);
  CHECK(t[3] != first_table[3]);
  CHECK(a.pool().block(t[0]).ref_count == 2);
  CHECK(a.pool().block(t[3]).ref_count == 1);
  const auto st = a.stats();
  CHECK(st.prefix_queried_tokens == 53 + 55);
  CHECK(st.prefix_hit_tokens == 48);
  CHECK(st.used_blocks == 5);
  CHECK(st.tokens_stored == 48 + 5 + 7);

  // Hits survive the first sequence's departure.
  a.free(first);
  a.free(second);
  CHECK(a.stats().cached_blocks == 3);
  auto third = make_seq(3, concat(prefix, iota(1, 7)));
  CHECK(a.allocate(third) == 48);
}

TEST_CASE("a prompt equal to a cached one still computes its last block", "[memory][paged][prefix]") {
  PagedBlockAllocator<16> a(16);
  const auto prompt = iota(48, 1);
  auto first = make_seq(1, prompt);
  admit_and_compute(a, first);
  CHECK(a.pool().num_cached() == 3);
  auto again = make_seq(2, prompt);
  CHECK(a.allocate(again) == 32);  // floor((48 - 1) / 16) = 2 blocks
  const auto t = table(a, again);
  REQUIRE(t.size() == 3);
  CHECK(t[0] == table(a, first)[0]);
  CHECK(t[1] == table(a, first)[1]);
  CHECK(t[2] != table(a, first)[2]);
  // Its recomputed last block has the same key as the cached one: the first entry stays.
  again.num_computed = 48;
  a.commit(again, again.num_computed);
  CHECK_FALSE(a.pool().block(t[2]).hash.has_value());
  CHECK(a.pool().find(*a.pool().block(table(a, first)[2]).hash) == table(a, first)[2]);

  auto one_more = make_seq(3, concat(prompt, {5}));
  CHECK(a.allocate(one_more) == 48);  // 49 tokens: all three blocks may hit
}

TEST_CASE("equal block tokens after a different prefix do not hit", "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(16);
  const auto x = iota(4, 10);
  const auto y = iota(4, 20);
  const auto z = iota(4, 30);
  auto first = make_seq(1, concat(concat(x, y), {1}));  // [x][y][1]
  admit_and_compute(a, first);
  auto other = make_seq(2, concat(concat(z, y), {1}));  // [z][y][1]: block y after z
  CHECK(a.allocate(other) == 0);
  auto same_start = make_seq(3, concat(concat(x, z), {1}));  // [x][z][1]: only x hits
  CHECK(a.allocate(same_start) == 4);
}

TEST_CASE("commit registers only full computed blocks, once", "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(8);
  auto s = make_seq(1, iota(10, 0));
  REQUIRE(a.allocate(s) == 0);
  s.num_computed = 3;
  a.commit(s, s.num_computed);
  CHECK(a.pool().num_cached() == 0);
  s.num_computed = 4;
  a.commit(s, s.num_computed);
  CHECK(a.pool().num_cached() == 1);
  CHECK(a.pool().block(0).hash.has_value());
  s.num_computed = 10;
  a.commit(s, s.num_computed);
  CHECK(a.pool().num_cached() == 2);
  CHECK_FALSE(a.pool().block(2).hash.has_value());
  // Decode: appended tokens extend the chain when they fill block 2.
  s.tokens.insert(s.tokens.end(), {10, 11});
  REQUIRE(a.grow(s, 12));
  s.num_computed = 12;
  a.commit(s, s.num_computed);
  CHECK(a.pool().num_cached() == 3);
  auto probe = make_seq(2, concat(iota(12, 0), {99}));
  CHECK(a.allocate(probe) == 12);

  s.num_computed = 13;
  CHECK_THROWS_WITH(a.commit(s, s.num_computed), Catch::Contains("commits 13 tokens"));
  auto unknown = make_seq(7, {1});
  CHECK_THROWS_AS(a.commit(unknown, 1), InvalidArgument);
}

TEST_CASE("two sequences computing the same blocks: the first registration wins", "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(8);
  auto s1 = make_seq(1, iota(9, 0));
  auto s2 = make_seq(2, iota(9, 0));
  REQUIRE(a.allocate(s1) == 0);
  REQUIRE(a.allocate(s2) == 0);  // nothing committed yet: no hit
  s1.num_computed = s2.num_computed = 9;
  a.commit(s1, s1.num_computed);
  a.commit(s2, s2.num_computed);
  CHECK(a.pool().num_cached() == 2);
  CHECK(a.pool().block(table(a, s1)[0]).hash.has_value());
  CHECK_FALSE(a.pool().block(table(a, s2)[0]).hash.has_value());
}

TEST_CASE("LRU: a freed sequence's tail is evicted before its head, touched blocks are safe", "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(4);
  auto s = make_seq(1, iota(8, 0));  // blocks 0, 1, both full
  admit_and_compute(a, s);
  a.free(s);
  auto st = a.stats();
  CHECK(st.free_blocks == 4);
  CHECK(st.cached_blocks == 2);
  CHECK(a.pool().free_queue().front() == 2);

  // 12 fresh tokens take 2, 3 and then block 1 (s's tail, released first): one eviction.
  auto filler = make_seq(2, iota(12, 100));
  REQUIRE(a.allocate(filler) == 0);
  CHECK(table(a, filler) == std::vector<std::int32_t>{2, 3, 1});
  st = a.stats();
  CHECK(st.evictions == 1);
  CHECK(st.cached_blocks == 1);
  CHECK(a.pool().block(0).hash.has_value());

  // s's first block still hits.
  a.free(filler);
  auto again = make_seq(3, concat(iota(4, 0), {42, 43}));
  CHECK(a.allocate(again) == 4);
  CHECK(table(a, again)[0] == 0);
  CHECK(a.stats().cached_blocks == 0);  // in use, not free
  // Filling the rest of the cache does not evict the touched block 0.
  auto rest = make_seq(4, iota(8, 200));
  REQUIRE(a.allocate(rest) == 0);
  CHECK(a.pool().block(0).hash.has_value());
  CHECK(a.num_free_blocks() == 0);
}

TEST_CASE("admission counts cached-but-free hit blocks against the free blocks", "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(5);
  auto s = make_seq(1, iota(9, 0));  // blocks 0, 1 full and cached, block 2 partial
  admit_and_compute(a, s);
  a.free(s);
  auto holder = make_seq(2, iota(4, 500));
  REQUIRE(a.allocate(holder) == 0);  // takes block 3
  REQUIRE(a.num_free_blocks() == 4);

  // 17 tokens: 5 blocks, 2 of them hits that are themselves free: 3 fresh + 2 hits > 4 free.
  auto big = make_seq(3, concat(iota(8, 0), iota(9, 50)));
  const auto before = a.stats();
  CHECK_FALSE(a.allocate(big).has_value());
  const auto after = a.stats();
  CHECK(after.free_blocks == 4);
  CHECK(after.cached_blocks == 2);
  CHECK(after.evictions == before.evictions);
  CHECK(a.pool().block(0).ref_count == 0);
  CHECK(a.pool().block(1).ref_count == 0);

  // 13 tokens: 4 blocks, 2 hits + 2 fresh = 4 free: fits.
  auto fits = make_seq(4, concat(iota(8, 0), iota(5, 50)));
  CHECK(a.allocate(fits) == 8);
  CHECK(a.num_free_blocks() == 0);
  CHECK(a.stats().evictions == 0);  // the fresh blocks were uncached ones, not the hits
}

TEST_CASE("with prefix caching disabled nothing is hashed or hit", "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(8, false);
  CHECK_FALSE(a.prefix_caching());
  auto s = make_seq(1, iota(9, 0));
  admit_and_compute(a, s);
  CHECK(a.pool().num_cached() == 0);
  auto again = make_seq(2, iota(9, 0));
  CHECK(a.allocate(again) == 0);
  const auto st = a.stats();
  CHECK(st.prefix_queried_tokens == 0);
  CHECK(st.prefix_hit_tokens == 0);
  a.free(s);
  a.free(again);
  CHECK(a.stats().cached_blocks == 0);
}

TEMPLATE_TEST_CASE("block sizes 8, 16 and 32 share, cache and return every block", "[memory][paged]",
                   PagedBlockAllocator<8>, PagedBlockAllocator<16>, PagedBlockAllocator<32>) {
  constexpr std::int32_t bs = TestType::tokens_per_block;
  TestType a(12);
  CHECK(a.block_size() == bs);
  CHECK(a.stats().block_size == bs);
  const auto prefix = iota(3 * bs, 1);

  auto s1 = make_seq(1, concat(prefix, {7}));  // 3 full blocks + 1 token
  CHECK(admit_and_compute(a, s1) == 0);
  CHECK(a.block_table(s1).size() == 4);
  auto s2 = make_seq(2, concat(prefix, {8, 9}));
  CHECK(a.allocate(s2) == 3 * bs);
  s2.num_computed = 3 * bs;

  // Decode s2 across its next block boundary: bs - 2 more tokens fill block 3, one more needs block 4.
  for (std::int32_t i = 0; i < bs - 2; ++i) {
    s2.tokens.push_back(1000 + i);
    REQUIRE(a.grow(s2, s2.len()));
  }
  CHECK(a.block_table(s2).size() == 4);
  s2.tokens.push_back(5);
  REQUIRE(a.grow(s2, s2.len()));
  CHECK(a.block_table(s2).size() == 5);

  auto child = make_seq(3, s1.tokens, s1.num_computed);
  a.fork(s1, child);
  auto st = a.stats();
  CHECK(st.live_sequences == 3);
  CHECK(st.used_blocks == 3 + 1 + 2);  // shared prefix, s1's tail (shared with child), s2's two tail blocks
  CHECK(st.tokens_stored == 3 * bs + 1 + bs + 1);
  CHECK(st.wasted_slots() >= 0);
  CHECK(st.wasted_slots() < static_cast<std::int64_t>(bs) * st.live_sequences);

  child.tokens.push_back(3);
  REQUIRE(a.grow(child, child.len()));
  const auto copies = a.take_copies();
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].src == a.block_table(s1)[3]);
  CHECK(copies[0].dst == a.block_table(child)[3]);

  a.free(s1);
  a.free(s2);
  a.free(child);
  st = a.stats();
  CHECK(st.free_blocks == 12);
  CHECK(st.used_blocks == 0);
  CHECK(st.tokens_stored == 0);
  CHECK(st.live_sequences == 0);
  CHECK(st.cached_blocks == 3);
  CHECK(st.wasted_slots() == 0);
}

TEST_CASE("blocks committed for a step that never runs are forgotten when their sequence is freed",
          "[memory][paged][prefix]") {
  PagedBlockAllocator<4> a(8);
  auto planned = make_seq(1, iota(9, 0));
  REQUIRE(a.allocate(planned) == 0);
  a.commit(planned, 9);  // planned: blocks 0 and 1 will be full after this step
  CHECK(a.pool().num_cached() == 2);
  auto same_step = make_seq(2, concat(iota(8, 0), {50, 51}));
  CHECK(a.allocate(same_step) == 8);  // shares them within the step
  a.free(same_step);

  a.free(planned);  // preempted before the step ran: num_computed is still 0
  CHECK(a.pool().num_cached() == 0);
  auto later = make_seq(3, iota(9, 0));
  CHECK(a.allocate(later) == 0);  // no stale hit on content that was never written
  a.free(later);

  auto computed = make_seq(4, iota(9, 0));
  REQUIRE(a.allocate(computed) == 0);
  a.commit(computed, 9);
  computed.num_computed = 9;  // this time the step ran
  a.free(computed);
  CHECK(a.pool().num_cached() == 2);
  CHECK(a.num_free_blocks() == 8);
}
