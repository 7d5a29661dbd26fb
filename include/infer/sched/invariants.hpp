#pragma once
/// \file
/// What every Scheduler must keep true, checked where a broken one would otherwise fail silently: the
/// engine calls these each step (and `infer::testing::SimEngine` does too), so a scheduler that keeps a
/// finished sequence's blocks, or plans nothing while it holds work, is reported by name instead of
/// leaking the cache until nothing is admitted and `run_to_completion()` spins.

#include <cstddef>
#include <cstdint>

#include "infer/core/error.hpp"
#include "infer/core/type_name.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

/// After scheduler `S` finished `seq`: `seq` holds no KV blocks of `alloc`. PolicyError otherwise.
template <class S, class A>
void require_released(const Sequence& seq, const A& alloc) {
  const auto table = alloc.block_table(seq);
  if (table.empty()) return;
  throw PolicyError(detail::cat(
      "scheduler ", type_name<S>(), ": sequence ", seq.id, " still holds ", table.size(),
      " KV blocks after finish() (", alloc.num_free_blocks(), " of ", alloc.num_blocks(),
      " blocks free); finish(seq, alloc) must return the blocks of the sequence it retires (alloc.free(seq)), "
      "or the cache leaks until nothing can be admitted"));
}

/// After scheduler `S` planned `plan` while holding `waiting` and `running` sequences: a plan with no chunk
/// while the scheduler holds any sequence means no step will ever change anything (nothing computes,
/// nothing finishes, no block returns), so the engine's loop would spin. PolicyError naming the scheduler,
/// the counts and the likely cause.
template <class S, class A>
void require_progress(const StepPlan& plan, std::size_t waiting, std::size_t running, const A& alloc) {
  if (!plan.empty() || (waiting == 0 && running == 0)) return;
  const std::int32_t free = alloc.num_free_blocks(), total = alloc.num_blocks();
  const char* likely =
      running > 0 ? "it gives its running sequences no tokens (a prefill budget of 0 while only prefills remain?)"
      : free < total
          ? "blocks are held although nothing runs: finish() or a preemption probably did not free them"
          : "every block is free, so its admission (or a policy's prefill budget of 0) admits nothing";
  throw PolicyError(detail::cat("scheduler ", type_name<S>(), " planned an empty step while ", waiting,
                                " sequences wait and ", running, " run (", free, " of ", total,
                                " KV blocks free): no later step could differ; ", likely));
}

}  // namespace infer
