#pragma once
/// \file
/// `ContinuousBatchScheduler<Policy>`: vLLM-style continuous batching over any `BlockAllocator`. Every
/// step it (1) gives each running sequence its next tokens — a decode, or the next chunk of a chunked
/// prefill — growing its KV blocks and preempting a running sequence by recompute when the cache is full,
/// then (2) admits waiting sequences while the token budget, `max_num_seqs` and free blocks allow.
/// Capacity scheduling (who runs) and chunking (how many tokens) are decided together against one token
/// budget, so a step never computes more than `max_num_batched_tokens`.
///
/// This is the one continuous-batching machinery; a `Policy` changes its decisions without rewriting it.
/// A policy is either
///
/// - a **waiting order**: a strict weak order `bool(const Sequence& a, const Sequence& b)`, true when `a`
///   is admitted before `b` (`Fcfs`, the default). It is consulted when a sequence is added (the queue is
///   kept sorted: no sort per step), so the keys it reads must not change while a sequence waits.
/// - a **policy object** with any of these hooks (detected by name; a hook that is declared with another
///   signature is a compile error naming the expected one):
///
///   | hook | effect |
///   | ---- | ------ |
///   | `double score(const Sequence&, const StepContext&)` | re-evaluated every step: waiting sequences are admitted, and running ones planned, highest score first (ties: earlier arrival); the running sequence planned last is the default preemption victim |
///   | `std::int32_t prefill_budget(const StepContext&)` | caps this step's prefill tokens (new admissions and continuing prompt chunks; a running sequence's single next token is a decode and is never capped) |
///   | `Sequence* victim(std::span<Sequence* const> candidates, const StepContext&)` | which running sequence to preempt when blocks run short; `candidates` are those not yet planned in this step (the default takes the last) and the answer must be one of them |
///
/// ```cpp
/// // Shortest prompt first, aged by waiting time; at most 16 prefill tokens per step.
/// struct AgedShortestFirst {
///   double score(const infer::Sequence& s, const infer::StepContext& ctx) const {
///     return -s.prompt_len + 0.5 * static_cast<double>(ctx.step - s.added_step);
///   }
///   std::int32_t prefill_budget(const infer::StepContext&) const { return 16; }
/// };
/// infer::ContinuousBatchScheduler<AgedShortestFirst> scheduler(config);
/// ```
///
/// Whatever the policy, preempted sequences resume before new ones, oldest first: they were admitted
/// once, and starving them wastes the work they had done. Admission is strict: it stops at the first
/// sequence (in policy order) that does not fit, so a large request is never overtaken forever by a
/// stream of smaller ones that happen to fit. A stateful policy is passed to the constructor and reached
/// through `policy()`.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/core/type_name.hpp"
#include "infer/sched/scheduler_config.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

/// What a policy's hooks see of the step being planned. Counts are taken when planning begins.
struct StepContext {
  std::int64_t step = 0;         ///< this schedule() call's index: 0, 1, 2, ... (Sequence::added_step counts the same)
  std::int32_t free_blocks = 0;  ///< the allocator's free KV blocks
  std::int32_t total_blocks = 0;
  std::size_t num_running = 0;
  std::size_t num_waiting = 0;   ///< new and preempted
};

/// First come, first served: by `Sequence::arrival`. The default, and vLLM's.
struct Fcfs {
  bool operator()(const Sequence& a, const Sequence& b) const noexcept { return a.arrival < b.arrival; }
};

/// vLLM's priority scheduling: a lower `Sequence::priority` (SamplingParams::priority) is admitted first,
/// planned first and preempted last (among equals, the newest goes first). With every priority equal it
/// plans exactly as Fcfs. The stock paged engine uses it.
struct PriorityOrder {
  double score(const Sequence& s, const StepContext& /*ctx*/) const noexcept { return -static_cast<double>(s.priority); }
};

/// A `ContinuousBatchScheduler` policy that is a waiting order: `policy(a, b)` true when `a` goes before `b`.
template <class P>
concept WaitingOrder = std::copy_constructible<P> && std::predicate<const P&, const Sequence&, const Sequence&>;

