#pragma once
/// \file
/// `StepPlan`: what one engine iteration will compute, as decided by a Scheduler. Scheduling is
/// plan-then-apply: `schedule()` makes the admission, chunking and preemption decisions (and reserves
/// KV blocks for them); the engine then runs exactly this plan and reports back. A plan is plain data,
/// so schedulers are tested without a model, and a static engine's plan shape is fixed enough to capture.

#include <cstdint>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sched/sequence.hpp"

namespace infer {

/// One sequence's share of a step: tokens [start, start + count) are computed.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  std::int32_t start = 0;  ///< == seq->num_computed when planned
  std::int32_t count = 0;  ///< > 0
  /// The chunk reaches the sequence's last token, so its last position's logits give the next token.
  /// False for a non-final chunk of a chunked prefill.
  bool samples = false;
};

/// A copy-on-write: the engine copies KV block `src` into block `dst` (every layer) before the step.
struct BlockCopy {
  std::int32_t src = 0;
  std::int32_t dst = 0;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

/// The largest step a scheduler will ever plan: what the model sizes its step buffers for, and the batch
/// sizes its CUDA graphs are captured up to, once, before the KV pool takes the rest of the memory.
struct StepBounds {
  std::int32_t max_tokens = 0;     ///< tokens computed in one step, over all sequences
  std::int32_t max_sequences = 0;  ///< sequences in one step (the decode batch)
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  ///< batch order: decodes first, then prefill chunks
  std::vector<Sequence*> preempted;    ///< sent back to waiting in this step; their blocks are freed
  /// Admitted from waiting in this step (new, or resuming after a preemption), in admission order. Only
  /// reported (the engine's step trace); a scheduler that leaves it empty runs the same.
  std::vector<Sequence*> admitted;
  std::vector<BlockCopy> copies;       ///< to apply before computing

  [[nodiscard]] bool empty() const noexcept { return chunks.empty(); }
  [[nodiscard]] std::int32_t num_tokens() const noexcept {
    std::int32_t n = 0;
    for (const auto& c : chunks) n += c.count;
    return n;
  }
};

// ---- building blocks shared by the stock schedulers, public for a scheduler of your own ---------------

/// A chunk of `count` tokens from `seq`'s computed prefix on: the one place `samples` is decided.
inline ScheduledChunk make_chunk(Sequence& seq, std::int32_t count) {
  return ScheduledChunk{&seq, seq.num_computed, count, seq.num_computed + count == seq.len()};
}

/// A decode computes the single newest token of a sequence past its prompt; it goes first in the batch
/// (kernels take the decode rows as one group, prefill chunks after them).
inline bool is_decode(const ScheduledChunk& c) noexcept { return c.count == 1 && c.start >= c.seq->prompt_len; }

/// Applies a step's chunks (a scheduler's update()): shared by every scheduler, so "computed" means the
/// same everywhere. Chunks of sequences finished since the plan was made are skipped (their blocks are gone).
inline void apply_plan(const StepPlan& plan) {
  for (const auto& chunk : plan.chunks) {
    Sequence& seq = *chunk.seq;
    if (seq.status != SeqStatus::running) continue;
    if (chunk.start != seq.num_computed || chunk.start + chunk.count > seq.len()) {
      throw InvalidArgument(detail::cat("update(): the plan computes tokens [", chunk.start, ", ",
                                        chunk.start + chunk.count, ") of sequence ", seq.id, ", which has ",
                                        seq.num_computed, " computed of ", seq.len(),
                                        " tokens; call update() exactly once with the plan the last schedule() "
                                        "returned"));
    }
    seq.num_computed += chunk.count;
  }
}

}  // namespace infer
