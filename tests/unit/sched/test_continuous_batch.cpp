#include <catch2/catch.hpp>

#include <string>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/sched/continuous_batch.hpp"
#include "infer/sched/scheduler_config.hpp"
#include "infer/testing/fake_allocator.hpp"

using namespace infer;
using infer::testing::FakePagedAllocator;
using infer::testing::FakeShape;
using infer::testing::FakeSlotAllocator;

namespace {

/// The custom policy a researcher would write: short prompts first, ties first come first served.
struct ShortestPromptFirst {
  bool operator()(const Sequence& a, const Sequence& b) const {
    return a.prompt_len != b.prompt_len ? a.prompt_len < b.prompt_len : a.arrival < b.arrival;
  }
};

using Fifo = ContinuousBatchScheduler<>;
using Sim = testing::SimEngine<Fifo, FakePagedAllocator>;

using testing::rows;

std::string ids(const std::vector<Sequence*>& seqs) {
  std::string out;
  for (const auto* s : seqs) out += detail::cat(out.empty() ? "" : " ", s->id);
  return out;
}

SchedulerConfig config(std::int32_t seqs, std::int32_t tokens, bool chunked = true) {
  SchedulerConfig c;
  c.max_num_seqs = seqs;
  c.max_num_batched_tokens = tokens;
  c.enable_chunked_prefill = chunked;
  return c;
}

}  // namespace

static_assert(Scheduler<Fifo, FakePagedAllocator>);
static_assert(Scheduler<Fifo, FakeSlotAllocator<FakeShape{2, 8, 4}>>);
static_assert(Scheduler<ContinuousBatchScheduler<ShortestPromptFirst>, FakePagedAllocator>);
static_assert(WaitingOrder<Fcfs> && WaitingOrder<ShortestPromptFirst>);
static_assert(!WaitingOrder<int>);

TEST_CASE("SchedulerConfig::validate names the bad field", "[sched][config]") {
  CHECK_NOTHROW(SchedulerConfig{}.validate());
  CHECK_NOTHROW(config(4, 4).validate());  // boundary: one token per running sequence
  CHECK_THROWS_AS(config(0, 16).validate(), InvalidArgument);
  CHECK_THROWS_WITH(config(0, 16).validate(), Catch::Contains("max_num_seqs is 0"));
  CHECK_THROWS_WITH(config(1, 0).validate(), Catch::Contains("max_num_batched_tokens is 0"));
  CHECK_THROWS_WITH(config(4, 3).validate(), Catch::Contains("at least max_num_seqs"));
  CHECK_THROWS_AS(Fifo(config(-1, 16)), InvalidArgument);
}

TEST_CASE("admission stops exactly when free blocks run out", "[sched][continuous]") {
  Fifo sched(config(16, 256));
  SECTION("10 blocks hold five 8-token prompts, not six") {
    FakePagedAllocator alloc(10, 4);
    Sim sim{sched, alloc};
    for (int i = 0; i < 6; ++i) sim.add(8, 4);
    auto plan = sched.schedule(alloc);
    CHECK(rows(plan) == "1:0+8* 2:0+8* 3:0+8* 4:0+8* 5:0+8*");
    CHECK(sched.num_running() == 5);
    CHECK(sched.num_waiting() == 1);
    CHECK(alloc.num_free_blocks() == 0);
  }
  SECTION("9 blocks: four admitted, one block left") {
    FakePagedAllocator alloc(9, 4);
    Sim sim{sched, alloc};
    for (int i = 0; i < 6; ++i) sim.add(8, 4);
    auto plan = sched.schedule(alloc);
    CHECK(plan.chunks.size() == 4);
    CHECK(sched.num_waiting() == 2);
    CHECK(alloc.num_free_blocks() == 1);
  }
  SECTION("a prompt of 9 takes 3 blocks: 9 blocks admit three") {
    FakePagedAllocator alloc(9, 4);
    Sim sim{sched, alloc};
    for (int i = 0; i < 4; ++i) sim.add(9, 1);
    CHECK(sched.schedule(alloc).chunks.size() == 3);
    CHECK(alloc.num_free_blocks() == 0);
  }
}

