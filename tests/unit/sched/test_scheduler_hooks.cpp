// ContinuousBatchScheduler with policy objects: a score re-evaluated every step, a prefill budget, a victim
// choice; and the stock PriorityOrder.
#include <catch2/catch.hpp>

#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sched/continuous_batch.hpp"
#include "infer/testing/fake_allocator.hpp"
#include "support/test_seed.hpp"

using namespace infer;
using infer::testing::FakePagedAllocator;
using infer::testing::rows;
using Catch::Contains;

namespace {

SchedulerConfig config(std::int32_t seqs, std::int32_t tokens) {
  SchedulerConfig c;
  c.max_num_seqs = seqs;
  c.max_num_batched_tokens = tokens;
  return c;
}

std::string ids(const std::vector<Sequence*>& seqs) {
  std::string out;
  for (const auto* s : seqs) out += detail::cat(out.empty() ? "" : " ", s->id);
  return out;
}

/// The researcher's policy: shortest prompt first, aged by the steps waited (`rate` score per step).
struct AgedShortestFirst {
  double rate = 4;
  double score(const Sequence& s, const StepContext& ctx) const {
    return -s.prompt_len + rate * static_cast<double>(ctx.step - s.added_step);
  }
};

struct ShortestPromptFirst {
  bool operator()(const Sequence& a, const Sequence& b) const {
    return a.prompt_len != b.prompt_len ? a.prompt_len < b.prompt_len : a.arrival < b.arrival;
  }
};

struct PrefillBudget {
  std::int32_t tokens = 16;
  std::int32_t prefill_budget(const StepContext&) const { return tokens; }
};

/// Preempts the oldest candidate other than the sequence that needs the block (candidates[0]), and
/// records what it was offered.
struct OldestOtherVictim {
  std::vector<std::string>* offered = nullptr;
  Sequence* victim(std::span<Sequence* const> candidates, const StepContext&) const {
    offered->push_back(ids(std::vector<Sequence*>(candidates.begin(), candidates.end())));
    return candidates.size() > 1 ? candidates[1] : candidates[0];
  }
};

/// Returns whatever it was told to, candidate or not.
struct FixedVictim {
  Sequence* pick = nullptr;
  Sequence* victim(std::span<Sequence* const>, const StepContext&) const { return pick; }
};

template <class P>
using Sim = testing::SimEngine<ContinuousBatchScheduler<P>, FakePagedAllocator>;

}  // namespace

static_assert(ScoresSequences<AgedShortestFirst> && !WaitingOrder<AgedShortestFirst>);
static_assert(BudgetsPrefill<PrefillBudget> && ChoosesVictim<OldestOtherVictim>);
static_assert(ScoresSequences<PriorityOrder> && !BudgetsPrefill<PriorityOrder> && !ChoosesVictim<PriorityOrder>);
static_assert(Scheduler<PriorityScheduler, FakePagedAllocator>);

TEST_CASE("a score is re-evaluated every step: an aged long prompt overtakes a stream of short ones",
          "[sched][policy][score]") {
  // One sequence at a time; a new 4-token prompt arrives before every step and finishes in its step.
  FakePagedAllocator alloc(100, 4);
  auto run = [&alloc](auto& sched, auto& sim) {
    sim.add(20, 1);  // sequence 1, the long prompt
    std::vector<SeqId> admitted;
    for (int step = 0; step < 8; ++step) {
      sim.add(4, 1);
      for (const Sequence* s : sim.step().admitted) admitted.push_back(s->id);
    }
    sched.finish(&sim.seqs[0], alloc);
    return admitted;
  };
  SECTION("aged: at step k the long prompt scores -20 + 4k; at step 4 it ties the newcomer's -4 and arrived first") {
    ContinuousBatchScheduler<AgedShortestFirst> sched(config(1, 64));
    Sim<AgedShortestFirst> sim{sched, alloc};
    CHECK(run(sched, sim) == std::vector<SeqId>{2, 3, 4, 5, 1, 6, 7, 8});
  }
  SECTION("a waiting order is consulted once, at add: shortest first starves the long prompt") {
    ContinuousBatchScheduler<ShortestPromptFirst> sched(config(1, 64));
    Sim<ShortestPromptFirst> sim{sched, alloc};
    CHECK(run(sched, sim) == std::vector<SeqId>{2, 3, 4, 5, 6, 7, 8, 9});
  }
}

