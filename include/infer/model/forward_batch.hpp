#pragma once
/// \file
/// `ForwardChunk`: one sequence's share of a step, as the model sees it — the engine turns a
/// StepPlan's ScheduledChunks into these (tokens, positions, the allocator's block table), so the
/// model knows nothing of Sequence, schedulers or allocators.

#include <cstdint>
#include <span>

namespace infer {

struct ForwardChunk {
  std::span<const std::int32_t> tokens;  ///< the tokens computed this step, at positions start .. start+tokens.size()-1
  std::int32_t start = 0;                ///< position of tokens[0]; K/V of positions < start are in the cache
  std::span<const std::int32_t> block_table;  ///< the sequence's blocks (the allocator's block_table())
  bool samples = false;                        ///< produce logits for the chunk's last position
};

}  // namespace infer