TEST_CASE("admission stops at max_num_seqs and refills when one finishes", "[sched][continuous]") {
  Fifo sched(config(3, 64));
  FakePagedAllocator alloc(100, 4);
  Sim sim{sched, alloc};
  sim.add(4, 1);  // finishes after its prefill samples
  sim.add(4, 5);
  sim.add(4, 5);
  sim.add(4, 5);
  CHECK(rows(sim.step()) == "1:0+4* 2:0+4* 3:0+4*");
  CHECK(sim.finished == std::vector<SeqId>{1});
  CHECK(sched.num_running() == 2);
  CHECK(sched.num_waiting() == 1);
  CHECK(rows(sim.step()) == "2:4+1* 3:4+1* 4:0+4*");
  CHECK(sched.num_running() == 3);
}

TEST_CASE("the token budget bounds a step exactly", "[sched][continuous]") {
  SECTION("chunked prefill off: prompts must fit whole, in order") {
    Fifo sched(config(4, 16, false));
    FakePagedAllocator alloc(100, 4);
    Sim sim{sched, alloc};
    SECTION("8 + 8 fill the budget; the 1-token prompt waits") {
      sim.add(8, 1);
      sim.add(8, 1);
      sim.add(1, 1);
      CHECK(rows(sched.schedule(alloc)) == "1:0+8* 2:0+8*");
      CHECK(sched.num_waiting() == 1);
    }
    SECTION("9 does not fit the 8 left, and the later 1-token prompt may not overtake it") {
      sim.add(8, 1);
      sim.add(9, 1);
      sim.add(1, 1);
      CHECK(rows(sched.schedule(alloc)) == "1:0+8*");
      CHECK(sched.num_waiting() == 2);
      CHECK(alloc.num_free_blocks() == 98);  // the second allocation was undone
      CHECK(alloc.block_table(sim.seqs[1]).empty());
    }
  }
  SECTION("chunked prefill on: the prompt that does not fit is split at the budget") {
    Fifo sched(config(4, 16));
    FakePagedAllocator alloc(100, 4);
    Sim sim{sched, alloc};
    sim.add(8, 3);
    sim.add(9, 3);
    sim.add(1, 3);
    CHECK(rows(sim.step()) == "1:0+8* 2:0+8");
    CHECK(sched.num_waiting() == 1);
    CHECK(sim.seqs[1].num_computed == 8);
    CHECK(sim.seqs[1].len() == 9);  // no token sampled from a partial prefill
    // Decode of 1 first, then the last prompt token of 2 (a 1-token prefill chunk), then 3.
    CHECK(rows(sim.step()) == "1:8+1* 2:8+1* 3:0+1*");
  }
}

TEST_CASE("a prompt longer than the budget is chunked with exact sizes, only the last chunk samples",
          "[sched][continuous]") {
  Fifo sched(config(8, 8));
  FakePagedAllocator alloc(100, 4);
  Sim sim{sched, alloc};
  Sequence& s = sim.add(20, 2);
  CHECK(rows(sim.step()) == "1:0+8");
  CHECK(s.num_computed == 8);
  CHECK(alloc.committed.at(1) == 8);  // schedule() committed the chunk it planned
  CHECK(rows(sim.step()) == "1:8+8");
  CHECK(rows(sim.step()) == "1:16+4*");
  CHECK(s.num_computed == 20);
  CHECK(s.len() == 21);
  CHECK(rows(sim.step()) == "1:20+1*");
  CHECK(sim.finished == std::vector<SeqId>{1});
  CHECK(s.status == SeqStatus::finished);
  CHECK(alloc.num_free_blocks() == 100);
}

