#pragma once
/// \file
/// `BlockPool`: the physical KV blocks of a paged cache as metadata — reference counts, prefix-cache
/// hashes and the free queue — with no pointers to K/V bytes. The engine keeps one K and one V tensor
/// per layer, and a block id indexes the same rows of every layer's storage, so one pool serves all
/// layers.
///
/// Free blocks sit in an LRU queue. A block released to reference count 0 goes to the queue's tail and
/// keeps its hash: it is still a valid prefix-cache entry until something takes it. Taking always pops
/// the head, so the block freed longest ago is reused (evicted) first, and a cached block that is hit
/// again (`touch`) leaves the queue before it can be evicted. Every operation is O(1) and none
/// allocates: the queue is intrusive (prev/next index arrays over block ids) and the hash map is
/// reserved for one entry per block up front.

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "infer/core/error.hpp"

namespace infer {

/// One physical block's metadata.
struct KvBlock {
  std::int32_t id = 0;
  std::int32_t ref_count = 0;          ///< sequences whose block table holds this block
  std::optional<std::uint64_t> hash;   ///< chained prefix hash while the block is a cache entry
};

namespace detail {

/// An O(1) doubly linked queue of block ids, threaded through two index arrays. A block is in the
/// queue at most once; `contains` is O(1) too.
class FreeBlockQueue {
 public:
  /// Starts holding every id 0..n-1 in ascending order, so fresh blocks are handed out in id order.
  explicit FreeBlockQueue(std::int32_t n)
      : prev_(static_cast<std::size_t>(n), kNone), next_(static_cast<std::size_t>(n), kNone),
        queued_(static_cast<std::size_t>(n), 1), size_(n) {
    for (std::int32_t i = 0; i < n; ++i) {
      prev_[idx(i)] = i - 1;
      next_[idx(i)] = i + 1 < n ? i + 1 : kNone;
    }
    head_ = n > 0 ? 0 : kNone;
    tail_ = n > 0 ? n - 1 : kNone;
  }

  [[nodiscard]] std::int32_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::int32_t front() const noexcept { return head_; }  ///< kNone when empty
  [[nodiscard]] std::int32_t back() const noexcept { return tail_; }   ///< kNone when empty
  [[nodiscard]] bool contains(std::int32_t id) const noexcept { return queued_[idx(id)] != 0; }
  /// The id after `id` towards the tail, or kNone.
  [[nodiscard]] std::int32_t next(std::int32_t id) const noexcept { return next_[idx(id)]; }

  void push_back(std::int32_t id) noexcept {
    prev_[idx(id)] = tail_;
    next_[idx(id)] = kNone;
    if (tail_ == kNone) {
      head_ = id;
    } else {
      next_[idx(tail_)] = id;
    }
    tail_ = id;
    queued_[idx(id)] = 1;
    ++size_;
  }

  /// Removes and returns the head; the queue must not be empty.
  std::int32_t pop_front() noexcept {
    const std::int32_t id = head_;
    remove(id);
    return id;
  }

  /// Unlinks `id`, which must be in the queue.
  void remove(std::int32_t id) noexcept {
    const std::int32_t p = prev_[idx(id)];
    const std::int32_t n = next_[idx(id)];
    if (p == kNone) {
      head_ = n;
    } else {
      next_[idx(p)] = n;
    }
    if (n == kNone) {
      tail_ = p;
    } else {
      prev_[idx(n)] = p;
    }
    prev_[idx(id)] = kNone;
    next_[idx(id)] = kNone;
    queued_[idx(id)] = 0;
    --size_;
  }

  static constexpr std::int32_t kNone = -1;

 private:
  static std::size_t idx(std::int32_t id) noexcept { return static_cast<std::size_t>(id); }

  std::vector<std::int32_t> prev_;
  std::vector<std::int32_t> next_;
  std::vector<std::uint8_t> queued_;  // not vector<bool>: a byte per block keeps contains() a plain load
  std::int32_t head_ = kNone;
  std::int32_t tail_ = kNone;
  std::int32_t size_ = 0;
};

}  // namespace detail

class BlockPool {
 public:
  explicit BlockPool(std::int32_t num_blocks) : queue_(checked_count(num_blocks)) {
    blocks_.resize(static_cast<std::size_t>(num_blocks));
    for (std::int32_t i = 0; i < num_blocks; ++i) blocks_[static_cast<std::size_t>(i)].id = i;
    cached_.reserve(static_cast<std::size_t>(num_blocks));
  }

