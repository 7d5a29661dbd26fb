#include <catch2/catch.hpp>

#include <string>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/contiguous_allocator.hpp"
#include "infer/memory/paged_allocator.hpp"
#include "infer/sched/static_batch.hpp"
#include "infer/testing/fake_allocator.hpp"

using namespace infer;
using infer::testing::FakePagedAllocator;
using infer::testing::FakeShape;
using infer::testing::FakeSlotAllocator;

namespace {

using Real = ContiguousAllocator<Shape{.max_batch = 2, .max_input = 8, .max_output = 4}>;
using Fake = FakeSlotAllocator<FakeShape{2, 8, 4}>;

using testing::rows;

}  // namespace

static_assert(Scheduler<StaticBatchScheduler<2>, Real>);
static_assert(Scheduler<StaticBatchScheduler<1>, Real>);  // fewer running than slots is allowed
static_assert(Scheduler<StaticBatchScheduler<2>, Fake>);
// A paged allocator has no build-time Shape: the static scheduler is not a scheduler for it.
static_assert(!Scheduler<StaticBatchScheduler<2>, PagedBlockAllocator<16>>);
static_assert(!Scheduler<StaticBatchScheduler<2>, FakePagedAllocator>);
static_assert(FixedShapeAllocator<Real> && !FixedShapeAllocator<PagedBlockAllocator<16>>);

TEMPLATE_TEST_CASE("a finished sequence's slot is refilled on the next step, prompt whole", "[sched][static]", Real,
                   Fake) {
  StaticBatchScheduler<2> sched;
  TestType alloc;
  testing::SimEngine<StaticBatchScheduler<2>, TestType> sim(sched, alloc);
  sim.add(5, 1);  // done after its prefill
  sim.add(8, 4);  // exactly max_input: one 8-token chunk, no budget splits it
  sim.add(7, 2);
  CHECK(rows(sim.step()) == "1:0+5* 2:0+8*");
  CHECK(sim.finished == std::vector<SeqId>{1});
  CHECK(sched.num_running() == 1);
  CHECK(sched.num_waiting() == 1);
  CHECK(alloc.num_free_blocks() == 1);
  CHECK(rows(sim.step()) == "2:8+1* 3:0+7*");
  CHECK(sched.num_running() == 2);
  CHECK(sched.num_waiting() == 0);
  CHECK(rows(sim.step()) == "2:9+1* 3:7+1*");
  CHECK(sim.finished == std::vector<SeqId>{1, 3});
  CHECK(rows(sim.step()) == "2:10+1*");  // reaches max_len 12: the slot's full capacity
  CHECK(sim.finished == std::vector<SeqId>{1, 3, 2});
  CHECK(sched.num_running() == 0);
  CHECK(alloc.num_free_blocks() == 2);
  CHECK(sched.schedule(alloc).empty());
}

TEST_CASE("MaxBatch below the shape's max_batch limits the running set", "[sched][static]") {
  StaticBatchScheduler<1> sched;
  Real alloc;
  testing::SimEngine<StaticBatchScheduler<1>, Real> sim(sched, alloc);
  sim.add(3, 2);
  sim.add(3, 2);
  CHECK(rows(sim.step()) == "1:0+3*");
  CHECK(alloc.num_free_blocks() == 1);  // a free slot, but the batch is full
  CHECK(rows(sim.step()) == "1:3+1*");
  CHECK(rows(sim.step()) == "2:0+3*");
  sim.run_to_completion();
  CHECK(alloc.num_free_blocks() == 2);
}

TEMPLATE_TEST_CASE("check rejects what exceeds the build shape, at the exact limit", "[sched][static][check]", Real,
                   Fake) {
  StaticBatchScheduler<2> sched;
  TestType alloc;
  testing::SimEngine<StaticBatchScheduler<2>, TestType> sim(sched, alloc);
  CHECK_NOTHROW(sched.check(sim.make(8, 4), alloc));
  const Sequence& long_prompt = sim.make(9, 1);
  CHECK_THROWS_AS(sched.check(long_prompt, alloc), InvalidArgument);
  CHECK_THROWS_WITH(sched.check(long_prompt, alloc),
                    "prompt has 9 tokens; this engine's max_input is 8 (build a StaticEngine with a larger Shape or "
                    "use the paged engine)");
  CHECK_THROWS_WITH(sched.check(sim.make(2, 5), alloc),
                    Catch::Contains("may generate 5 tokens; this engine's max_output is 4") &&
                        Catch::Contains("lower max_tokens"));
  CHECK_THROWS_WITH(sched.check(sim.make(0, 1), alloc), Catch::Contains("non-empty prompt"));
}

TEST_CASE("static fork takes a slot of its own, and only while one is free", "[sched][static][fork]") {
  StaticBatchScheduler<2> sched;
  Real alloc;
  testing::SimEngine<StaticBatchScheduler<2>, Real> sim(sched, alloc);
  Sequence& parent = sim.add(4, 2);
  sim.step();
  Sequence& child = sim.make(4, 2);
  child.tokens = parent.tokens;
  child.arrival = parent.arrival;
  sched.fork(&parent, &child, alloc);
  CHECK(sched.num_running() == 2);
  CHECK(alloc.num_free_blocks() == 0);
  Sequence& third = sim.make(4, 2);
  CHECK_THROWS_WITH(sched.fork(&parent, &third, alloc),
                    Catch::Contains("2 of this engine's 2 slots are in use") && Catch::Contains("fewer samples"));
  CHECK(third.status == SeqStatus::waiting);

  auto plan = sim.step();
  CHECK(rows(plan) == "1:4+1* 2:4+1*");
  CHECK(plan.copies == std::vector<BlockCopy>{{0, 1}});
  sim.run_to_completion();
  CHECK(alloc.num_free_blocks() == 2);
}

TEST_CASE("static abort returns the slot and never double-frees", "[sched][static]") {
  StaticBatchScheduler<2> sched;
  Fake alloc;
  testing::SimEngine<StaticBatchScheduler<2>, Fake> sim(sched, alloc);
  Sequence& a = sim.add(4, 4);
  Sequence& b = sim.add(4, 4);
  Sequence& c = sim.add(4, 4);
  sim.step();
  sched.finish(&c, alloc);  // waiting
  sched.finish(&a, alloc);  // running
  sched.finish(&a, alloc);  // again: no-op
  CHECK(alloc.num_free_blocks() == 1);
  CHECK(sched.num_waiting() == 0);
  CHECK(rows(sim.step()) == "2:4+1*");
  sched.finish(&b, alloc);
  CHECK(alloc.num_free_blocks() == 2);
  CHECK(alloc.frees_of_unknown == 0);
  CHECK(sched.num_running() == 0);
}
