#pragma once
/// \file
/// What the engine reports about a request: per sample the text and token ids so far (and the delta of
/// the last step, for streaming), why it finished, and timings. The shape follows vLLM's RequestOutput.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/sched/sequence.hpp"

namespace infer {

using RequestId = std::uint64_t;
using Clock = std::chrono::steady_clock;

/// One generated token's log-probability and, when asked for, the most likely alternatives.
struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<std::int32_t, float>> top;
};

struct CompletionOutput {
  std::int32_t index = 0;            ///< which of the request's n samples
  std::string text;                  ///< everything generated so far (stop strings removed)
  std::vector<std::int32_t> token_ids;
  std::string delta_text;            ///< text added by the last step (streaming)
  std::vector<std::int32_t> delta_token_ids;
  std::vector<TokenLogprob> logprobs;  ///< one per generated token when the request asked for logprobs
  FinishReason finish_reason = FinishReason::none;
  [[nodiscard]] bool finished() const noexcept { return finish_reason != FinishReason::none; }
};

struct RequestMetrics {
  Clock::time_point arrival;
  std::optional<Clock::time_point> first_token;  ///< when the first sample produced its first token
  std::optional<Clock::time_point> finished;
  std::int32_t prompt_tokens = 0;
  std::int32_t cached_prompt_tokens = 0;  ///< prompt tokens the prefix cache supplied (first sample)
  std::int32_t preemptions = 0;

  /// Seconds from arrival to the first token (time to first token), or -1 when none yet.
  [[nodiscard]] double ttft_s() const {
    return first_token ? std::chrono::duration<double>(*first_token - arrival).count() : -1.0;
  }
  [[nodiscard]] double latency_s() const {
    return finished ? std::chrono::duration<double>(*finished - arrival).count() : -1.0;
  }
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;  ///< n entries, by index
  /// With SamplingParams::prompt_logprobs: one entry per prompt token, filled as the prompt is computed
  /// (complete in the output that brings the first generated token); the first is nullopt (nothing
  /// predicts it), as in vLLM. Empty otherwise.
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  RequestMetrics metrics;
  bool finished = false;  ///< every sample finished
  std::string error;      ///< why the request failed, when it did (outputs finish with FinishReason::error)

  [[nodiscard]] std::int64_t generated_tokens() const noexcept {
    std::int64_t n = 0;
    for (const auto& o : outputs) n += static_cast<std::int64_t>(o.token_ids.size());
    return n;
  }
};

}  // namespace infer
