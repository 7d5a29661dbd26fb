#pragma once
/// \file
/// `ContinuousBatchScheduler`: vLLM-style continuous batching over any `BlockAllocator`. Every step
/// it (1) gives each running sequence its next tokens — a decode, or the next chunk of a chunked
/// prefill — growing its KV blocks and preempting the newest running sequence by recompute when the
/// cache is full, then (2) admits waiting sequences while the token budget, `max_num_seqs` and free
/// blocks allow. Capacity scheduling (who runs) and chunking (how many tokens) are decided together
/// against one token budget, so a step never computes more than `max_num_batched_tokens`.
///
/// The order in which waiting sequences are admitted is the one extension point: a `Policy`.
///
/// ```cpp
/// // Admit short prompts first (ties: first come, first served).
/// struct ShortestPromptFirst {
///   bool operator()(const infer::Sequence& a, const infer::Sequence& b) const {
///     return a.prompt_len != b.prompt_len ? a.prompt_len < b.prompt_len : a.arrival < b.arrival;
///   }
/// };
/// infer::ContinuousBatchScheduler<ShortestPromptFirst> scheduler(config);
/// ```
///
/// A policy is a strict weak order over sequences: `policy(a, b)` is true when `a` is admitted before
/// `b`. It is consulted when a sequence is added (the waiting queue is kept sorted, so scheduling costs
/// no sort per step); the keys it reads must therefore not change while a sequence waits — true of
/// everything in `Sequence`, since waiting sequences are not advanced. A stateful policy is passed to
/// the constructor. Preempted sequences are not re-ordered by the policy: they resume first, oldest
/// first, because they were already admitted once and starving them wastes the work they had done.
///
/// Admission is strict: it stops at the first sequence (in policy order) that does not fit, so a large
/// request is never overtaken forever by a stream of smaller ones that happen to fit.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/sched/scheduler_config.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

/// First come, first served: by `Sequence::arrival`. The default, and vLLM's.
struct Fcfs {
  bool operator()(const Sequence& a, const Sequence& b) const noexcept { return a.arrival < b.arrival; }
};

/// What a `ContinuousBatchScheduler` policy must be: `policy(a, b)` true when `a` goes before `b`.
template <class P>
concept WaitingOrder = std::copy_constructible<P> && std::predicate<const P&, const Sequence&, const Sequence&>;

namespace detail {

/// A chunk of `count` tokens from `seq`'s computed prefix on: the one place `samples` is decided.
inline ScheduledChunk make_chunk(Sequence& seq, std::int32_t count) {
  return ScheduledChunk{&seq, seq.num_computed, count, seq.num_computed + count == seq.len()};
}

/// A decode computes the single newest token of a sequence past its prompt; it goes first in the batch
/// (kernels take the decode rows as one group, prefill chunks after them).
inline bool is_decode(const ScheduledChunk& c) noexcept { return c.count == 1 && c.start >= c.seq->prompt_len; }

/// How many leading tokens an admission may skip: what the prefix cache supplied, but never the last
/// token, whose logits are needed to sample the next one.
inline std::int32_t usable_cached(std::optional<std::int32_t> cached, const Sequence& seq) noexcept {
  return std::clamp(cached.value_or(0), std::int32_t{0}, std::max(seq.len() - 1, std::int32_t{0}));
}

/// Puts `seq` into `running` after every sequence that arrived no later, so running order is arrival
/// order (preemption takes the back: the newest). Linear from the back: admissions are mostly newest.
inline void insert_by_arrival(std::vector<Sequence*>& running, Sequence* seq) {
  auto it = running.end();
  while (it != running.begin() && (*(it - 1))->arrival > seq->arrival) --it;
  running.insert(it, seq);
}

/// Applies a step's chunks: shared by every scheduler, so "computed" means the same everywhere. (The
/// chunks' blocks were committed to the prefix cache when they were planned: plan_chunk.)
/// Chunks of sequences finished since the plan was made are skipped (their blocks are gone).
inline void apply_plan(const StepPlan& plan) {
  for (const auto& chunk : plan.chunks) {
    Sequence& seq = *chunk.seq;
    if (seq.status != SeqStatus::running) continue;
    if (chunk.start != seq.num_computed || chunk.start + chunk.count > seq.len()) {
      throw InvalidArgument(cat("update(): the plan computes tokens [", chunk.start, ", ", chunk.start + chunk.count,
                                ") of sequence ", seq.id, ", which has ", seq.num_computed, " computed of ", seq.len(),
                                " tokens; call update() exactly once with the plan the last schedule() returned"));
    }
    seq.num_computed += chunk.count;
  }
}

/// A forked child starts where its parent is (same computed tokens, same blocks) and runs right after it.
template <class A>
void join_as_sibling(std::vector<Sequence*>& running, std::vector<Sequence*>::iterator parent, Sequence& child,
                     A& alloc) {
  child.num_computed = (*parent)->num_computed;
  child.num_cached_tokens = (*parent)->num_cached_tokens;
  alloc.fork(**parent, child);
  child.status = SeqStatus::running;
  running.insert(parent + 1, &child);
}

/// Removes `seq` from `q` if present; true when it was there.
template <class Container>
bool erase_one(Container& q, const Sequence* seq) {
  auto it = std::find(q.begin(), q.end(), seq);
  if (it == q.end()) return false;
  q.erase(it);
  return true;
}

}  // namespace detail

