#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/memory/block_pool.hpp"
#include "infer/memory/prefix_hash.hpp"

using namespace infer;
using detail::FreeBlockQueue;

namespace {
std::vector<std::int32_t> order(const FreeBlockQueue& q) {
  std::vector<std::int32_t> out;
  for (auto id = q.front(); id != FreeBlockQueue::kNone; id = q.next(id)) out.push_back(id);
  return out;
}
}  // namespace

TEST_CASE("free queue starts in id order and supports O(1) removal anywhere", "[memory][block_pool]") {
  FreeBlockQueue q(5);
  CHECK(q.size() == 5);
  CHECK(order(q) == std::vector<std::int32_t>{0, 1, 2, 3, 4});
  q.remove(2);  // middle
  CHECK_FALSE(q.contains(2));
  CHECK(order(q) == std::vector<std::int32_t>{0, 1, 3, 4});
  q.remove(0);  // head
  q.remove(4);  // tail
  CHECK(q.front() == 1);
  CHECK(q.back() == 3);
  CHECK(order(q) == std::vector<std::int32_t>{1, 3});
  q.push_back(0);
  CHECK(order(q) == std::vector<std::int32_t>{1, 3, 0});
  CHECK(q.pop_front() == 1);
  CHECK(q.pop_front() == 3);
  CHECK(q.pop_front() == 0);
  CHECK(q.empty());
  CHECK(q.front() == FreeBlockQueue::kNone);
  CHECK(q.back() == FreeBlockQueue::kNone);
  q.push_back(4);  // re-linking after emptying
  CHECK(order(q) == std::vector<std::int32_t>{4});
  CHECK(q.size() == 1);
}

TEST_CASE("pool hands out blocks in id order with reference count 1", "[memory][block_pool]") {
  BlockPool pool(3);
  CHECK(pool.num_blocks() == 3);
  CHECK(pool.num_free() == 3);
  CHECK(pool.take() == 0);
  CHECK(pool.take() == 1);
  CHECK(pool.block(1).ref_count == 1);
  CHECK(pool.take() == 2);
  CHECK(pool.num_free() == 0);
  CHECK_FALSE(pool.take().has_value());
  pool.release(1);
  CHECK(pool.num_free() == 1);
  CHECK(pool.block(1).ref_count == 0);
  CHECK(pool.take() == 1);
}

TEST_CASE("pool rejects bad sizes, ids and double releases", "[memory][block_pool]") {
  CHECK_THROWS_AS(BlockPool(0), InvalidArgument);
  CHECK_THROWS_WITH(BlockPool(-2), Catch::Contains("num_blocks is -2"));
  BlockPool pool(2);
  CHECK_THROWS_WITH(pool.release(0), Catch::Contains("block 0 is already free"));
  CHECK_THROWS_WITH(pool.touch(2), Catch::Contains("block id 2 is out of range [0, 2)"));
  CHECK_THROWS_AS(pool.block(-1), InvalidArgument);
  CHECK(pool.num_free() == 2);  // nothing changed
}

TEST_CASE("released cached blocks stay hittable and are evicted least recently freed first", "[memory][block_pool]") {
  BlockPool pool(4);
  const auto a = *pool.take();  // 0
  const auto b = *pool.take();  // 1
  REQUIRE(pool.cache(a, 100));
  REQUIRE(pool.cache(b, 200));
  CHECK(pool.num_cached() == 2);
  CHECK(pool.num_cached_free() == 0);  // in use
  pool.release(b);  // freed first: oldest
  pool.release(a);
  CHECK(pool.num_cached_free() == 2);
  CHECK(pool.block(a).hash == 100u);
  CHECK(pool.find(100) == a);
  CHECK(order(pool.free_queue()) == std::vector<std::int32_t>{2, 3, b, a});

  // Uncached never-used blocks come first, then b (freed longest ago), then a.
  CHECK(pool.take() == 2);
  CHECK(pool.take() == 3);
  CHECK(pool.evictions() == 0);
  CHECK(pool.take() == b);
  CHECK(pool.evictions() == 1);
  CHECK_FALSE(pool.find(200).has_value());
  CHECK_FALSE(pool.block(b).hash.has_value());
  CHECK(pool.find(100) == a);  // still cached
  CHECK(pool.num_cached_free() == 1);
}

TEST_CASE("touching a cached free block takes it off the free queue", "[memory][block_pool]") {
  BlockPool pool(3);
  const auto a = *pool.take();
  REQUIRE(pool.cache(a, 7));
  pool.release(a);
  CHECK(pool.num_free() == 3);
  pool.touch(a);  // a prefix hit
  CHECK(pool.num_free() == 2);
  CHECK(pool.block(a).ref_count == 1);
  CHECK(pool.num_cached_free() == 0);
  CHECK_FALSE(pool.free_queue().contains(a));
  // Draining the queue never evicts a.
  CHECK(pool.take() == 1);
  CHECK(pool.take() == 2);
  CHECK_FALSE(pool.take().has_value());
  CHECK(pool.evictions() == 0);
  CHECK(pool.find(7) == a);
  pool.touch(a);  // a second holder
  CHECK(pool.block(a).ref_count == 2);
  pool.release(a);
  CHECK(pool.num_free() == 0);  // still held once
  pool.release(a);
  CHECK(pool.num_free() == 1);
  CHECK(pool.free_queue().back() == a);
}

TEST_CASE("a hash keeps its first block, a duplicate registration is refused", "[memory][block_pool]") {
  BlockPool pool(3);
  const auto a = *pool.take();
  const auto b = *pool.take();
  CHECK(pool.cache(a, 42));
  CHECK(pool.cache(a, 42));       // idempotent
  CHECK_FALSE(pool.cache(b, 42)); // same content elsewhere: keep a
  CHECK_FALSE(pool.block(b).hash.has_value());
  CHECK(pool.find(42) == a);
  CHECK(pool.num_cached() == 1);
  CHECK_THROWS_WITH(pool.cache(a, 43), Catch::Contains("already holds hash 42"));
}

TEST_CASE("chained block hashes depend on the whole prefix", "[memory][prefix_hash]") {
  const std::vector<std::int32_t> x{1, 2, 3, 4};
  const std::vector<std::int32_t> y{5, 6, 7, 8};
  const auto hx = hash_block(kPrefixHashSeed, x);
  CHECK(hx == hash_block(kPrefixHashSeed, x));  // deterministic
  CHECK(hx != hash_block(kPrefixHashSeed, y));
  // The same block tokens after a different first block get a different key.
  CHECK(hash_block(hx, y) != hash_block(hash_block(kPrefixHashSeed, y), y));
  CHECK(hash_block(hx, y) != hash_block(kPrefixHashSeed, y));
  // Token order matters.
  CHECK(hash_block(kPrefixHashSeed, std::vector<std::int32_t>{2, 1, 3, 4}) != hx);

  std::vector<std::int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<std::uint64_t> keys;
  extend_block_hashes(tokens, 4, keys);
  REQUIRE(keys.size() == 2);  // the partial third block gets no key
  CHECK(keys[0] == hx);
  CHECK(keys[1] == hash_block(hx, y));
  tokens.insert(tokens.end(), {10, 11, 12});
  extend_block_hashes(tokens, 4, keys);
  REQUIRE(keys.size() == 3);
  CHECK(keys[0] == hx);  // extended, not recomputed
  CHECK(keys[2] == hash_block(keys[1], std::vector<std::int32_t>{9, 10, 11, 12}));
}
