#pragma once
/// \file
/// `StaticBatchScheduler<MaxBatch>`: the scheduler of the static-shape engine (TensorRT-LLM's static
/// engine with in-flight batching). At most `MaxBatch` sequences run (0: as many as the allocator's Shape
/// has slots; a MaxBatch above that runs as many as there are slots), each in a contiguous slot whose
/// capacity (max_input + max_output of the build) is reserved when it is admitted, so there is no
/// preemption and a decode never waits for memory. A prompt is prefilled whole in one step (shapes are
/// fixed at build: no token budget, no chunking); when a sequence finishes, its slot is refilled by
/// the next waiting sequence (first come, first served) on the next step, alongside the decodes of
/// the others.
///
/// It works only with an allocator that has a fixed `Shape` (`alloc.shape()`, e.g.
/// `ContiguousAllocator<Shape{...}>`): the limits check() enforces are that shape. Used with a paged
/// allocator, `infer::Scheduler<StaticBatchScheduler<N>, Paged>` is simply false and the member call
/// fails on the `FixedShapeAllocator` constraint.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/sched/continuous_batch.hpp"  // the chunk helpers shared by both schedulers
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

/// An allocator whose capacity is a fixed shape: `alloc.shape().{max_batch, max_input, max_output}`.
template <class A>
concept FixedShapeAllocator = BlockAllocator<A> && requires(const A& a) {
  { a.shape().max_batch } -> std::convertible_to<std::int32_t>;
  { a.shape().max_input } -> std::convertible_to<std::int32_t>;
  { a.shape().max_output } -> std::convertible_to<std::int32_t>;
};

template <std::int32_t MaxBatch>
class StaticBatchScheduler {
  static_assert(MaxBatch >= 0, "StaticBatchScheduler<MaxBatch>: MaxBatch must not be negative (0: the shape's slots)");

  /// Sequences that may run at once: MaxBatch, at most the allocator's slots.
  template <class A>
  static std::int32_t running_limit(const A& alloc) noexcept {
    const auto slots = static_cast<std::int32_t>(alloc.shape().max_batch);
    return MaxBatch > 0 ? std::min(MaxBatch, slots) : slots;
  }

 public:
  static constexpr std::int32_t max_batch = MaxBatch;

  [[nodiscard]] std::size_t num_waiting() const noexcept { return waiting_.size(); }
  [[nodiscard]] std::size_t num_running() const noexcept { return running_.size(); }

  /// The largest step: every running slot prefilling a whole prompt of max_input tokens at once (a
  /// refill prefills whole; the other slots then decode one token each, fewer in all).
  template <class A>
    requires FixedShapeAllocator<A>
  [[nodiscard]] StepBounds bounds(const A& alloc) const noexcept {
    const std::int32_t n = running_limit(alloc);
    return {n * static_cast<std::int32_t>(alloc.shape().max_input), n};
  }