/// The hooks a policy object may have (see the file comment); each concept is true when the hook can be
/// called as the scheduler calls it.
template <class P>
concept ScoresSequences = requires(P& p, const Sequence& s, const StepContext& ctx) {
  { p.score(s, ctx) } -> std::convertible_to<double>;
};
template <class P>
concept BudgetsPrefill = requires(P& p, const StepContext& ctx) {
  { p.prefill_budget(ctx) } -> std::integral;
};
template <class P>
concept ChoosesVictim = requires(P& p, std::span<Sequence* const> candidates, const StepContext& ctx) {
  { p.victim(candidates, ctx) } -> std::convertible_to<Sequence*>;
};

namespace detail {
// A member of this name exists (a non-template, non-overloaded one): if it is not callable as its hook,
// the policy has a typo in its signature, not a missing hook.
template <class P>
concept names_score = requires { &P::score; };
template <class P>
concept names_prefill_budget = requires { &P::prefill_budget; };
template <class P>
concept names_victim = requires { &P::victim; };
template <class P>
concept has_a_hook = ScoresSequences<P> || BudgetsPrefill<P> || ChoosesVictim<P> || names_score<P> ||
                     names_prefill_budget<P> || names_victim<P>;
}  // namespace detail

/// How many leading tokens an admission may skip: what the prefix cache supplied (`alloc.allocate`'s
/// answer), but never the last token, whose logits are needed to sample the next one. Public, as are
/// make_chunk, is_decode and apply_plan (step_plan.hpp), for a scheduler of your own.
inline std::int32_t usable_cached_tokens(std::optional<std::int32_t> cached, const Sequence& seq) noexcept {
  return std::clamp(cached.value_or(0), std::int32_t{0}, std::max(seq.len() - 1, std::int32_t{0}));
}