TEST_CASE("decodes and prefill chunks share a step, decodes come first", "[sched][continuous]") {
  SECTION("first come first served") {
    Fifo sched(config(8, 8));
    FakePagedAllocator alloc(100, 4);
    Sim sim{sched, alloc};
    sim.add(20, 4);
    sim.add(2, 4);
    CHECK(rows(sim.step()) == "1:0+8");
    CHECK(rows(sim.step()) == "1:8+8");
    CHECK(rows(sim.step()) == "1:16+4* 2:0+2*");
    sim.add(10, 1);
    CHECK(rows(sim.step()) == "1:20+1* 2:2+1* 3:0+6");
    CHECK(rows(sim.step()) == "1:21+1* 2:3+1* 3:6+4*");
  }
  SECTION("a younger sequence's decode goes before an older one's prefill chunk") {
    ContinuousBatchScheduler<ShortestPromptFirst> sched(config(4, 8));
    FakePagedAllocator alloc(100, 4);
    testing::SimEngine<ContinuousBatchScheduler<ShortestPromptFirst>, FakePagedAllocator> sim{sched, alloc};
    sim.add(20, 2);  // arrival 0
    sim.add(3, 4);   // arrival 1, but shorter: admitted first
    CHECK(rows(sim.step()) == "2:0+3* 1:0+5");
    // Running order is arrival order: the older sequence takes the whole budget...
    CHECK(rows(sim.step()) == "1:5+8");
    // ...and when it leaves one token, the younger one's decode leads the batch.
    CHECK(rows(sim.step()) == "2:3+1* 1:13+7*");
  }
}

TEST_CASE("a policy orders admission, the default is arrival order", "[sched][continuous][policy]") {
  FakePagedAllocator alloc(100, 4);
  SECTION("Fcfs: the long early prompt takes the budget") {
    Fifo sched(config(4, 8));
    Sim sim{sched, alloc};
    sim.add(20, 1);
    sim.add(4, 1);
    CHECK(rows(sched.schedule(alloc)) == "1:0+8");
  }
  SECTION("ShortestPromptFirst: the short one first, the long one gets the rest") {
    ContinuousBatchScheduler<ShortestPromptFirst> sched(config(4, 8));
    testing::SimEngine<ContinuousBatchScheduler<ShortestPromptFirst>, FakePagedAllocator> sim{sched, alloc};
    sim.add(20, 1);
    sim.add(4, 1);
    sim.add(4, 1);  // same length as 2: arrival breaks the tie
    CHECK(rows(sched.schedule(alloc)) == "2:0+4* 3:0+4*");
  }
}

TEST_CASE("an earlier request is never overtaken by a later one that fits when it does not",
          "[sched][continuous][fcfs]") {
  Fifo sched(config(4, 64));
  FakePagedAllocator alloc(4, 4);
  Sim sim{sched, alloc};
  sim.add(8, 4);   // 2 blocks, grows to 3
  sim.add(12, 1);  // needs 3 blocks: waits for 1
  sim.add(4, 1);   // needs 1 block and one is free, but it came later
  CHECK(rows(sim.step()) == "1:0+8*");
  CHECK(sched.num_waiting() == 2);
  CHECK(rows(sim.step()) == "1:8+1*");
  CHECK(rows(sim.step()) == "1:9+1*");
  CHECK(rows(sim.step()) == "1:10+1*");
  CHECK(sim.finished == std::vector<SeqId>{1});
  CHECK(rows(sim.step()) == "2:0+12* 3:0+4*");
  sim.run_to_completion();
  CHECK(sim.finished == std::vector<SeqId>{1, 2, 3});
  CHECK(alloc.num_free_blocks() == 4);
}