TEST_CASE("the tutorial's scheduler (docs/policies.md): aged shortest first, 16 prefill tokens a step",
          "[sched][policy]") {
  struct AgedShortestFirstCapped {
    double age_weight = 4;
    std::int32_t prefill_tokens = 16;
    double score(const Sequence& s, const StepContext& ctx) const {
      return -s.prompt_len + age_weight * static_cast<double>(ctx.step - s.added_step);
    }
    std::int32_t prefill_budget(const StepContext&) const { return prefill_tokens; }
  };
  ContinuousBatchScheduler<AgedShortestFirstCapped> sched;
  FakePagedAllocator alloc(64, 16);
  testing::SimEngine sim{sched, alloc};
  sim.add(30, 4);
  sim.add(5, 4);
  CHECK(rows(sim.step()) == "2:0+5* 1:0+11");  // the short one first; 16 prefill tokens
  CHECK(rows(sim.step()) == "2:5+1* 1:11+16");
}

TEST_CASE("a prefill budget caps prompt and recompute tokens per step, never decodes", "[sched][policy][budget]") {
  ContinuousBatchScheduler<PrefillBudget> sched(config(8, 64));
  FakePagedAllocator alloc(100, 4);
  Sim<PrefillBudget> sim{sched, alloc};
  sim.add(20, 3);
  sim.add(10, 3);
  sim.add(10, 3);
  CHECK(rows(sim.step()) == "1:0+16");               // the first 16 of the prompt; nobody else admitted
  CHECK(rows(sim.step()) == "1:16+4* 2:0+10* 3:0+2");  // 4 + 10 + 2 = 16
  CHECK(rows(sim.step()) == "1:20+1* 2:10+1* 3:2+8*");  // decodes are free; 3 finishes its prompt with 8

  SECTION("budget 0: a step with only prefills left plans nothing, and the check names the policy") {
    sched.policy().tokens = 0;
    sim.add(4, 1);
    sim.step();  // the three decode (uncapped); the newcomer is not admitted
    sim.step();
    CHECK(sim.finished == std::vector<SeqId>{1, 2, 3});
    CHECK_THROWS_AS(sim.step(), PolicyError);
    CHECK_THROWS_WITH(sim.step(), Contains("ContinuousBatchScheduler<") && Contains("PrefillBudget") &&
                                      Contains("planned an empty step while 1 sequences wait and 0 run") &&
                                      Contains("every block is free"));
  }
  SECTION("a negative budget is the policy's bug") {
    sched.policy().tokens = -1;
    CHECK_THROWS_WITH(sim.step(), Contains("PrefillBudget::prefill_budget() returned -1"));
  }
}

TEST_CASE("a prefill budget holds over a random workload with preemptions", "[sched][policy][budget]") {
  std::mt19937 rng(test::test_seed("prefill budget workload"));
  ContinuousBatchScheduler<PrefillBudget> sched(config(6, 48), PrefillBudget{12});
  FakePagedAllocator alloc(14, 4);
  Sim<PrefillBudget> sim{sched, alloc};
  for (int i = 0; i < 24; ++i) sim.add(1 + static_cast<std::int32_t>(rng() % 20), 1 + static_cast<std::int32_t>(rng() % 16));
  std::int32_t preempted = 0;
  for (int step = 0; step < 2000 && (sched.num_running() || sched.num_waiting()); ++step) {
    const StepPlan plan = sim.step();
    std::int32_t prefill = 0;
    for (const auto& c : plan.chunks) prefill += is_decode(c) ? 0 : c.count;
    REQUIRE(prefill <= 12);
    preempted += static_cast<std::int32_t>(plan.preempted.size());
  }
  CHECK(preempted > 0);  // tight enough to exercise recompute under the cap
  CHECK(sim.finished.size() == 24);
  CHECK(alloc.num_free_blocks() == 14);
}

TEST_CASE("a victim hook chooses among the running sequences not yet planned", "[sched][policy][victim]") {
  std::vector<std::string> offered;
  ContinuousBatchScheduler<OldestOtherVictim> sched(config(4, 64), OldestOtherVictim{&offered});
  FakePagedAllocator alloc(3, 4);
  Sim<OldestOtherVictim> sim{sched, alloc};
  sim.add(4, 2);
  sim.add(4, 4);
  sim.add(4, 4);
  CHECK(rows(sim.step()) == "1:0+4* 2:0+4* 3:0+4*");
  // 1 needs a second block: offered all three, it gives up 2 (the default takes 3, the newest); then 3
  // needs one too, and is its own only candidate.
  const StepPlan plan = sim.step();
  CHECK(rows(plan) == "1:4+1*");
  CHECK(ids(plan.preempted) == "2 3");
  CHECK(offered == std::vector<std::string>{"1 2 3", "3"});
  sim.run_to_completion();
  CHECK(sim.finished == std::vector<SeqId>{1, 2, 3});
  CHECK(alloc.num_free_blocks() == 3);
}

