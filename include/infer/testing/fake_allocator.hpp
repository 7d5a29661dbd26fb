#pragma once
/// \file
/// Test a scheduler without a model. `FakePagedAllocator` and `FakeSlotAllocator<Shape>` are allocators
/// that only count blocks (no prefix hashing), so a scheduler test fails for the scheduler's reasons and
/// not the allocator's: the paged one has ref counts and copy-on-write on grow (enough to see forks in a
/// plan), the slot one is a contiguous, fixed-shape one for a static scheduler. `SimEngine` is the
/// engine's side of the loop (fake tokens, update, finish) with the engine's invariant checks, and
/// `rows(plan)` prints a plan compactly:
///
/// ```cpp
/// infer::testing::FakePagedAllocator alloc(/*blocks*/ 10, /*block_size*/ 4);
/// MyScheduler sched(config);
/// infer::testing::SimEngine sim{sched, alloc};
/// sim.add(/*prompt*/ 8, /*max_new*/ 4);
/// CHECK(infer::testing::rows(sim.step()) == "1:0+8*");   // sequence 1 computes tokens 0..7 and samples
/// ```

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/sched/invariants.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer::testing {

class FakePagedAllocator {
 public:
  static constexpr KvLayout layout = KvLayout::paged;

  FakePagedAllocator(std::int32_t num_blocks, std::int32_t block_size)
      : block_size_(block_size), ref_(static_cast<std::size_t>(num_blocks), 0) {
    for (std::int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // pop_back gives the lowest id
  }

  std::int32_t block_size() const { return block_size_; }
  std::int32_t num_blocks() const { return static_cast<std::int32_t>(ref_.size()); }
  std::int32_t num_free_blocks() const { return static_cast<std::int32_t>(free_.size()); }
  KvStats stats() const {
    KvStats s;
    s.block_size = block_size_;
    s.total_blocks = num_blocks();
    s.free_blocks = num_free_blocks();
    s.used_blocks = num_blocks() - num_free_blocks();
    s.live_sequences = static_cast<std::int32_t>(tables_.size());
    return s;
  }

  /// Tokens the next allocate() of sequence `id` reports as found in the prefix cache.
  std::map<SeqId, std::int32_t> cached_on_allocate;
  std::int32_t allocate_calls = 0;
  std::int32_t commit_calls = 0;
  std::int32_t frees_of_unknown = 0;  ///< free() of a sequence holding nothing (a double free)

  std::optional<std::int32_t> allocate(Sequence& seq) {
    ++allocate_calls;
    const auto need = blocks_for(seq.len());
    if (need > num_free_blocks()) return std::nullopt;
    auto& table = tables_[seq.id];
    for (std::int32_t i = 0; i < need; ++i) table.push_back(take());
    auto it = cached_on_allocate.find(seq.id);
    return it == cached_on_allocate.end() ? 0 : it->second;
  }
  bool can_ever_fit(std::int32_t n) const { return blocks_for(n) <= num_blocks(); }

  bool grow(Sequence& seq, std::int32_t n) {
    auto& table = tables_[seq.id];
    const auto have = static_cast<std::int32_t>(table.size());
    const auto need = std::max(blocks_for(n) - have, 0);
    // The first block written to (holding position num_computed) is copied first when it is shared.
    const std::int32_t first = seq.num_computed / block_size_;
    const bool cow = seq.num_computed < n && first < have && ref_[idx(table[static_cast<std::size_t>(first)])] > 1;
    if (need + (cow ? 1 : 0) > num_free_blocks()) return false;
    if (cow) {
      auto& b = table[static_cast<std::size_t>(first)];
      const auto dst = take();
      copies_.push_back({b, dst});
      --ref_[idx(b)];
      b = dst;
    }
    for (std::int32_t i = 0; i < need; ++i) table.push_back(take());
    return true;
  }
  std::vector<BlockCopy> take_copies() { return std::exchange(copies_, {}); }

  void fork(const Sequence& parent, Sequence& child) {
    auto table = tables_[parent.id];
    for (auto b : table) ++ref_[idx(b)];
    tables_[child.id] = std::move(table);
  }
  void commit(Sequence& seq, std::int32_t num_tokens) {
    ++commit_calls;
    committed[seq.id] = num_tokens;
  }
  std::map<SeqId, std::int32_t> committed;  ///< tokens committed at each sequence's last commit

  void free(Sequence& seq) {
    auto it = tables_.find(seq.id);
    if (it == tables_.end() || it->second.empty()) {
      ++frees_of_unknown;
      if (it != tables_.end()) tables_.erase(it);
      return;
    }
    for (auto b : it->second) {
      if (--ref_[idx(b)] == 0) free_.push_back(b);
    }
    tables_.erase(it);
  }
  std::span<const std::int32_t> block_table(const Sequence& seq) const {
    auto it = tables_.find(seq.id);
    if (it == tables_.end()) return {};
    return it->second;
  }

 private:
  static std::size_t idx(std::int32_t b) { return static_cast<std::size_t>(b); }
  std::int32_t blocks_for(std::int32_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  std::int32_t take() {
    const auto b = free_.back();
    free_.pop_back();
    ref_[idx(b)] = 1;
    return b;
  }

  std::int32_t block_size_;
  std::vector<std::int32_t> ref_;
  std::vector<std::int32_t> free_;
  std::map<SeqId, std::vector<std::int32_t>> tables_;
  std::vector<BlockCopy> copies_;
};

struct FakeShape {
  std::int32_t max_batch = 0;
  std::int32_t max_input = 0;
  std::int32_t max_output = 0;
};

/// One slot of max_input + max_output tokens per sequence, reserved at admission.
template <FakeShape S>
class FakeSlotAllocator {
 public:
  static constexpr KvLayout layout = KvLayout::contiguous;
  FakeShape shape() const { return S; }

  FakeSlotAllocator() : used_(static_cast<std::size_t>(S.max_batch), false) {}

  std::int32_t block_size() const { return S.max_input + S.max_output; }
  std::int32_t num_blocks() const { return S.max_batch; }
  std::int32_t num_free_blocks() const {
    std::int32_t n = 0;
    for (bool u : used_) n += u ? 0 : 1;
    return n;
  }
  KvStats stats() const {
    KvStats s;
    s.block_size = block_size();
    s.total_blocks = num_blocks();
    s.free_blocks = num_free_blocks();
    s.used_blocks = num_blocks() - s.free_blocks;
    return s;
  }
  std::optional<std::int32_t> allocate(Sequence& seq) {
    if (seq.len() > block_size()) return std::nullopt;
    for (std::size_t i = 0; i < used_.size(); ++i) {
      if (!used_[i]) {
        used_[i] = true;
        slot_[seq.id] = static_cast<std::int32_t>(i);
        return 0;
      }
    }
    return std::nullopt;
  }
  bool can_ever_fit(std::int32_t n) const { return n <= block_size(); }
  bool grow(Sequence& seq, std::int32_t n) { return slot_.count(seq.id) == 1 && n <= block_size(); }
  std::vector<BlockCopy> take_copies() { return std::exchange(copies_, {}); }
  void fork(const Sequence& parent, Sequence& child) {
    Sequence probe;
    probe.id = child.id;
    probe.tokens.resize(1);
    if (!allocate(probe)) return;
    copies_.push_back({slot_.at(parent.id), slot_.at(child.id)});
  }
  void commit(Sequence&, std::int32_t) {}
  void free(Sequence& seq) {
    auto it = slot_.find(seq.id);
    if (it == slot_.end()) {
      ++frees_of_unknown;
      return;
    }
    used_[static_cast<std::size_t>(it->second)] = false;
    slot_.erase(it);
  }
  std::span<const std::int32_t> block_table(const Sequence& seq) const {
    auto it = slot_.find(seq.id);
    if (it == slot_.end()) return {};
    return std::span<const std::int32_t>(&it->second, 1);
  }
  std::int32_t frees_of_unknown = 0;

 private:
  std::vector<bool> used_;
  std::map<SeqId, std::int32_t> slot_;
  std::vector<BlockCopy> copies_;
};

static_assert(BlockAllocator<FakePagedAllocator>);
static_assert(BlockAllocator<FakeSlotAllocator<FakeShape{2, 8, 4}>>);

/// The engine's side of the loop, without a model: owns the sequences (stable addresses), appends a
/// fake token to every sampled chunk's sequence, calls update(), then finishes those at max_len. As the
/// engine, it throws PolicyError when a finished sequence keeps blocks (require_released) or a plan is
/// empty while the scheduler holds sequences (require_progress).
template <class Sched, class Alloc>
struct SimEngine {
  SimEngine(Sched& s, Alloc& a) : sched(s), alloc(a) {}
  Sched& sched;
  Alloc& alloc;
  std::deque<Sequence> seqs;
  std::uint64_t next_arrival = 0;
  std::vector<SeqId> finished;  ///< in finishing order

  Sequence& make(std::int32_t prompt_len, std::int32_t max_new) {
    Sequence& s = seqs.emplace_back();
    s.id = static_cast<SeqId>(seqs.size());
    for (std::int32_t i = 0; i < prompt_len; ++i) s.tokens.push_back(static_cast<std::int32_t>(s.id * 1000 + i));
    s.prompt_len = prompt_len;
    s.max_len = prompt_len + max_new;
    s.arrival = next_arrival++;
    return s;
  }
  /// A new request, checked then queued.
  Sequence& add(std::int32_t prompt_len, std::int32_t max_new) {
    Sequence& s = make(prompt_len, max_new);
    sched.check(s, alloc);
    sched.add(&s);
    return s;
  }
  StepPlan step() {
    StepPlan plan = sched.schedule(alloc);
    require_progress<Sched>(plan, sched.num_waiting(), sched.num_running(), alloc);
    for (const auto& c : plan.chunks) {
      if (c.samples) c.seq->tokens.push_back(-1);
    }
    sched.update(plan, alloc);
    for (const auto& c : plan.chunks) {
      if (c.samples && c.seq->len() >= c.seq->max_len) {
        sched.finish(c.seq, alloc);
        require_released<Sched>(*c.seq, alloc);
        finished.push_back(c.seq->id);
      }
    }
    return plan;
  }
  /// Steps until nothing is left; returns the number of steps (bounded, so a scheduler that keeps
  /// planning without finishing anything fails the test instead of hanging it).
  int run_to_completion(int max_steps = 10000) {
    int steps = 0;
    while ((sched.num_running() > 0 || sched.num_waiting() > 0) && steps < max_steps) {
      step();
      ++steps;
    }
    return steps;
  }
};

/// A plan as text, one "id:start+count" per chunk in batch order, '*' when it samples.
inline std::string rows(const StepPlan& plan) {
  std::string out;
  for (const auto& c : plan.chunks) {
    if (!out.empty()) out += ' ';
    out += detail::cat(c.seq->id, ':', c.start, '+', c.count, c.samples ? "*" : "");
  }
  return out;
}

}  // namespace infer::testing