TEST_CASE("a decode that finds no block preempts the newest, it is later recomputed from 0",
          "[sched][continuous][preempt]") {
  Fifo sched(config(4, 64));
  FakePagedAllocator alloc(3, 4);
  Sim sim{sched, alloc};
  Sequence& a = sim.add(4, 2);
  Sequence& b = sim.add(4, 4);
  Sequence& c = sim.add(4, 4);
  CHECK(rows(sim.step()) == "1:0+4* 2:0+4* 3:0+4*");
  CHECK(alloc.num_free_blocks() == 0);

  // a needs a 2nd block: c (newest) goes; then b needs one and is itself the newest.
  auto plan = sim.step();
  CHECK(rows(plan) == "1:4+1*");
  CHECK(ids(plan.preempted) == "3 2");
  CHECK(plan.copies.empty());
  for (Sequence* s : {&b, &c}) {
    CHECK(s->status == SeqStatus::waiting);
    CHECK(s->num_computed == 0);
    CHECK(s->num_preemptions == 1);
    CHECK(s->len() == 5);  // keeps its generated token
    CHECK(alloc.block_table(*s).empty());
  }
  CHECK(a.num_preemptions == 0);
  CHECK(sim.finished == std::vector<SeqId>{1});  // a reached max_len 6
  CHECK(sched.num_running() == 0);
  CHECK(sched.num_waiting() == 2);
  CHECK(alloc.num_free_blocks() == 3);

  // The preempted resume oldest first, recomputing prompt and generated tokens; c does not fit yet.
  CHECK(rows(sim.step()) == "2:0+5*");
  CHECK(b.num_computed == 5);
  CHECK(rows(sim.step()) == "2:5+1*");
  CHECK(rows(sim.step()) == "2:6+1*");
  CHECK(sim.finished == std::vector<SeqId>{1, 2});
  CHECK(rows(sim.step()) == "3:0+5*");
  sim.run_to_completion();
  CHECK(sim.finished == std::vector<SeqId>{1, 2, 3});
  CHECK(alloc.num_free_blocks() == 3);
  CHECK(alloc.frees_of_unknown == 0);
}

TEST_CASE("a step that preempted admits nobody", "[sched][continuous][preempt]") {
  Fifo sched(config(4, 64));
  FakePagedAllocator alloc(4, 4);
  Sim sim{sched, alloc};
  sim.add(4, 8);  // 1 block, grows
  sim.add(8, 1);  // 2 blocks; after sampling 9 tokens → needs a 3rd
  CHECK(rows(sim.step()) == "1:0+4* 2:0+8*");
  CHECK(sim.finished == std::vector<SeqId>{2});  // max_len 9 reached
  sim.add(8, 4);                                  // 3: 2 blocks
  sim.add(4, 4);                                  // 4: 1 block
  CHECK(rows(sim.step()) == "1:4+1* 3:0+8*");     // blocks: 1 has 2, 3 has 2
  CHECK(alloc.num_free_blocks() == 0);
  // 1 is at 6 tokens (2 blocks, room to 8): decodes freely; 3 at 9 needs a 3rd block: preempts itself.
  auto plan = sim.step();
  CHECK(rows(plan) == "1:5+1*");
  CHECK(ids(plan.preempted) == "3");
  // Two blocks are free and 4 needs one, but nobody is admitted in a preempting step (and 3, first
  // in line again, needs three).
  CHECK(sched.num_running() == 1);
  CHECK(alloc.num_free_blocks() == 2);
  sim.run_to_completion();
  CHECK(alloc.num_free_blocks() == 4);
}

TEST_CASE("finish and abort return every block, wherever the sequence is", "[sched][continuous]") {
  Fifo sched(config(4, 16));
  FakePagedAllocator alloc(8, 4);
  Sim sim{sched, alloc};
  for (int i = 0; i < 10; ++i) sim.add(3 + (i * 7) % 15, 1 + (i * 5) % 9);
  Sequence& queued = sim.seqs[9];
  sched.finish(&queued, alloc);  // aborted before it ever ran
  CHECK(queued.status == SeqStatus::finished);
  CHECK(sched.num_waiting() == 9);
  sim.step();
  sim.step();
  Sequence& first = sim.seqs[1];
  REQUIRE(first.status == SeqStatus::running);
  sched.finish(&first, alloc);  // aborted while running
  sched.finish(&first, alloc);  // twice: a no-op
  CHECK(alloc.block_table(first).empty());

  std::int32_t preemptions = 0;
  for (int steps = 0; (sched.num_running() > 0 || sched.num_waiting() > 0) && steps < 1000; ++steps) {
    const auto plan = sim.step();
    CHECK(plan.num_tokens() <= 16);
    CHECK(plan.chunks.size() <= 4);
    CHECK(sched.num_running() <= 4);
    preemptions += static_cast<std::int32_t>(plan.preempted.size());
  }
  CHECK(preemptions > 0);  // the workload is tight enough to exercise preemption
  CHECK(sched.num_running() == 0);
  CHECK(sched.num_waiting() == 0);
  CHECK(alloc.num_free_blocks() == 8);
  CHECK(alloc.frees_of_unknown == 0);
  for (std::size_t i = 2; i < 9; ++i) {
    CHECK(sim.seqs[i].status == SeqStatus::finished);
    CHECK(sim.seqs[i].len() == sim.seqs[i].max_len);
  }
}

