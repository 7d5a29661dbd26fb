// A policy whose score hook forgot the StepContext: not silently ignored, but an error with the signature.
// expect: Policy::score must be callable as double score\(const infer::Sequence&, const infer::StepContext&\)
#include "infer/sched/continuous_batch.hpp"

struct ShortFirst {
  double score(const infer::Sequence& s) const { return -s.prompt_len; }
};

infer::ContinuousBatchScheduler<ShortFirst> scheduler;
