#pragma once
/// \file
/// `SchedulerConfig`: the runtime limits of a continuous-batching scheduler, with the meaning (and the
/// defaults) of vLLM's `--max-num-seqs`, `--max-num-batched-tokens` and `--enable-chunked-prefill`.
/// They are values, not template parameters: the paged engine's shapes are decided at run time, and a
/// server exposes them as flags.

#include <cstdint>

#include "infer/core/error.hpp"

namespace infer {

struct SchedulerConfig {
  /// Sequences running at once (each holding KV blocks). Bounds the decode batch.
  std::int32_t max_num_seqs = 256;
  /// Tokens computed in one step, over all sequences (decodes count 1 each). Bounds a step's latency
  /// and the activation memory of the forward pass.
  std::int32_t max_num_batched_tokens = 2048;
  /// A prompt longer than the step's remaining token budget is computed over several steps. Off, a
  /// prompt (or a preempted sequence being recomputed) must fit the budget whole.
  bool enable_chunked_prefill = true;

  /// Throws InvalidArgument naming the first field that is out of range.
  void validate() const {
    if (max_num_seqs < 1) {
      throw InvalidArgument(detail::cat("SchedulerConfig::max_num_seqs is ", max_num_seqs,
                                        "; it must be at least 1 (the number of sequences that run at once)"));
    }
    if (max_num_batched_tokens < 1) {
      throw InvalidArgument(detail::cat("SchedulerConfig::max_num_batched_tokens is ", max_num_batched_tokens,
                                        "; it must be at least 1 (the tokens one step may compute)"));
    }
    if (max_num_batched_tokens < max_num_seqs) {
      // Every running sequence needs one token of budget per decode step; with fewer tokens than
      // sequences some admitted sequences could never decode in the same step as the others.
      throw InvalidArgument(detail::cat("SchedulerConfig::max_num_batched_tokens is ", max_num_batched_tokens,
                                        " but max_num_seqs is ", max_num_seqs,
                                        "; raise max_num_batched_tokens to at least max_num_seqs so every "
                                        "running sequence can decode in one step"));
    }
  }
};

}  // namespace infer
