#pragma once
/// \file
/// `PagedBlockAllocator<BlockSize>`: the dynamic engine's BlockAllocator. The KV cache is `num_blocks`
/// blocks of `BlockSize` tokens; each live sequence has a block table (physical ids in token order),
/// so its memory grows a block at a time and wastes less than one block.
///
/// Blocks are shared two ways, both by reference count:
/// - prefix caching: a full block whose K/V were computed (`commit`) is registered under the chained
///   hash of its tokens (prefix_hash.hpp); a later prompt with the same leading blocks reuses them
///   (`allocate` returns how many tokens it found). Freed cache entries stay valid until the pool
///   evicts them, least recently freed first.
/// - fork: n > 1 samples of one prompt share the parent's blocks; the first write into a shared block
///   copies it (copy-on-write), and the copy is queued for the engine (`take_copies`).
///
/// Every failing operation (allocate → nullopt, grow → false) changes nothing, so a scheduler can try,
/// preempt someone and try again.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/block_pool.hpp"
#include "infer/memory/kv_stats.hpp"
#include "infer/memory/prefix_hash.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

template <std::int32_t BlockSize>
class PagedBlockAllocator {
  static_assert(BlockSize >= 1 && BlockSize <= 256 && (BlockSize & (BlockSize - 1)) == 0,
                "PagedBlockAllocator<BlockSize>: BlockSize must be a power of two in [1, 256] (16 is the usual choice)");

 public:
  static constexpr KvLayout layout = KvLayout::paged;
  static constexpr std::int32_t tokens_per_block = BlockSize;

  /// InvalidArgument when num_blocks < 1. With prefix caching off no hash is ever computed or looked up.
  explicit PagedBlockAllocator(std::int32_t num_blocks, bool enable_prefix_caching = true)
      : pool_(checked_blocks(num_blocks)), caching_(enable_prefix_caching),
        fill_(static_cast<std::size_t>(num_blocks), 0) {}

  /// How many blocks fit in `bytes` of KV storage when one token's K and V over all layers take
  /// `kv_bytes_per_token` bytes; 0 when not even one block fits. Capped at INT32_MAX.
  [[nodiscard]] static std::int32_t blocks_for_budget(std::size_t bytes, std::size_t kv_bytes_per_token) {
    if (kv_bytes_per_token == 0) {
      throw InvalidArgument("PagedBlockAllocator::blocks_for_budget: kv_bytes_per_token is 0; pass the bytes one "
                            "token's K and V take over all layers (2 * layers * kv_heads * head_dim * dtype size)");
    }
    if (kv_bytes_per_token > std::numeric_limits<std::size_t>::max() / BlockSize) return 0;
    const std::size_t blocks = bytes / (kv_bytes_per_token * BlockSize);
    return static_cast<std::int32_t>(std::min<std::size_t>(blocks, std::numeric_limits<std::int32_t>::max()));
  }

