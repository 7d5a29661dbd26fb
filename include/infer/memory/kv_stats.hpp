#pragma once
/// \file
/// What a BlockAllocator reports about the KV cache: occupancy, waste and prefix-cache effectiveness.

#include <cstdint>

namespace infer {

struct KvStats {
  std::int32_t block_size = 0;    ///< tokens per block (a contiguous slot counts as one block)
  std::int32_t total_blocks = 0;
  std::int32_t free_blocks = 0;   ///< allocatable now (includes cached blocks no sequence uses)
  std::int32_t cached_blocks = 0; ///< free blocks that still hold a reusable prefix
  std::int32_t used_blocks = 0;   ///< referenced by at least one sequence (shared blocks count once)
  std::int64_t tokens_stored = 0; ///< tokens the live sequences hold (a shared block's tokens count once)
  std::int32_t live_sequences = 0;
  std::int64_t prefix_queried_tokens = 0;  ///< prompt tokens looked up in the prefix cache, ever
  std::int64_t prefix_hit_tokens = 0;      ///< of those, found cached (not recomputed)
  std::int64_t evictions = 0;              ///< cached blocks reused for other content

  /// Slots allocated but holding no token: the waste paging keeps under one block per live sequence.
  [[nodiscard]] std::int64_t wasted_slots() const noexcept {
    return static_cast<std::int64_t>(used_blocks) * block_size - tokens_stored;
  }
};

}  // namespace infer