TEST_CASE("fork shares the parent's blocks, the child runs right after it", "[sched][continuous][fork]") {
  Fifo sched(config(4, 64));
  FakePagedAllocator alloc(8, 4);
  Sim sim{sched, alloc};
  Sequence& parent = sim.add(6, 3);
  sim.add(4, 3);  // 2: arrived after the parent; the child goes before it
  CHECK(rows(sim.step()) == "1:0+6* 2:0+4*");
  CHECK(alloc.num_free_blocks() == 5);

  Sequence& child = sim.make(6, 3);
  child.tokens = parent.tokens;
  child.tokens.back() = -2;  // its own sample
  child.arrival = parent.arrival;
  sched.fork(&parent, &child, alloc);
  CHECK(child.status == SeqStatus::running);
  CHECK(child.num_computed == 6);
  CHECK(sched.num_running() == 3);
  CHECK(alloc.num_free_blocks() == 5);  // shared, not copied

  auto plan = sim.step();
  CHECK(rows(plan) == "1:6+1* 3:6+1* 2:4+1*");
  // The parent writes position 6 into the shared block 1: copied first (to the lowest free block, 3).
  CHECK(plan.copies == std::vector<BlockCopy>{{1, 3}});
  sim.run_to_completion();
  CHECK(alloc.num_free_blocks() == 8);

  Sequence& orphan = sim.make(4, 1);
  CHECK_THROWS_WITH(sched.fork(&parent, &orphan, alloc), Catch::Contains("is not running"));
}

TEST_CASE("check rejects what could never be scheduled, at the exact limit", "[sched][continuous][check]") {
  FakePagedAllocator alloc(10, 4);  // 40 tokens in all
  Fifo sched(config(4, 64));
  Sim sim{sched, alloc};
  CHECK_NOTHROW(sched.check(sim.make(30, 10), alloc));
  const Sequence& big = sim.make(30, 11);
  CHECK_THROWS_AS(sched.check(big, alloc), InvalidArgument);
  CHECK_THROWS_WITH(sched.check(big, alloc), Catch::Contains("may grow to 41 tokens") &&
                                                 Catch::Contains("at most 40 tokens") &&
                                                 Catch::Contains("lower max_tokens"));
  CHECK_THROWS_WITH(sched.check(sim.make(0, 4), alloc), Catch::Contains("non-empty prompt"));
  Sequence& short_max = sim.make(8, 0);
  short_max.max_len = 7;
  CHECK_THROWS_WITH(sched.check(short_max, alloc), Catch::Contains("max_len 7"));

  Fifo whole(config(4, 32, false));
  CHECK_NOTHROW(whole.check(sim.make(20, 12), alloc));
  CHECK_THROWS_WITH(whole.check(sim.make(20, 13), alloc),
                    Catch::Contains("chunked prefill is off") && Catch::Contains("at least 33"));
}

