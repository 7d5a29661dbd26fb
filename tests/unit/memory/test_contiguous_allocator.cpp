#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/contiguous_allocator.hpp"

using namespace infer;

namespace {

using Small = ContiguousAllocator<Shape{.max_batch = 2, .max_input = 8, .max_output = 4}>;  // one block a slot
using Wide = ContiguousAllocator<Shape{.max_batch = 3, .max_input = 20, .max_output = 20}>;  // three blocks a slot

Sequence make_seq(SeqId id, std::int32_t len, std::int32_t prompt_len = -1) {
  Sequence s;
  s.id = id;
  s.tokens.resize(static_cast<std::size_t>(len));
  std::iota(s.tokens.begin(), s.tokens.end(), 1);
  s.prompt_len = prompt_len < 0 ? len : prompt_len;
  s.max_len = 12;
  return s;
}

template <class A>
std::vector<std::int32_t> table(const A& a, const Sequence& s) {
  const auto t = a.block_table(s);
  return {t.begin(), t.end()};
}

}  // namespace

static_assert(BlockAllocator<Small>);
static_assert(Small::layout == KvLayout::contiguous);
static_assert(!Small::shape_at_runtime && ContiguousAllocator<kShapeAtRuntime>::shape_at_runtime);
static_assert(BlockAllocator<ContiguousAllocator<Shape{.max_batch = 8, .max_input = 1024, .max_output = 512}>>);

TEST_CASE("contiguous allocator: one slot per sequence, max_batch slots", "[memory][contiguous]") {
  Small a;
  CHECK(a.shape() == Shape{.max_batch = 2, .max_input = 8, .max_output = 4});
  CHECK(a.capacity() == 12);
  CHECK(a.blocks_per_slot() == 1);
  CHECK(a.block_size() == 16);
  CHECK(a.num_blocks() == 2);
  CHECK(a.num_free_blocks() == 2);
  auto s0 = make_seq(10, 5);
  auto s1 = make_seq(11, 8);
  auto s2 = make_seq(12, 3);
  CHECK(a.allocate(s0) == 0);  // never any cached tokens
  CHECK(a.allocate(s1) == 0);
  CHECK(table(a, s0) == std::vector<std::int32_t>{0});
  CHECK(table(a, s1) == std::vector<std::int32_t>{1});
  CHECK(a.num_free_blocks() == 0);
  CHECK_FALSE(a.allocate(s2).has_value());
  CHECK(a.block_table(s2).empty());

  a.free(s0);
  CHECK(a.num_free_blocks() == 1);
  CHECK(a.block_table(s0).empty());
  CHECK(a.allocate(s2) == 0);
  CHECK(table(a, s2) == std::vector<std::int32_t>{0});  // the freed slot
  a.free(s0);  // unknown now: no-op
  CHECK(a.num_free_blocks() == 0);
}

TEST_CASE("contiguous allocator: grow is true exactly up to the slot capacity", "[memory][contiguous]") {
  Small a;
  auto s = make_seq(1, 8);
  REQUIRE(a.allocate(s));
  CHECK(a.grow(s, 12));
  CHECK_FALSE(a.grow(s, 13));
  CHECK(a.stats().tokens_stored == 12);
  CHECK(a.can_ever_fit(12));
  CHECK_FALSE(a.can_ever_fit(13));
  auto other = make_seq(2, 1);
  CHECK_THROWS_WITH(a.grow(other, 2), Catch::Contains("sequence 2 holds no slot"));
  CHECK_THROWS_WITH(a.grow(s, -3), Catch::Contains("asked for -3 tokens"));
  CHECK(a.take_copies().empty());
}

TEST_CASE("contiguous allocator: prompts over max_input and sequences over capacity are rejected",
          "[memory][contiguous]") {
  Small a;
  auto long_prompt = make_seq(1, 9);
  CHECK_THROWS_AS(a.allocate(long_prompt), InvalidArgument);
  CHECK_THROWS_WITH(a.allocate(long_prompt), Catch::Contains("prompt has 9 tokens") && Catch::Contains("max_input is 8"));
  auto at_limit = make_seq(2, 8);
  CHECK(a.allocate(at_limit) == 0);
  // A recomputed sequence: 8 prompt tokens + 5 generated exceeds 12.
  auto too_long = make_seq(3, 13, 8);
  CHECK_THROWS_WITH(a.allocate(too_long), Catch::Contains("13 tokens") && Catch::Contains("= 12"));
  auto empty = make_seq(4, 0);
  CHECK_THROWS_WITH(a.allocate(empty), Catch::Contains("no tokens"));
  CHECK_THROWS_WITH(a.allocate(at_limit), Catch::Contains("already holds a slot"));
  CHECK(a.num_free_blocks() == 1);
}

