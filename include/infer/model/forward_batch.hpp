#pragma once
/// \file
/// `ForwardChunk`: one sequence's share of a step, as the model sees it — the engine turns a
/// StepPlan's ScheduledChunks into these (tokens, positions, the allocator's block table), so the
/// model knows nothing of Sequence, schedulers or allocators. `SampleRow`: what a model that draws
/// tokens on its own device needs of one sampled row — the `Sampler`'s inputs, nothing of the request.

#include <cstdint>
#include <span>

#include "infer/sampling/sampler.hpp"
#include "infer/sampling/sampling_params.hpp"

namespace infer {

struct ForwardChunk {
  std::span<const std::int32_t> tokens;  ///< the tokens computed this step, at positions start .. start+tokens.size()-1
  std::int32_t start = 0;                ///< position of tokens[0]; K/V of positions < start are in the cache
  std::span<const std::int32_t> block_table;  ///< the sequence's blocks (the allocator's block_table())
  bool samples = false;                        ///< produce logits for the chunk's last position
  /// Empty, or one token per row: the model scores row i against score_targets[i] (log-probability of
  /// that token after the row's position; -1: row not scored). What prompt logprobs are made of.
  std::span<const std::int32_t> score_targets{};
};

/// One sampled row of a step, in the order of the chunks that sample: exactly what
/// `Sampler::sample_with_logprobs` takes besides the logits. `rng` gives its draw when the row is drawn.
struct SampleRow {
  const SamplingParams* params = nullptr;
  std::span<const std::int32_t> prompt;
  std::span<const std::int32_t> output;
  SeqRng* rng = nullptr;
};

}  // namespace infer
