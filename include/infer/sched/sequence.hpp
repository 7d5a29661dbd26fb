#pragma once
/// \file
/// `Sequence`: the host-side state of one generation stream, shared by schedulers, allocators and the
/// engine. A request with `n > 1` samples has one Sequence per sample. Schedulers read and advance it;
/// only the engine creates, appends to and retires sequences.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace infer {

using SeqId = std::int64_t;

enum class SeqStatus : std::uint8_t {
  waiting,   ///< queued; holds no KV blocks (new, or preempted and to be recomputed)
  running,   ///< admitted; holds blocks for every token it has
  finished,  ///< done; its blocks have been returned
};

/// Why a sequence ended, in the words of OpenAI's and vLLM's APIs.
enum class FinishReason : std::uint8_t {
  none,    ///< not finished
  stop,    ///< EOS, a stop token id or a stop string
  length,  ///< max_tokens reached, or the model's context is full
  abort,   ///< cancelled by the caller
  error,   ///< failed (e.g. could never fit in the KV cache)
};

constexpr std::string_view to_string(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
  }
  return "?";
}

struct Sequence {
  SeqId id = 0;
  std::vector<std::int32_t> tokens;  ///< the prompt followed by every generated token
  std::int32_t prompt_len = 0;
  /// Leading tokens whose K/V are in the cache (computed, or found in the prefix cache). The next step
  /// computes from here; preemption by recompute sets it back to 0.
  std::int32_t num_computed = 0;
  /// prompt_len + max_tokens, capped by the engine's context: a sequence never grows beyond this.
  std::int32_t max_len = 0;
  std::uint64_t arrival = 0;  ///< admission order: lower arrived earlier (FCFS, and preemption picks the highest)
  SeqStatus status = SeqStatus::waiting;
  std::int32_t num_preemptions = 0;
  std::int32_t num_cached_tokens = 0;  ///< tokens the prefix cache supplied at the last admission
  /// Compute every prompt token even when the prefix cache holds it (a request asking for prompt
  /// logprobs); its blocks are still registered for others to hit.
  bool skip_prefix_cache_hits = false;
  /// The request's priority (SamplingParams::priority, vLLM's meaning: lower is served earlier; 0 by
  /// default). Only policies that read it (PriorityOrder, a researcher's score) act on it.
  std::int32_t priority = 0;
  /// The request's free-form class (SamplingParams::tag), for policies that treat classes differently.
  std::string tag;
  /// The scheduler's step index when add() queued it (ContinuousBatchScheduler sets it): a policy ages a
  /// waiting sequence by `StepContext::step - added_step`.
  std::int64_t added_step = 0;

  [[nodiscard]] std::int32_t len() const noexcept { return static_cast<std::int32_t>(tokens.size()); }
  [[nodiscard]] std::int32_t num_uncomputed() const noexcept { return len() - num_computed; }
  [[nodiscard]] std::int32_t num_generated() const noexcept { return len() - prompt_len; }
  [[nodiscard]] bool in_prefill() const noexcept { return num_computed < prompt_len; }
  [[nodiscard]] std::span<const std::int32_t> prompt() const noexcept {
    return std::span<const std::int32_t>(tokens).first(static_cast<std::size_t>(prompt_len));
  }
  /// The tokens generated so far.
  [[nodiscard]] std::span<const std::int32_t> output() const noexcept {
    return std::span<const std::int32_t>(tokens).subspan(static_cast<std::size_t>(prompt_len));
  }
};

}  // namespace infer