TEST_CASE("a victim that is not a candidate is the policy's bug", "[sched][policy][victim]") {
  ContinuousBatchScheduler<FixedVictim> sched(config(4, 64));
  FakePagedAllocator alloc(2, 4);
  Sim<FixedVictim> sim{sched, alloc};
  Sequence& planned = sim.add(3, 4);  // one block with room for a fourth token
  sim.add(4, 4);                      // one full block: its fifth token needs a block, and none is free
  sim.step();
  sched.policy().pick = &planned;  // already given its decode in this step
  CHECK_THROWS_WITH(sim.step(), Contains("FixedVictim::victim() returned sequence 1, which is not one of its 1 "
                                         "candidates"));
  sched.policy().pick = nullptr;
  CHECK_THROWS_WITH(sched.schedule(alloc), Contains("returned nullptr"));
}

TEST_CASE("PriorityOrder with equal priorities plans exactly as Fcfs", "[sched][policy][priority]") {
  std::mt19937 rng(test::test_seed("priority equals fcfs"));
  ContinuousBatchScheduler<> fcfs(config(5, 32));
  PriorityScheduler prio(config(5, 32));
  FakePagedAllocator fa(12, 4), pa(12, 4);
  testing::SimEngine<ContinuousBatchScheduler<>, FakePagedAllocator> fsim{fcfs, fa};
  testing::SimEngine<PriorityScheduler, FakePagedAllocator> psim{prio, pa};
  std::int32_t preempted = 0;
  for (int step = 0; step < 3000 && (step < 40 || fcfs.num_running() || fcfs.num_waiting()); ++step) {
    if (step < 40 && rng() % 2 == 0) {
      const auto prompt = 1 + static_cast<std::int32_t>(rng() % 18), out = 1 + static_cast<std::int32_t>(rng() % 12);
      fsim.add(prompt, out);
      psim.add(prompt, out);
    }
    const StepPlan f = fsim.step(), p = psim.step();
    REQUIRE(rows(f) == rows(p));
    REQUIRE(ids(f.preempted) == ids(p.preempted));
    REQUIRE(ids(f.admitted) == ids(p.admitted));
    preempted += static_cast<std::int32_t>(f.preempted.size());
  }
  CHECK(preempted > 0);
  CHECK(fsim.finished == psim.finished);
  CHECK(fsim.finished.size() == fsim.seqs.size());
}

TEST_CASE("PriorityScheduler admits high priority first and preempts low priority first", "[sched][policy][priority]") {
  // Four requests of 4 + 12 tokens (4 blocks each at the end) in a cache of 8 blocks; the low-priority
  // ones arrive first.
  auto run = [](auto& sched) {
    FakePagedAllocator alloc(8, 4);
    testing::SimEngine sim{sched, alloc};
    for (std::int32_t priority : {5, 5, 0, 0}) sim.make(4, 12).priority = priority;
    for (auto& s : sim.seqs) sched.add(&s);
    const StepPlan first = sim.step();
    std::vector<Sequence*> preempted;
    while (sched.num_running() || sched.num_waiting()) {
      const StepPlan p = sim.step();
      preempted.insert(preempted.end(), p.preempted.begin(), p.preempted.end());
    }
    CHECK(alloc.num_free_blocks() == 8);
    return std::tuple{ids(first.admitted), ids(preempted), sim.finished};
  };
  SECTION("priority") {
    PriorityScheduler sched(config(8, 64));
    const auto [admitted, preempted, finished] = run(sched);
    CHECK(admitted == "3 4 1 2");
    // At 9 tokens each needs a third block: 3 is planned first and takes 2's blocks, 4 the rest, 1 gives
    // up its own. They resume (oldest first) only when 3 and 4 have finished.
    CHECK(preempted == "2 1");
    CHECK(finished == std::vector<SeqId>{3, 4, 1, 2});
  }
  SECTION("first come, first served preempts the newest: the high-priority ones") {
    ContinuousBatchScheduler<> sched(config(8, 64));
    const auto [admitted, preempted, finished] = run(sched);
    CHECK(admitted == "1 2 3 4");
    CHECK(preempted == "4 3");
    CHECK(finished == std::vector<SeqId>{1, 2, 3, 4});
  }
}