  /// Throws InvalidArgument when `seq` exceeds the engine's build-time shape.
  template <class A>
    requires FixedShapeAllocator<A>
  void check(const Sequence& seq, const A& alloc) const {
    const auto shape = alloc.shape();
    if (seq.len() < 1 || seq.prompt_len < 1 || seq.prompt_len > seq.len()) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " has ", seq.len(), " tokens and prompt_len ",
                                        seq.prompt_len, "; a sequence needs a non-empty prompt"));
    }
    if (seq.prompt_len > shape.max_input) {
      throw InvalidArgument(detail::cat("prompt has ", seq.prompt_len, " tokens; this engine's max_input is ",
                                        shape.max_input,
                                        " (build a StaticEngine with a larger Shape or use the paged engine)"));
    }
    if (seq.max_len < seq.len()) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " has ", seq.len(), " tokens but max_len ", seq.max_len,
                                        "; set max_len to prompt_len + max_tokens (at least the tokens it has)"));
    }
    if (seq.max_len - seq.prompt_len > shape.max_output) {
      throw InvalidArgument(detail::cat("request may generate ", seq.max_len - seq.prompt_len,
                                        " tokens; this engine's max_output is ", shape.max_output,
                                        " (lower max_tokens, build a StaticEngine with a larger Shape or use the "
                                        "paged engine)"));
    }
    if (!alloc.can_ever_fit(seq.max_len)) {  // the shape says yes; a custom allocator may still say no
      throw InvalidArgument(detail::cat("sequence ", seq.id, " may grow to ", seq.max_len,
                                        " tokens but a slot of this engine holds ", shape.max_input + shape.max_output,
                                        " (build a StaticEngine with a larger Shape or use the paged engine)"));
    }
  }

  /// Queues a new sequence, first come first served by arrival.
  void add(Sequence* seq) {
    if (seq == nullptr) throw InvalidArgument("add(): the sequence pointer is null");
    if (seq->status != SeqStatus::waiting) {
      throw InvalidArgument(detail::cat("add(): sequence ", seq->id, " is ",
                                        seq->status == SeqStatus::running ? "running" : "finished",
                                        "; only a new (waiting) sequence can be added"));
    }
    seq->num_computed = 0;
    detail::insert_by_arrival(waiting_, seq);
  }

  /// Running sequences decode (or finish their prefill); free slots are refilled from the queue, each
  /// newcomer prefilled whole. Throws InvalidArgument if the allocator breaks its reservation promise.
  template <class A>
    requires FixedShapeAllocator<A>
  StepPlan schedule(A& alloc) {
    StepPlan plan;
    const auto limit = static_cast<std::size_t>(running_limit(alloc));
    plan.chunks.reserve(limit);
    prefills_.clear();

    for (Sequence* seq : running_) {
      const std::int32_t count = seq->num_uncomputed();
      if (count <= 0) continue;  // no token appended since its last step
      if (!alloc.grow(*seq, seq->len())) {
        throw InvalidArgument(detail::cat("sequence ", seq->id, " could not grow to ", seq->len(),
                                          " tokens inside its reserved slot of ",
                                          alloc.shape().max_input + alloc.shape().max_output,
                                          "; StaticBatchScheduler needs an allocator that reserves a whole slot "
                                          "(max_input + max_output) at admission"));
      }
      push_chunk(plan, make_chunk(*seq, count));
      alloc.commit(*seq, seq->len());
    }

    while (!waiting_.empty() && running_.size() < limit) {
      Sequence& seq = *waiting_.front();
      const std::optional<std::int32_t> cached = alloc.allocate(seq);
      if (!cached) break;  // no free slot (shared allocator): wait for the next finish
      seq.num_computed = usable_cached_tokens(cached, seq);
      seq.num_cached_tokens = seq.num_computed;
      seq.status = SeqStatus::running;
      waiting_.pop_front();
      running_.push_back(&seq);
      plan.admitted.push_back(&seq);
      push_chunk(plan, make_chunk(seq, seq.num_uncomputed()));
      alloc.commit(seq, seq.len());
    }

    plan.chunks.insert(plan.chunks.end(), prefills_.begin(), prefills_.end());
    plan.copies = alloc.take_copies();
    return plan;
  }

  template <class A>
    requires FixedShapeAllocator<A>
  void update(const StepPlan& plan, A& /*alloc*/) {
    apply_plan(plan);
  }

  /// Retires a finished or aborted sequence; its slot is refilled on the next schedule(). Idempotent.
  template <class A>
    requires FixedShapeAllocator<A>
  void finish(Sequence* seq, A& alloc) {
    if (seq == nullptr) throw InvalidArgument("finish(): the sequence pointer is null");
    if (detail::erase_one(running_, seq)) {
      alloc.free(*seq);
    } else {
      detail::erase_one(waiting_, seq);
    }
    seq->status = SeqStatus::finished;
  }

  /// A sibling sample takes a slot of its own (the allocator copies the parent's KV into it).
  template <class A>
    requires FixedShapeAllocator<A>
  void fork(Sequence* parent, Sequence* child, A& alloc) {
    if (parent == nullptr || child == nullptr) throw InvalidArgument("fork(): a sequence pointer is null");
    auto it = std::find(running_.begin(), running_.end(), parent);
    if (it == running_.end()) {
      throw InvalidArgument(detail::cat("fork(): parent sequence ", parent->id,
                                        " is not running; fork a sequence after its prompt has been computed"));
    }
    if (running_.size() >= static_cast<std::size_t>(running_limit(alloc)) || alloc.num_free_blocks() < 1) {
      throw InvalidArgument(detail::cat("fork(): sequence ", parent->id, " cannot get a sibling: ", running_.size(),
                                        " of this engine's ", running_limit(alloc),
                                        " slots are in use; ask for fewer samples (n) or build with a larger "
                                        "max_batch"));
    }
    detail::join_as_sibling(running_, it, *child, alloc);
  }

 private:
  void push_chunk(StepPlan& plan, const ScheduledChunk& chunk) {
    if (is_decode(chunk)) {
      plan.chunks.push_back(chunk);
    } else {
      prefills_.push_back(chunk);
    }
  }

  std::vector<Sequence*> running_;  ///< at most running_limit(), admission order
  std::deque<Sequence*> waiting_;   ///< by arrival
  std::vector<ScheduledChunk> prefills_;  ///< per-step scratch
};

}  // namespace infer