TEST_CASE("misuse is reported, not undefined", "[sched][continuous]") {
  Fifo sched(config(4, 64));
  FakePagedAllocator alloc(2, 4);
  Sim sim{sched, alloc};
  CHECK_THROWS_WITH(sched.add(nullptr), Catch::Contains("null"));
  Sequence& s = sim.add(4, 2);
  CHECK_THROWS_WITH(sched.add(&s), Catch::Contains("already queued"));
  const auto plan = sched.schedule(alloc);
  s.tokens.push_back(7);
  sched.update(plan, alloc);
  CHECK_THROWS_WITH(sched.update(plan, alloc), Catch::Contains("exactly once"));
  CHECK_THROWS_WITH(sched.add(&s), Catch::Contains("is running"));

  SECTION("a sequence check() would reject fails loudly when it cannot run alone") {
    Sequence& big = sim.make(9, 0);  // 3 blocks of a 2-block cache, never checked
    sched.finish(&s, alloc);
    sched.add(&big);
    CHECK_THROWS_WITH(sched.schedule(alloc), Catch::Contains("sequence 2 needs 9 tokens") &&
                                                 Catch::Contains("even running alone"));
    CHECK(alloc.num_free_blocks() == 2);
  }
  SECTION("growing past the cache while alone") {
    Sequence& big = sim.make(8, 4);
    sched.finish(&s, alloc);
    sched.add(&big);
    sim.step();  // 8 tokens, both blocks; then 9 tokens need a third
    CHECK_THROWS_WITH(sched.schedule(alloc), Catch::Contains("needs 9 tokens"));
    CHECK(big.status == SeqStatus::running);  // left intact for the engine to finish
    sched.finish(&big, alloc);
    CHECK(alloc.num_free_blocks() == 2);
  }
}

TEST_CASE("prefix-cache hits are skipped, but never the last token", "[sched][continuous][prefix]") {
  Fifo sched(config(4, 64));
  FakePagedAllocator alloc(20, 4);
  Sim sim{sched, alloc};
  Sequence& part = sim.add(12, 2);
  Sequence& full = sim.add(12, 2);
  alloc.cached_on_allocate[part.id] = 8;
  alloc.cached_on_allocate[full.id] = 12;
  CHECK(rows(sim.step()) == "1:8+4* 2:11+1*");
  CHECK(part.num_cached_tokens == 8);
  CHECK(full.num_cached_tokens == 11);
}

namespace {
/// Forgets to return a finished sequence's blocks: it takes them again after finishing it.
struct LeakingScheduler : Fifo {
  using Fifo::Fifo;
  template <class A>
  void finish(Sequence* seq, A& alloc) {
    const bool was_running = seq->status == SeqStatus::running;
    Fifo::finish(seq, alloc);
    if (was_running) static_cast<void>(alloc.allocate(*seq));
  }
};
/// Never plans anything.
struct IdleScheduler : Fifo {
  using Fifo::Fifo;
  template <class A>
  StepPlan schedule(A&) {
    return {};
  }
};
}  // namespace

TEST_CASE("SimEngine checks what the engine checks: blocks returned at finish, progress while holding work",
          "[sched][continuous][invariants]") {
  FakePagedAllocator alloc(12, 4);
  SECTION("a finished sequence that keeps its blocks") {
    LeakingScheduler sched(config(4, 64));
    testing::SimEngine<LeakingScheduler, FakePagedAllocator> sim{sched, alloc};
    sim.add(6, 1);
    CHECK_THROWS_AS(sim.step(), PolicyError);
    CHECK_THROWS_WITH(require_released<LeakingScheduler>(sim.seqs[0], alloc),
                      Catch::Contains("scheduler (anonymous namespace)::LeakingScheduler: sequence 1 still holds 2 KV "
                                      "blocks after finish() (10 of 12 blocks free)"));
  }
  SECTION("an empty plan while a sequence waits and none runs") {
    IdleScheduler sched(config(4, 64));
    testing::SimEngine<IdleScheduler, FakePagedAllocator> sim{sched, alloc};
    sim.add(6, 1);
    CHECK_THROWS_WITH(sim.step(), Catch::Contains("scheduler (anonymous namespace)::IdleScheduler planned an empty "
                                                  "step while 1 sequences wait and 0 run (12 of 12 KV blocks free)"));
  }
  SECTION("nothing held, nothing planned: fine") {
    IdleScheduler sched(config(4, 64));
    testing::SimEngine<IdleScheduler, FakePagedAllocator> sim{sched, alloc};
    CHECK(sim.step().empty());
  }
}