template <class Policy = Fcfs>
class ContinuousBatchScheduler {
  static_assert(WaitingOrder<Policy>,
                "ContinuousBatchScheduler<Policy>: Policy must be a copyable callable "
                "bool(const infer::Sequence& a, const infer::Sequence& b), true when a is admitted before b "
                "(see infer::Fcfs)");

 public:
  using policy_type = Policy;

  /// Throws InvalidArgument (from SchedulerConfig::validate) on an out-of-range limit.
  explicit ContinuousBatchScheduler(SchedulerConfig config = {}, Policy policy = Policy{})
      : config_(config), policy_(std::move(policy)) {
    config_.validate();
  }

  [[nodiscard]] const SchedulerConfig& config() const noexcept { return config_; }
  /// The token budget and the sequence limit of the configuration: no step plans more.
  [[nodiscard]] StepBounds bounds() const noexcept {
    return {config_.max_num_batched_tokens, config_.max_num_seqs};
  }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  [[nodiscard]] std::size_t num_waiting() const noexcept { return resumed_.size() + waiting_.size(); }
  [[nodiscard]] std::size_t num_running() const noexcept { return running_.size(); }

  /// Throws InvalidArgument when `seq` could never be scheduled with this configuration and cache. The
  /// engine calls it before add(): a sequence that passes can always run once it is alone, so
  /// schedule() never meets one it cannot place.
  template <BlockAllocator A>
  void check(const Sequence& seq, const A& alloc) const {
    if (seq.len() < 1 || seq.prompt_len < 1 || seq.prompt_len > seq.len()) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " has ", seq.len(), " tokens and prompt_len ",
                                        seq.prompt_len, "; a sequence needs a non-empty prompt"));
    }
    if (seq.max_len < seq.len()) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " has ", seq.len(), " tokens but max_len ", seq.max_len,
                                        "; set max_len to prompt_len + max_tokens (at least the tokens it has)"));
    }
    if (!alloc.can_ever_fit(seq.max_len)) {
      throw InvalidArgument(detail::cat(
          "sequence ", seq.id, " may grow to ", seq.max_len, " tokens (prompt ", seq.prompt_len, " + up to ",
          seq.max_len - seq.prompt_len, " generated) but the KV cache holds at most ",
          static_cast<std::int64_t>(alloc.num_blocks()) * alloc.block_size(), " tokens (", alloc.num_blocks(),
          " blocks of ", alloc.block_size(), "); shorten the prompt, lower max_tokens or give the cache more blocks"));
    }
    // Without chunking a preempted sequence is recomputed in one step, generated tokens included.
    if (!config_.enable_chunked_prefill && seq.max_len > config_.max_num_batched_tokens) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " may grow to ", seq.max_len,
                                        " tokens but max_num_batched_tokens is ", config_.max_num_batched_tokens,
                                        " and chunked prefill is off; enable chunked prefill or raise "
                                        "max_num_batched_tokens to at least ",
                                        seq.max_len));
    }
  }

  /// Queues a new sequence (status waiting, no blocks) in policy order; equal keys keep add order.
  void add(Sequence* seq) {
    if (seq == nullptr) throw InvalidArgument("add(): the sequence pointer is null");
    if (seq->status != SeqStatus::waiting) {
      throw InvalidArgument(detail::cat("add(): sequence ", seq->id, " is ",
                                        seq->status == SeqStatus::running ? "running" : "finished",
                                        "; only a new (waiting) sequence can be added"));
    }
    if (std::find(waiting_.begin(), waiting_.end(), seq) != waiting_.end() ||
        std::find(resumed_.begin(), resumed_.end(), seq) != resumed_.end()) {
      throw InvalidArgument(detail::cat("add(): sequence ", seq->id, " is already queued; add each sequence once"));
    }
    seq->num_computed = 0;
    auto before = [this](const Sequence* a, const Sequence* b) { return policy_(*a, *b); };
    waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, before), seq);
  }

  /// Plans one step and reserves its KV blocks through `alloc`. May preempt (plan.preempted). Throws
  /// InvalidArgument only for a sequence check() would have rejected (it cannot run even alone).
  template <BlockAllocator A>
  StepPlan schedule(A& alloc) {
    StepPlan plan;
    plan.chunks.reserve(running_.size() + 8);
    prefills_.clear();
    std::int32_t budget = config_.max_num_batched_tokens;

    // (1) Running sequences, oldest first: the oldest are the last to be preempted.
    for (std::size_t i = 0; i < running_.size() && budget > 0;) {
      Sequence& seq = *running_[i];
      const std::int32_t count = std::min(seq.num_uncomputed(), budget);
      if (count <= 0) {  // nothing new since its last step (the engine appended no token): skip
        ++i;
        continue;
      }
      if (!grow_or_preempt(seq, seq.num_computed + count, alloc, plan)) break;  // seq itself was preempted
      push_chunk(plan, detail::make_chunk(seq, count));
      alloc.commit(seq, seq.num_computed + count);
      budget -= count;
      ++i;
    }

    // (2) Admissions — not in a step that preempted: the blocks just freed would go to a newcomer
    // (or straight back to the victim), and the victim would thrash between waiting and running.
    if (plan.preempted.empty() && admit_from(resumed_, alloc, plan, budget)) admit_from(waiting_, alloc, plan, budget);

    plan.chunks.insert(plan.chunks.end(), prefills_.begin(), prefills_.end());
    plan.copies = alloc.take_copies();
    return plan;
  }

  /// After the engine ran `plan` and appended the sampled tokens: each chunk's tokens are computed and
  /// their full blocks become prefix-cache entries.
  template <BlockAllocator A>
  void update(const StepPlan& plan, A& /*alloc: blocks were committed when planned*/) {
    detail::apply_plan(plan);
  }

  /// Retires a finished or aborted sequence wherever it is, returning its blocks. Idempotent.
  template <BlockAllocator A>
  void finish(Sequence* seq, A& alloc) {
    if (seq == nullptr) throw InvalidArgument("finish(): the sequence pointer is null");
    if (detail::erase_one(running_, seq)) {
      alloc.free(*seq);
    } else if (!detail::erase_one(resumed_, seq)) {
      detail::erase_one(waiting_, seq);
    }
    seq->status = SeqStatus::finished;
  }

  /// `child` (a sibling sample, made by the engine from the parent's tokens) shares the parent's blocks
  /// and runs right after it. Forks may exceed max_num_seqs: the request asked for its n samples.
  template <BlockAllocator A>
  void fork(Sequence* parent, Sequence* child, A& alloc) {
    if (parent == nullptr || child == nullptr) throw InvalidArgument("fork(): a sequence pointer is null");
    auto it = std::find(running_.begin(), running_.end(), parent);
    if (it == running_.end()) {
      throw InvalidArgument(detail::cat("fork(): parent sequence ", parent->id,
                                        " is not running; fork a sequence after its prompt has been computed"));
    }
    detail::join_as_sibling(running_, it, *child, alloc);
  }

 private:
  /// Grows `seq` to `tokens`, preempting from the newest running sequence while blocks are short.
  /// False when `seq` itself had to be preempted.
  template <class A>
  bool grow_or_preempt(Sequence& seq, std::int32_t tokens, A& alloc, StepPlan& plan) {
    while (!alloc.grow(seq, tokens)) {
      if (running_.size() == 1) throw unschedulable(seq, tokens, alloc);
      Sequence* victim = running_.back();
      preempt(victim, alloc, plan);
      if (victim == &seq) return false;
    }
    return true;
  }

  /// The error for a sequence that cannot run even alone: only one check() would have rejected.
  template <class A>
  InvalidArgument unschedulable(const Sequence& seq, std::int32_t tokens, const A& alloc) const {
    return InvalidArgument(detail::cat(
        "sequence ", seq.id, " needs ", tokens, " tokens in one step and cannot get them even running alone (",
        alloc.num_free_blocks(), " of ", alloc.num_blocks(), " KV blocks of ", alloc.block_size(),
        " free, max_num_batched_tokens ", config_.max_num_batched_tokens,
        "); call check() before add() to reject it, and finish it with FinishReason::error"));
  }

  /// Preemption by recompute: the victim drops its blocks and goes back to waiting, ahead of everyone.
  template <class A>
  void preempt(Sequence* victim, A& alloc, StepPlan& plan) {
    running_.pop_back();  // always the back: callers pass running_.back()
    alloc.free(*victim);
    victim->status = SeqStatus::waiting;
    victim->num_computed = 0;  // num_cached_tokens keeps describing its last admission until the next
    ++victim->num_preemptions;
    resumed_.push_front(victim);
    plan.preempted.push_back(victim);
    // A chunk already planned for the victim in this step cannot exist: running order is oldest first
    // and the victim is the newest not yet visited (or the sequence being visited).
  }

  /// Admits from the front of `q` until something does not fit. True when `q` was emptied (so the
  /// next queue may be tried; strict order spans both queues).
  template <class A>
  bool admit_from(std::deque<Sequence*>& q, A& alloc, StepPlan& plan, std::int32_t& budget) {
    while (!q.empty()) {
      if (budget <= 0 || running_.size() >= static_cast<std::size_t>(config_.max_num_seqs)) return false;
      Sequence& seq = *q.front();
      const std::optional<std::int32_t> cached = alloc.allocate(seq);
      // With nothing running and every block free, waiting cannot help: fail loudly, not livelock.
      const bool alone = running_.empty() && budget == config_.max_num_batched_tokens;
      if (!cached) {  // not enough free blocks: nothing changed
        if (alone && alloc.num_free_blocks() == alloc.num_blocks()) throw unschedulable(seq, seq.len(), alloc);
        return false;
      }
      const std::int32_t computed = detail::usable_cached(cached, seq);
      const std::int32_t needed = seq.len() - computed;
      if (!config_.enable_chunked_prefill && needed > budget) {
        alloc.free(seq);  // must fit whole; its cached prefix stays cached for the next try
        if (alone) throw unschedulable(seq, seq.len(), alloc);
        return false;
      }
      seq.num_computed = computed;
      seq.num_cached_tokens = computed;
      seq.status = SeqStatus::running;
      q.pop_front();
      detail::insert_by_arrival(running_, &seq);
      const std::int32_t count = std::min(needed, budget);
      push_chunk(plan, detail::make_chunk(seq, count));
      alloc.commit(seq, seq.num_computed + count);  // later admissions of this step may share these blocks
      budget -= count;
    }
    return true;
  }

  void push_chunk(StepPlan& plan, const ScheduledChunk& chunk) {
    if (detail::is_decode(chunk)) {
      plan.chunks.push_back(chunk);
    } else {
      prefills_.push_back(chunk);
    }
  }

  SchedulerConfig config_;
  Policy policy_;
  std::vector<Sequence*> running_;    ///< admitted, in arrival order (back = newest = next victim)
  std::deque<Sequence*> resumed_;     ///< preempted, oldest first: admitted before waiting_
  std::deque<Sequence*> waiting_;     ///< new, in policy order
  std::vector<ScheduledChunk> prefills_;  ///< per-step scratch (kept to reuse its capacity)
};

}  // namespace infer