namespace detail {

/// Whether `seq`'s next chunk is a decode: its single next token, past its prompt. Every other token is a
/// prefill token (a prompt chunk, or the recompute of a preempted sequence) and counts against a policy's
/// prefill_budget.
inline bool decodes_next(const Sequence& seq) noexcept { return seq.num_uncomputed() == 1 && !seq.in_prefill(); }

/// Puts `seq` into `q` after every sequence that arrived no later, so `q` stays in arrival order. Linear
/// from the back: insertions are mostly the newest.
template <class Container>
void insert_by_arrival(Container& q, Sequence* seq) {
  auto it = q.end();
  while (it != q.begin() && (*(it - 1))->arrival > seq->arrival) --it;
  q.insert(it, seq);
}

/// A forked child starts where its parent is (same computed tokens, same blocks) and runs right after it.
template <class A>
void join_as_sibling(std::vector<Sequence*>& running, std::vector<Sequence*>::iterator parent, Sequence& child,
                     A& alloc) {
  child.num_computed = (*parent)->num_computed;
  child.num_cached_tokens = (*parent)->num_cached_tokens;
  child.added_step = (*parent)->added_step;
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
  static_assert(std::copy_constructible<Policy>, "ContinuousBatchScheduler<Policy>: Policy must be copyable");
  static_assert(WaitingOrder<Policy> || detail::has_a_hook<Policy>,
                "ContinuousBatchScheduler<Policy>: Policy must be a waiting order, a callable "
                "bool(const infer::Sequence& a, const infer::Sequence& b) true when a is admitted before b (see "
                "infer::Fcfs), or a policy object with at least one hook: "
                "double score(const infer::Sequence&, const infer::StepContext&), "
                "std::int32_t prefill_budget(const infer::StepContext&), "
                "infer::Sequence* victim(std::span<infer::Sequence* const> candidates, const infer::StepContext&)");
  static_assert(!detail::names_score<Policy> || ScoresSequences<Policy>,
                "ContinuousBatchScheduler<Policy>: Policy::score must be callable as "
                "double score(const infer::Sequence&, const infer::StepContext&) (higher is served first)");
  static_assert(!detail::names_prefill_budget<Policy> || BudgetsPrefill<Policy>,
                "ContinuousBatchScheduler<Policy>: Policy::prefill_budget must be callable as "
                "std::int32_t prefill_budget(const infer::StepContext&) (prefill tokens allowed in this step)");
  static_assert(!detail::names_victim<Policy> || ChoosesVictim<Policy>,
                "ContinuousBatchScheduler<Policy>: Policy::victim must be callable as "
                "infer::Sequence* victim(std::span<infer::Sequence* const> candidates, const infer::StepContext&) "
                "(one of the candidates)");
  static_assert(!(WaitingOrder<Policy> && ScoresSequences<Policy>),
                "ContinuousBatchScheduler<Policy>: Policy is both a waiting order and has a score hook; keep one");

  static constexpr bool kScores = ScoresSequences<Policy>;

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
  /// The policy object, e.g. to change a parameter between runs.
  [[nodiscard]] Policy& policy() noexcept { return policy_; }
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

  /// Queues a new sequence (status waiting, no blocks): in the waiting order's place, else by arrival
  /// (a score policy orders the queue when it plans); equal keys keep add order.
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
    seq->added_step = step_;
    if constexpr (WaitingOrder<Policy>) {
      auto before = [this](const Sequence* a, const Sequence* b) { return policy_(*a, *b); };
      waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, before), seq);
    } else if constexpr (kScores) {
      waiting_.push_back(seq);
    } else {
      detail::insert_by_arrival(waiting_, seq);
    }
  }

  /// Plans one step and reserves its KV blocks through `alloc`. May preempt (plan.preempted). Throws
  /// InvalidArgument only for a sequence check() would have rejected (it cannot run even alone), and
  /// PolicyError when a hook breaks its contract (a negative prefill budget, a NaN score, a victim that
  /// was not a candidate).
  template <BlockAllocator A>
  StepPlan schedule(A& alloc) {
    StepPlan plan;
    plan.chunks.reserve(running_.size() + 8);
    prefills_.clear();
    const StepContext ctx{step_++, alloc.num_free_blocks(), alloc.num_blocks(), running_.size(), num_waiting()};
    std::int32_t budget = config_.max_num_batched_tokens;
    std::int32_t prefill_budget = step_prefill_budget(ctx, budget);

    // (1) Running sequences in policy order (score policies) or arrival order: the last planned are the
    // first preempted, so a sequence visited earlier never loses a chunk it was given.
    visit_.assign(running_.begin(), running_.end());
    if constexpr (kScores) sort_by_score(visit_, ctx);
    for (std::size_t i = 0; i < visit_.size() && budget > 0;) {
      Sequence& seq = *visit_[i];
      std::int32_t count = std::min(seq.num_uncomputed(), budget);
      if (!detail::decodes_next(seq)) count = std::min(count, prefill_budget);
      if (count <= 0) {  // nothing new since its last step (the engine appended no token), or no prefill left
        ++i;
        continue;
      }
      if (!grow_or_preempt(seq, seq.num_computed + count, alloc, plan, i, ctx)) continue;  // seq was preempted
      plan_chunk(plan, seq, count, alloc, budget, prefill_budget);
      ++i;
    }

    // (2) Admissions — not in a step that preempted: the blocks just freed would go to a newcomer
    // (or straight back to the victim), and the victim would thrash between waiting and running.
    if (plan.preempted.empty() && admit_from(resumed_, alloc, plan, budget, prefill_budget) &&
        can_admit(budget, prefill_budget) && !waiting_.empty()) {
      if constexpr (kScores) sort_by_score(waiting_, ctx);
      admit_from(waiting_, alloc, plan, budget, prefill_budget);
    }

    plan.chunks.insert(plan.chunks.end(), prefills_.begin(), prefills_.end());
    plan.copies = alloc.take_copies();
    return plan;
  }

  /// After the engine ran `plan` and appended the sampled tokens: each chunk's tokens are computed (their
  /// full blocks became prefix-cache entries when the chunk was planned).
  template <BlockAllocator A>
  void update(const StepPlan& plan, A& /*alloc: blocks were committed when planned*/) {
    apply_plan(plan);
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
  /// The policy's prefill budget for this step (the whole token budget without the hook).
  std::int32_t step_prefill_budget(const StepContext& ctx, std::int32_t budget) {
    if constexpr (BudgetsPrefill<Policy>) {
      const auto asked = policy_.prefill_budget(ctx);
      if (std::cmp_less(asked, 0)) {
        throw PolicyError(detail::cat(type_name<Policy>(), "::prefill_budget() returned ", asked, " at step ",
                                      ctx.step, "; return the prefill tokens this step may compute (0 or more)"));
      }
      return std::cmp_less(asked, budget) ? static_cast<std::int32_t>(asked) : budget;
    } else {
      (void)ctx;
      return budget;
    }
  }

  /// Orders `seqs` by the policy's score, highest first; equal scores by arrival, then by their current
  /// order (siblings share an arrival), so a plan never depends on the sort's tie-breaking.
  template <class Container>
  void sort_by_score(Container& seqs, const StepContext& ctx) {
    keyed_.clear();
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      Sequence* s = seqs[i];
      const double score = static_cast<double>(policy_.score(std::as_const(*s), ctx));
      if (std::isnan(score)) {
        throw PolicyError(detail::cat(type_name<Policy>(), "::score() returned NaN for sequence ", s->id, " at step ",
                                      ctx.step, "; scores must be ordered numbers (higher is served first)"));
      }
      keyed_.push_back({score, s->arrival, i, s});
    }
    std::sort(keyed_.begin(), keyed_.end(), [](const Keyed& a, const Keyed& b) {
      if (a.score != b.score) return a.score > b.score;
      return a.arrival != b.arrival ? a.arrival < b.arrival : a.index < b.index;
    });
    for (std::size_t i = 0; i < keyed_.size(); ++i) seqs[i] = keyed_[i].seq;
  }

  /// Grows `seq` to `tokens`, preempting from the running sequences not yet planned in this step
  /// (visit_[i..], seq first among them) while blocks are short. False when `seq` itself was preempted.
  template <class A>
  bool grow_or_preempt(Sequence& seq, std::int32_t tokens, A& alloc, StepPlan& plan, std::size_t i,
                       const StepContext& ctx) {
    while (!alloc.grow(seq, tokens)) {
      if (running_.size() == 1) throw unschedulable(seq, tokens, alloc);
      Sequence* victim = choose_victim(std::span<Sequence* const>(visit_).subspan(i), ctx);
      preempt(victim, alloc, plan);
      if (victim == &seq) return false;
    }
    return true;
  }

  /// The policy's victim among `candidates` (never empty: the sequence being planned is one), else the
  /// last: the newest, or the lowest score.
  Sequence* choose_victim(std::span<Sequence* const> candidates, const StepContext& ctx) {
    if constexpr (ChoosesVictim<Policy>) {
      Sequence* v = policy_.victim(candidates, ctx);
      if (std::find(candidates.begin(), candidates.end(), v) == candidates.end()) {
        throw PolicyError(detail::cat(type_name<Policy>(), "::victim() returned ",
                                      v ? detail::cat("sequence ", v->id) : std::string("nullptr"),
                                      ", which is not one of its ", candidates.size(),
                                      " candidates (the running sequences not yet planned in step ", ctx.step,
                                      "); return one of them"));
      }
      return v;
    } else {
      (void)ctx;
      return candidates.back();
    }
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

  /// Preemption by recompute: the victim drops its blocks and goes back to waiting, ahead of every new
  /// sequence. It has no chunk in this step's plan: it is not yet planned (a candidate).
  template <class A>
  void preempt(Sequence* victim, A& alloc, StepPlan& plan) {
    detail::erase_one(running_, victim);
    detail::erase_one(visit_, victim);
    alloc.free(*victim);
    victim->status = SeqStatus::waiting;
    victim->num_computed = 0;  // num_cached_tokens keeps describing its last admission until the next
    ++victim->num_preemptions;
    detail::insert_by_arrival(resumed_, victim);
    plan.preempted.push_back(victim);
  }

  [[nodiscard]] bool can_admit(std::int32_t budget, std::int32_t prefill_budget) const noexcept {
    return budget > 0 && prefill_budget > 0 && running_.size() < static_cast<std::size_t>(config_.max_num_seqs);
  }

  /// Admits from the front of `q` until something does not fit. True when `q` was emptied (so the
  /// next queue may be tried; strict order spans both queues).
  template <class A>
  bool admit_from(std::deque<Sequence*>& q, A& alloc, StepPlan& plan, std::int32_t& budget,
                  std::int32_t& prefill_budget) {
    while (!q.empty()) {
      if (!can_admit(budget, prefill_budget)) return false;
      Sequence& seq = *q.front();
      const std::optional<std::int32_t> cached = alloc.allocate(seq);
      // With nothing running and every block free, waiting cannot help: fail loudly, not livelock.
      const bool alone = running_.empty() && budget == config_.max_num_batched_tokens;
      if (!cached) {  // not enough free blocks: nothing changed
        if (alone && alloc.num_free_blocks() == alloc.num_blocks()) throw unschedulable(seq, seq.len(), alloc);
        return false;
      }
      const std::int32_t computed = usable_cached_tokens(cached, seq);
      const std::int32_t needed = seq.len() - computed;
      if (!config_.enable_chunked_prefill && needed > std::min(budget, prefill_budget)) {
        alloc.free(seq);  // must fit whole; its cached prefix stays cached for the next try
        if (alone && needed > budget) throw unschedulable(seq, seq.len(), alloc);
        return false;
      }
      seq.num_computed = computed;
      seq.num_cached_tokens = computed;
      seq.status = SeqStatus::running;
      q.pop_front();
      detail::insert_by_arrival(running_, &seq);
      plan.admitted.push_back(&seq);
      // Later admissions of this step may share the blocks plan_chunk commits.
      plan_chunk(plan, seq, std::min({needed, budget, prefill_budget}), alloc, budget, prefill_budget);
    }
    return true;
  }

  /// Puts `count` tokens of `seq` into the plan (decodes first in the batch, prefill chunks after) and
  /// commits their blocks: sequences admitted later in this step may share them.
  template <class A>
  void plan_chunk(StepPlan& plan, Sequence& seq, std::int32_t count, A& alloc, std::int32_t& budget,
                  std::int32_t& prefill_budget) {
    if (!detail::decodes_next(seq)) prefill_budget -= count;
    const ScheduledChunk chunk = make_chunk(seq, count);
    if (is_decode(chunk)) {
      plan.chunks.push_back(chunk);
    } else {
      prefills_.push_back(chunk);
    }
    alloc.commit(seq, seq.num_computed + count);
    budget -= count;
  }

  struct Keyed {
    double score;
    std::uint64_t arrival;
    std::size_t index;
    Sequence* seq;
  };

  SchedulerConfig config_;
  Policy policy_;
  std::int64_t step_ = 0;             ///< schedule() calls so far: the next StepContext::step
  std::vector<Sequence*> running_;    ///< admitted, in arrival order
  std::deque<Sequence*> resumed_;     ///< preempted, oldest first: admitted before waiting_
  std::deque<Sequence*> waiting_;     ///< new: in policy order (waiting orders), arrival or last step's score order
  // Per-step scratch, kept to reuse its capacity.
  std::vector<Sequence*> visit_;          ///< running_ in planning order; visit_[i..] are not yet planned
  std::vector<ScheduledChunk> prefills_;  ///< prefill chunks, appended after the decodes
  std::vector<Keyed> keyed_;              ///< scores of one sort
};

/// The stock priority scheduler: the paged engine's (presets.hpp).
using PriorityScheduler = ContinuousBatchScheduler<PriorityOrder>;

}  // namespace infer