  [[nodiscard]] std::int32_t num_blocks() const noexcept { return static_cast<std::int32_t>(blocks_.size()); }
  /// Blocks no sequence holds (including cached ones): what `take` can hand out.
  [[nodiscard]] std::int32_t num_free() const noexcept { return queue_.size(); }
  /// Free blocks that still hold a prefix-cache entry.
  [[nodiscard]] std::int32_t num_cached_free() const noexcept { return cached_free_; }
  /// Cache entries, free or in use.
  [[nodiscard]] std::int32_t num_cached() const noexcept { return static_cast<std::int32_t>(cached_.size()); }
  /// Cached blocks that `take` reused for other content, ever.
  [[nodiscard]] std::int64_t evictions() const noexcept { return evictions_; }
  [[nodiscard]] const detail::FreeBlockQueue& free_queue() const noexcept { return queue_; }

  [[nodiscard]] const KvBlock& block(std::int32_t id) const { return blocks_[checked(id, "block")]; }

  /// Takes the least recently freed block with reference count 1, or nullopt when none is free. A
  /// block that still holds a cache entry loses it (an eviction): its rows are about to be overwritten.
  [[nodiscard]] std::optional<std::int32_t> take() {
    if (queue_.empty()) return std::nullopt;
    const std::int32_t id = queue_.pop_front();
    KvBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.hash) {
      cached_.erase(*b.hash);
      b.hash.reset();
      --cached_free_;
      ++evictions_;
    }
    b.ref_count = 1;
    return id;
  }

  /// The block registered under `hash`, if any (free or in use).
  [[nodiscard]] std::optional<std::int32_t> find(std::uint64_t hash) const {
    const auto it = cached_.find(hash);
    if (it == cached_.end()) return std::nullopt;
    return it->second;
  }

  /// One more sequence uses block `id` (a prefix-cache hit, or a fork). A free block leaves the free
  /// queue, so it can no longer be evicted.
  void touch(std::int32_t id) {
    KvBlock& b = blocks_[checked(id, "touch")];
    if (b.ref_count == 0) {
      queue_.remove(id);
      if (b.hash) --cached_free_;
    }
    ++b.ref_count;
  }

  /// One sequence stops using block `id`. At reference count 0 it joins the free queue's tail with its
  /// hash kept, so a later prompt can still hit it until it is evicted.
  void release(std::int32_t id) {
    KvBlock& b = blocks_[checked(id, "release")];
    if (b.ref_count == 0) {
      throw InvalidArgument(detail::cat("BlockPool::release: block ", id,
                                        " is already free (reference count 0); release each block once per holder"));
    }
    if (--b.ref_count == 0) {
      queue_.push_back(id);
      if (b.hash) ++cached_free_;
    }
  }

  /// Registers block `id` as the cache entry for `hash`. Returns false, changing nothing, when another
  /// block already holds that hash (two sequences computed the same content: the first entry stays, so
  /// hits keep landing on one block and the duplicate is simply freed later).
  bool cache(std::int32_t id, std::uint64_t hash) {
    KvBlock& b = blocks_[checked(id, "cache")];
    if (b.hash) {
      if (*b.hash == hash) return true;
      throw InvalidArgument(detail::cat("BlockPool::cache: block ", id, " already holds hash ", *b.hash,
                                        "; a block holds one content until it is taken again"));
    }
    const bool inserted = cached_.emplace(hash, id).second;
    if (!inserted) return false;
    b.hash = hash;
    if (b.ref_count == 0) ++cached_free_;
    return true;
  }

  /// Drops block `id`'s cache entry (its content will never be completed: the sequence that was to
  /// write it was freed first). No-op for a block without a hash.
  void forget(std::int32_t id) {
    KvBlock& b = blocks_[checked(id, "forget")];
    if (!b.hash) return;
    const auto it = cached_.find(*b.hash);
    if (it != cached_.end() && it->second == id) cached_.erase(it);
    if (b.ref_count == 0) --cached_free_;
    b.hash.reset();
  }

 private:
  static std::int32_t checked_count(std::int32_t n) {
    if (n < 1) {
      throw InvalidArgument(detail::cat("BlockPool: num_blocks is ", n, "; a KV cache needs at least 1 block"));
    }
    return n;
  }
  std::size_t checked(std::int32_t id, const char* what) const {
    if (id < 0 || id >= num_blocks()) {
      throw InvalidArgument(detail::cat("BlockPool::", what, ": block id ", id, " is out of range [0, ",
                                        num_blocks(), ")"));
    }
    return static_cast<std::size_t>(id);
  }

  std::vector<KvBlock> blocks_;
  detail::FreeBlockQueue queue_;
  std::unordered_map<std::uint64_t, std::int32_t> cached_;  // xxHash output is uniform: std::hash's identity is fine
  std::int32_t cached_free_ = 0;
  std::int64_t evictions_ = 0;
};

}  // namespace infer
