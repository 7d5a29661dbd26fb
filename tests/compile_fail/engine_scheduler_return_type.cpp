// An Engine composed with a scheduler whose add() returns int: the error names the member, its expected
// signature and the type it returns.
// expect: infer::Scheduler: `void add\(infer::Sequence\*\)` returns another type
// expect: returns<int, void>
// expect: infer::Engine<\.\.\., Scheduler, \.\.\.>: this type does not satisfy infer::Scheduler
#include "infer/engine/presets.hpp"

struct CountingScheduler : infer::ContinuousBatchScheduler<> {
  int added = 0;
  int add(infer::Sequence* seq) {
    infer::ContinuousBatchScheduler<>::add(seq);
    return ++added;
  }
};

using Broken = infer::Engine<infer::cpu, infer::llama, infer::PagedBlockAllocator<16>, CountingScheduler,
                             infer::PagedAttention<>, infer::F32>;
static_assert(sizeof(Broken) > 0);  // instantiates the class, and with it the Engine's policy checks
