// A scheduler without fork(): the error names the missing member and its signature.
// expect: infer::Scheduler: no member callable as `void fork\(infer::Sequence\* parent, infer::Sequence\* child, A&\)`
#include "infer/sched/continuous_batch.hpp"
#include "infer/testing/fake_allocator.hpp"

struct NoFork {
  void add(infer::Sequence*);
  template <class A>
  void check(const infer::Sequence&, const A&) const;
  std::size_t num_waiting() const;
  std::size_t num_running() const;
  template <class A>
  infer::StepPlan schedule(A&);
  template <class A>
  void update(const infer::StepPlan&, A&);
  template <class A>
  void finish(infer::Sequence*, A&);
};

static_assert(infer::diagnose_scheduler<NoFork, infer::testing::FakePagedAllocator>());