TEST_CASE("contiguous allocator: fork copies the parent's slot into a free one", "[memory][contiguous]") {
  Small a;
  auto parent = make_seq(1, 6);
  REQUIRE(a.allocate(parent));
  auto child = make_seq(2, 6);
  a.fork(parent, child);
  CHECK(table(a, child) == std::vector<std::int32_t>{1});
  CHECK(a.take_copies() == std::vector<BlockCopy>{{0, 1}});
  CHECK(a.take_copies().empty());
  CHECK(a.stats().tokens_stored == 12);

  auto third = make_seq(3, 6);
  CHECK_THROWS_WITH(a.fork(parent, third), Catch::Contains("no free slot") && Catch::Contains("2 slots"));
  CHECK(a.take_copies().empty());
  CHECK_THROWS_WITH(a.fork(parent, child), Catch::Contains("already holds a slot"));
  CHECK_THROWS_WITH(a.fork(third, third), Catch::Contains("both sequence 3"));
  a.free(parent);
  CHECK_THROWS_WITH(a.fork(parent, third), Catch::Contains("sequence 1 holds no slot"));
  a.fork(child, third);  // into the freed slot 0
  CHECK(a.take_copies() == std::vector<BlockCopy>{{1, 0}});
}

TEST_CASE("contiguous allocator: stats report slots, tokens and waste", "[memory][contiguous]") {
  Small a;
  auto s0 = make_seq(1, 5);
  auto s1 = make_seq(2, 3);
  REQUIRE(a.allocate(s0));
  REQUIRE(a.allocate(s1));
  a.commit(s0, s0.num_computed);  // no-op
  REQUIRE(a.grow(s1, 4));
  auto st = a.stats();
  CHECK(st.block_size == 16);
  CHECK(st.total_blocks == 2);
  CHECK(st.used_blocks == 2);
  CHECK(st.free_blocks == 0);
  CHECK(st.cached_blocks == 0);
  CHECK(st.live_sequences == 2);
  CHECK(st.tokens_stored == 5 + 4);
  CHECK(st.wasted_slots() == 32 - 9);  // two slots of one 16-token block
  CHECK(st.prefix_queried_tokens == 0);
  a.free(s0);
  a.free(s1);
  st = a.stats();
  CHECK(st.free_blocks == 2);
  CHECK(st.tokens_stored == 0);
  CHECK(st.wasted_slots() == 0);
}

TEST_CASE("contiguous allocator: a slot is consecutive blocks, the table the paged kernels read",
          "[memory][contiguous]") {
  Wide a;
  CHECK(a.blocks_per_slot() == 3);  // 40 tokens in blocks of 16
  CHECK(a.block_size() == 16);
  CHECK(a.num_blocks() == 9);
  auto s0 = make_seq(1, 17, 17), s1 = make_seq(2, 5, 5);
  s0.max_len = s1.max_len = 40;
  REQUIRE(a.allocate(s0));
  REQUIRE(a.allocate(s1));
  CHECK(table(a, s0) == std::vector<std::int32_t>{0, 1, 2});
  CHECK(table(a, s1) == std::vector<std::int32_t>{3, 4, 5});
  CHECK(a.num_free_blocks() == 3);
  auto st = a.stats();
  CHECK(st.used_blocks == 6);
  CHECK(st.free_blocks == 3);
  CHECK(st.live_sequences == 2);
  // A fork copies the blocks the parent has written (17 tokens: two), nothing past them.
  auto child = make_seq(3, 17, 17);
  a.fork(s0, child);
  CHECK(table(a, child) == std::vector<std::int32_t>{6, 7, 8});
  CHECK(a.take_copies() == std::vector<BlockCopy>{{0, 6}, {1, 7}});
  CHECK(a.num_free_blocks() == 0);
  a.free(s1);
  CHECK(a.num_free_blocks() == 3);
}

TEST_CASE("contiguous allocator: required bytes cover every slot at full capacity", "[memory][contiguous]") {
  CHECK(Small{}.required_bytes(100) == 2u * 16u * 100u);  // capacity 12, rounded up to a block
  CHECK(Wide{}.required_bytes(10) == 3u * 48u * 10u);
  CHECK(Small{}.required_bytes(0) == 0u);
  CHECK_THROWS_WITH(Small{}.required_bytes(SIZE_MAX / 8), Catch::Contains("overflow"));
}

TEST_CASE("contiguous allocator: a shape given at run time behaves as the same shape given at build",
          "[memory][contiguous]") {
  using Runtime = ContiguousAllocator<kShapeAtRuntime>;
  Runtime a(Shape{.max_batch = 3, .max_input = 20, .max_output = 20});
  Wide b;
  CHECK(a.shape() == b.shape());
  CHECK(a.num_blocks() == b.num_blocks());
  CHECK(a.required_bytes(10) == b.required_bytes(10));
  auto s = make_seq(1, 17, 17);
  s.max_len = 40;
  auto t = make_seq(1, 17, 17);
  t.max_len = 40;
  REQUIRE(a.allocate(s));
  REQUIRE(b.allocate(t));
  CHECK(table(a, s) == table(b, t));
  auto too_long = make_seq(2, 21, 21);
  CHECK_THROWS_WITH(a.allocate(too_long), Catch::Contains("max_input is 20"));
  CHECK_THROWS_WITH(Runtime(Shape{.max_batch = 0, .max_input = 8, .max_output = 8}), Catch::Contains("max_batch is 0"));
  CHECK_THROWS_WITH(Runtime(Shape{.max_batch = 2, .max_input = 0, .max_output = 8}), Catch::Contains("max_input is 0"));
  CHECK_THROWS_WITH(Runtime(Shape{.max_batch = 2, .max_input = 8, .max_output = -1}), Catch::Contains("max_output is -1"));
}