  [[nodiscard]] std::int32_t block_size() const noexcept { return BlockSize; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept { return pool_.num_blocks(); }
  [[nodiscard]] std::int32_t num_free_blocks() const noexcept { return pool_.num_free(); }
  [[nodiscard]] bool prefix_caching() const noexcept { return caching_; }
  [[nodiscard]] const BlockPool& pool() const noexcept { return pool_; }

  /// Whether a sequence of n tokens fits in the whole cache (with nothing else resident).
  [[nodiscard]] bool can_ever_fit(std::int32_t n) const noexcept { return blocks_for(n) <= num_blocks(); }

  /// Admits `seq`: blocks for all of seq.tokens, the longest cached prefix of full blocks reused. At
  /// most (len - 1) / BlockSize blocks are hits, so at least the last token is computed (its logits
  /// give the next token). Returns the number of cached tokens (a multiple of BlockSize), or nullopt
  /// with nothing changed when free blocks are short. The caller sets seq.num_computed (and
  /// num_cached_tokens) from the result. InvalidArgument for an empty sequence, one that already holds
  /// blocks, or one that could never fit.
  [[nodiscard]] std::optional<std::int32_t> allocate(Sequence& seq) {
    const std::int32_t len = seq.len();
    if (len < 1) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::allocate: sequence ", seq.id,
                                        " has no tokens; a prompt needs at least one token"));
    }
    if (tables_.contains(seq.id)) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::allocate: sequence ", seq.id,
                                        " already holds blocks; free it before allocating it again"));
    }
    const std::int32_t total = blocks_for(len);
    if (total > num_blocks()) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::allocate: sequence ", seq.id, " has ", len,
                                        " tokens, needing ", total, " blocks of ", BlockSize,
                                        " tokens; the cache has only ", num_blocks(),
                                        " blocks: reject it up front (can_ever_fit) or give the cache more memory"));
    }

    keys_.clear();
    hit_ids_.clear();
    std::int32_t hits_free = 0;  // hit blocks that are free now: touching them uses up free blocks too
    if (caching_) {
      extend_block_hashes(seq.tokens, BlockSize, keys_);
      const auto max_hits = seq.skip_prefix_cache_hits ? std::size_t{0} : static_cast<std::size_t>((len - 1) / BlockSize);
      for (std::size_t i = 0; i < max_hits; ++i) {
        const auto id = pool_.find(keys_[i]);
        if (!id) break;  // keys are chained: after the first miss nothing can hit
        hit_ids_.push_back(*id);
        if (pool_.block(*id).ref_count == 0) ++hits_free;
      }
    }
    const auto hits = static_cast<std::int32_t>(hit_ids_.size());
    if (total - hits > pool_.num_free() - hits_free) return std::nullopt;

    SeqBlocks sb;
    // Room for the whole expected life of the sequence, so decode steps do not reallocate the table.
    const std::int32_t expected = std::min(blocks_for(std::max(len, seq.max_len)), num_blocks());
    sb.table.reserve(static_cast<std::size_t>(expected));
    // Hits first: touching takes them off the free queue, so the fresh takes below cannot evict them.
    for (const std::int32_t id : hit_ids_) {
      pool_.touch(id);
      sb.table.push_back(id);
    }
    for (std::int32_t i = hits; i < total; ++i) sb.table.push_back(take_fresh());
    if (caching_) {
      sb.keys.reserve(static_cast<std::size_t>(expected));
      sb.keys.assign(keys_.begin(), keys_.end());
      sb.num_registered = hits;
      sb.num_hit = hits;
      stats_.prefix_queried_tokens += len;
      stats_.prefix_hit_tokens += static_cast<std::int64_t>(hits) * BlockSize;
    }
    sb.held = len;
    update_fill(sb, 0);
    tables_.emplace(seq.id, std::move(sb));
    return hits * BlockSize;
  }

  /// Makes the table cover n tokens in total. Tokens [seq.num_computed, n) are about to be written;
  /// a block among them that another sequence shares is replaced first: by a copy (queued for
  /// take_copies) when it already holds computed rows of seq, by a fresh block otherwise. False with
  /// nothing changed when free blocks are short. InvalidArgument for a sequence without blocks.
  [[nodiscard]] bool grow(Sequence& seq, std::int32_t n) {
    SeqBlocks& sb = find(seq.id, "grow");
    if (n < 0) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::grow: sequence ", seq.id, " asked for ", n,
                                        " tokens; a token count is never negative"));
    }
    const auto have = static_cast<std::int32_t>(sb.table.size());
    const std::int32_t need = blocks_for(n);
    const std::int32_t extend = std::max(0, need - have);
    const std::int32_t first_written = seq.num_computed / BlockSize;
    const std::int32_t end_written = n > seq.num_computed ? std::min(have, need) : first_written;
    std::int32_t shared = 0;
    for (std::int32_t i = first_written; i < end_written; ++i) {
      if (pool_.block(sb.table[static_cast<std::size_t>(i)]).ref_count > 1) ++shared;
    }
    if (extend + shared > pool_.num_free()) return false;

    if (shared > 0) {
      for (std::int32_t i = first_written; i < end_written; ++i) {
        std::int32_t& slot = sb.table[static_cast<std::size_t>(i)];
        if (pool_.block(slot).ref_count <= 1) continue;
        const std::int32_t fresh = take_fresh();
        if (i * BlockSize < seq.num_computed) copies_.push_back(BlockCopy{slot, fresh});
        release_block(slot);  // ref > 1: the other holders keep it
        slot = fresh;
      }
    }
    for (std::int32_t i = 0; i < extend; ++i) sb.table.push_back(take_fresh());
    // Fills change only in replaced blocks, the block holding the old end and the new blocks.
    const std::int32_t from = std::min({first_written, sb.held / BlockSize, have});
    sb.held = std::max(sb.held, n);
    update_fill(sb, from);
    return true;
  }

  /// The copy-on-write copies queued since the last call, in the order they were made.
  [[nodiscard]] std::vector<BlockCopy> take_copies() { return std::exchange(copies_, {}); }

  /// `child` shares every block of `parent` (each reference count + 1). InvalidArgument when parent has
  /// no blocks, child already has some, or they are the same sequence.
  void fork(const Sequence& parent, Sequence& child) {
    if (parent.id == child.id) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::fork: parent and child are both sequence ", parent.id,
                                        "; give the child its own id"));
    }
    const SeqBlocks& p = find(parent.id, "fork");
    if (tables_.contains(child.id)) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::fork: child sequence ", child.id,
                                        " already holds blocks; fork into a new sequence"));
    }
    for (const std::int32_t id : p.table) pool_.touch(id);
    // Fills are unchanged: the child holds the same tokens in the same blocks.
    SeqBlocks copy;
    copy.table.reserve(p.table.capacity());
    copy.table.assign(p.table.begin(), p.table.end());
    copy.keys.reserve(p.keys.capacity());
    copy.keys.assign(p.keys.begin(), p.keys.end());
    copy.num_registered = p.num_registered;
    copy.num_hit = p.num_registered;  // the child's blocks are the parent's, written or being written by it
    copy.held = p.held;
    tables_.emplace(child.id, std::move(copy));
  }

  /// Tokens [0, num_tokens) of seq have K/V by the end of the step being planned: every full block among
  /// them becomes a prefix-cache entry, unless another block already holds the same key (then this one
  /// stays unregistered). Schedulers call this as they plan a chunk, as vLLM v1 does, so that a sequence
  /// admitted later in the same step already shares those blocks: the forward pass writes every chunk's
  /// K/V before any chunk's attention reads them. free() drops entries whose content was never written.
  void commit(const Sequence& seq, std::int32_t num_tokens) {
    SeqBlocks& sb = find(seq.id, "commit");
    if (num_tokens < 0 || num_tokens > seq.len() || num_tokens > sb.held) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::commit: sequence ", seq.id, " commits ", num_tokens,
                                        " tokens but has ", seq.len(), " tokens and blocks for ", sb.held,
                                        "; the count must lie within both"));
    }
    if (!caching_) return;
    const std::int32_t full = num_tokens / BlockSize;
    if (full <= sb.num_registered) return;
    extend_block_hashes(std::span<const std::int32_t>(seq.tokens).first(static_cast<std::size_t>(full) * BlockSize),
                        BlockSize, sb.keys);
    for (std::int32_t i = sb.num_registered; i < full; ++i) {
      const auto u = static_cast<std::size_t>(i);
      if (!pool_.block(sb.table[u]).hash) pool_.cache(sb.table[u], sb.keys[u]);
    }
    sb.num_registered = full;
  }

  /// Releases every block of seq, tail first, so that under LRU a sequence's later blocks are evicted
  /// before its earlier ones (a shorter prefix stays useful longer). Unknown sequences are a no-op.
  void free(const Sequence& seq) {
    const auto it = tables_.find(seq.id);
    if (it == tables_.end()) return;
    const auto& table = it->second.table;
    // Blocks committed for a step that will not compute them (seq is preempted or fails while planned)
    // must not stay findable: forget those only this sequence holds.
    const std::int32_t written = std::max(it->second.num_hit, std::max(seq.num_computed, 0) / BlockSize);
    for (auto i = static_cast<std::size_t>(written); i < static_cast<std::size_t>(it->second.num_registered); ++i)
      if (pool_.block(table[i]).ref_count == 1) pool_.forget(table[i]);
    for (auto b = table.rbegin(); b != table.rend(); ++b) release_block(*b);
    tables_.erase(it);
  }

  /// Physical block ids of seq in token order; empty for a sequence that holds no blocks.
  [[nodiscard]] std::span<const std::int32_t> block_table(const Sequence& seq) const {
    const auto it = tables_.find(seq.id);
    if (it == tables_.end()) return {};
    return it->second.table;
  }

  [[nodiscard]] KvStats stats() const {
    KvStats s = stats_;
    s.block_size = BlockSize;
    s.total_blocks = num_blocks();
    s.free_blocks = pool_.num_free();
    s.cached_blocks = pool_.num_cached_free();
    s.used_blocks = num_blocks() - pool_.num_free();
    s.tokens_stored = tokens_stored_;
    s.live_sequences = static_cast<std::int32_t>(tables_.size());
    s.evictions = pool_.evictions();
    return s;
  }

 private:
  struct SeqBlocks {
    std::vector<std::int32_t> table;
    std::vector<std::uint64_t> keys;   ///< chained keys of seq's leading full blocks known so far
    std::int32_t num_registered = 0;   ///< leading blocks already offered to the cache
    std::int32_t num_hit = 0;          ///< leading blocks found in the cache at allocate (someone else's)
    std::int32_t held = 0;             ///< tokens the table is sized for
  };

  static std::int32_t checked_blocks(std::int32_t n) {
    if (n < 1) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator: num_blocks is ", n,
                                        "; the KV cache needs at least 1 block (check the memory budget)"));
    }
    return n;
  }
  static constexpr std::int32_t blocks_for(std::int32_t tokens) noexcept {
    return tokens <= 0 ? 0 : (tokens - 1) / BlockSize + 1;
  }

  SeqBlocks& find(SeqId id, const char* what) {
    const auto it = tables_.find(id);
    if (it == tables_.end()) {
      throw InvalidArgument(detail::cat("PagedBlockAllocator::", what, ": sequence ", id,
                                        " holds no blocks; allocate it first"));
    }
    return it->second;
  }

  /// Only called after checking that enough blocks are free.
  std::int32_t take_fresh() { return *pool_.take(); }

  void release_block(std::int32_t id) {
    if (pool_.block(id).ref_count == 1) {
      auto& f = fill_[static_cast<std::size_t>(id)];
      tokens_stored_ -= f;
      f = 0;
    }
    pool_.release(id);
  }

  /// Raises the recorded fill of sb's blocks from index `from` on to what sb holds in them. Blocks
  /// shared by several sequences hold the same tokens for all of them (a block is written only after
  /// copy-on-write made it private), so a max per block counts shared tokens once.
  void update_fill(const SeqBlocks& sb, std::int32_t from) {
    for (std::size_t i = static_cast<std::size_t>(from); i < sb.table.size(); ++i) {
      const std::int32_t start = static_cast<std::int32_t>(i) * BlockSize;
      const std::int32_t f = std::clamp(sb.held - start, 0, BlockSize);
      auto& cur = fill_[static_cast<std::size_t>(sb.table[i])];
      if (f > cur) {
        tokens_stored_ += f - cur;
        cur = f;
      }
    }
  }

  BlockPool pool_;
  bool caching_;
  std::vector<std::int32_t> fill_;  ///< tokens held in each block by its live holders
  std::int64_t tokens_stored_ = 0;
  std::unordered_map<SeqId, SeqBlocks> tables_;
  std::vector<BlockCopy> copies_;
  KvStats stats_;                    ///< the prefix counters; the rest is filled in by stats()
  std::vector<std::uint64_t> keys_;  ///< allocate's scratch, reused
  std::vector<std::int32_t> hit_ids_;
};

static_assert(BlockAllocator<PagedBlockAllocator<16>>, "PagedBlockAllocator must satisfy infer::BlockAllocator");

}  // namespace infer
