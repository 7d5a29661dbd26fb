/// The schedulers against the real allocators (memory/): prefix-cache hits at admission, preemption
/// that later reuses the victim's cached prefix, copy-on-write after fork, every block back at the end.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/memory/contiguous_allocator.hpp"
#include "infer/memory/paged_allocator.hpp"
#include "infer/sched/continuous_batch.hpp"
#include "infer/sched/static_batch.hpp"
#include "infer/testing/fake_allocator.hpp"

using namespace infer;

namespace {

using Paged = PagedBlockAllocator<4>;
using Fifo = ContinuousBatchScheduler<>;
using Sim = testing::SimEngine<Fifo, Paged>;

using testing::rows;

SchedulerConfig config(std::int32_t seqs, std::int32_t tokens) {
  SchedulerConfig c;
  c.max_num_seqs = seqs;
  c.max_num_batched_tokens = tokens;
  return c;
}

}  // namespace

static_assert(Scheduler<Fifo, PagedBlockAllocator<16>>);
static_assert(Scheduler<Fifo, ContiguousAllocator<Shape{.max_batch = 8, .max_input = 1024, .max_output = 512}>>);
static_assert(Scheduler<StaticBatchScheduler<8>, ContiguousAllocator<Shape{.max_batch = 8, .max_input = 1024,
                                                                          .max_output = 512}>>);

TEST_CASE("a prompt whose prefix is cached computes only the rest", "[sched][paged][prefix]") {
  Fifo sched(config(4, 64));
  Paged alloc(20);
  Sim sim(sched, alloc);
  Sequence& a = sim.add(12, 2);
  CHECK(rows(sim.step()) == "1:0+12*");  // update() committed its 3 full blocks
  Sequence& b = sim.make(12, 2);
  b.tokens.assign(a.prompt().begin(), a.prompt().end());
  sched.check(b, alloc);
  sched.add(&b);
  // At most (12 - 1) / 4 = 2 blocks may hit: the last token is always computed.
  CHECK(rows(sim.step()) == "1:12+1* 2:8+4*");
  CHECK(b.num_cached_tokens == 8);
  CHECK(alloc.stats().prefix_hit_tokens == 8);
  sim.run_to_completion();
  CHECK(alloc.num_free_blocks() == 20);
  CHECK(alloc.stats().live_sequences == 0);
}

TEST_CASE("preemption with the paged allocator, with prefix caching the victim resumes from its cached prefix",
          "[sched][paged][preempt]") {
  const bool caching = GENERATE(false, true);
  CAPTURE(caching);
  Fifo sched(config(4, 64));
  Paged alloc(3, caching);
  Sim sim(sched, alloc);
  Sequence& a = sim.add(4, 2);
  Sequence& b = sim.add(4, 4);
  sim.add(4, 4);
  CHECK(rows(sim.step()) == "1:0+4* 2:0+4* 3:0+4*");
  auto plan = sim.step();
  CHECK(rows(plan) == "1:4+1*");
  REQUIRE(plan.preempted.size() == 2);
  CHECK(plan.preempted[0]->id == 3);
  CHECK(plan.preempted[1] == &b);
  CHECK(a.status == SeqStatus::finished);
  // b's first block (its whole prompt) was committed before it was preempted: a hit when caching.
  CHECK(rows(sim.step()) == (caching ? "2:4+1*" : "2:0+5*"));
  CHECK(b.num_cached_tokens == (caching ? 4 : 0));
  sim.run_to_completion();
  CHECK(sim.finished == std::vector<SeqId>{1, 2, 3});
  CHECK(alloc.num_free_blocks() == 3);
  CHECK(alloc.stats().used_blocks == 0);
}

TEST_CASE("fork with the paged allocator: the first write into the shared block is a copy", "[sched][paged][fork]") {
  Fifo sched(config(4, 64));
  Paged alloc(8);
  Sim sim(sched, alloc);
  Sequence& parent = sim.add(6, 3);
  CHECK(rows(sim.step()) == "1:0+6*");
  Sequence& child = sim.make(6, 3);
  child.tokens = parent.tokens;
  child.tokens.back() = -2;
  child.arrival = parent.arrival;
  sched.fork(&parent, &child, alloc);
  CHECK(alloc.num_free_blocks() == 6);
  const std::vector<std::int32_t> before(alloc.block_table(parent).begin(), alloc.block_table(parent).end());
  REQUIRE(before.size() == 2);
  auto plan = sim.step();
  CHECK(rows(plan) == "1:6+1* 2:6+1*");
  REQUIRE(plan.copies.size() == 1);
  CHECK(plan.copies[0].src == before[1]);
  CHECK(plan.copies[0].dst == alloc.block_table(parent)[1]);
  CHECK(alloc.block_table(child)[1] == before[1]);  // the child keeps the original
  CHECK(alloc.block_table(child)[0] == alloc.block_table(parent)[0]);  // still shared: nobody writes it
  sim.run_to_completion();
  CHECK(alloc.num_free_blocks() == 8);
}

TEST_CASE("a mixed workload over the paged allocator ends with every block free", "[sched][paged]") {
  const bool caching = GENERATE(false, true);
  CAPTURE(caching);
  Fifo sched(config(4, 16));
  Paged alloc(8, caching);
  Sim sim(sched, alloc);
  for (int i = 0; i < 12; ++i) sim.add(3 + (i * 7) % 15, 1 + (i * 5) % 9);
  std::int32_t preemptions = 0;
  for (int steps = 0; (sched.num_running() > 0 || sched.num_waiting() > 0) && steps < 1000; ++steps) {
    const auto plan = sim.step();
    CHECK(plan.num_tokens() <= 16);
    preemptions += static_cast<std::int32_t>(plan.preempted.size());
  }
  CHECK(preemptions > 0);
  CHECK(sim.finished.size() == 12);
  for (const auto& s : sim.seqs) CHECK(s.len() == s.max_len);
  CHECK(alloc.num_free_blocks() == 8);
  CHECK(alloc.stats().live_sequences == 0);
}
