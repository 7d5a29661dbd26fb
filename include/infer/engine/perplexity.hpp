#pragma once
/// \file
/// Perplexity over a long text with a sliding window, as Hugging Face's perplexity guide computes it (the
/// tool llama.cpp and vLLM users reach for to check a quantization): windows of `context` tokens start
/// every `stride` tokens; each window scores only the tokens the previous one did not reach, each given
/// everything before it in its window, so every token after the first is scored exactly once, with at
/// least context − stride tokens of context once the first window is past. Perplexity = exp(mean NLL).
///
/// The log-probabilities come from the engine (SamplingParams::prompt_logprobs = 0): every window is one
/// request of max_tokens = 1, all queued at once, so the engine batches them as it batches any prompts.

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/engine/request_output.hpp"

namespace infer {

struct PerplexityWindow {
  std::int64_t begin = 0;       ///< first token of the window
  std::int64_t end = 0;         ///< one past its last
  std::int64_t score_from = 0;  ///< first token it scores (earlier ones are context only)
};

/// The windows over `tokens` tokens. InvalidArgument unless 2 <= context, 1 <= stride < context (a window
/// must overlap the one before, or the token it starts with would go unscored) and tokens >= 2.
inline std::vector<PerplexityWindow> perplexity_windows(std::int64_t tokens, std::int64_t context, std::int64_t stride) {
  require<InvalidArgument>(context >= 2, "perplexity: the context is ", context, " tokens; it needs at least 2");
  require<InvalidArgument>(stride >= 1 && stride < context, "perplexity: the stride is ", stride,
                           "; it must be in [1, context = ", context, "): windows overlap by at least one token");
  require<InvalidArgument>(tokens >= 2, "perplexity: the text has ", tokens, " tokens; it needs at least 2");
  std::vector<PerplexityWindow> out;
  std::int64_t scored_to = 1;  // the first token is never scored: nothing predicts it
  for (std::int64_t begin = 0;; begin += stride) {
    const std::int64_t end = std::min(begin + context, tokens);
    out.push_back({begin, end, std::max(scored_to, begin + 1)});
    scored_to = end;
    if (end == tokens) break;
  }
  return out;
}

struct PerplexityResult {
  double nll = 0;                ///< summed negative log-likelihood, nats
  std::int64_t scored = 0;       ///< tokens scored
  [[nodiscard]] double mean_nll() const { return scored ? nll / static_cast<double>(scored) : 0.0; }
  [[nodiscard]] double perplexity() const { return std::exp(mean_nll()); }
};

/// Sums the scored tokens of each window from its request's prompt_logprobs (`outputs[i]` is window i's).
/// InvalidArgument when an output lacks a logprob it should have (the request did not ask for them).
inline PerplexityResult perplexity_of(std::span<const PerplexityWindow> windows, std::span<const RequestOutput> outputs) {
  require<InvalidArgument>(windows.size() == outputs.size(), "perplexity: ", windows.size(), " windows but ",
                           outputs.size(), " outputs");
  PerplexityResult r;
  for (std::size_t w = 0; w < windows.size(); ++w) {
    const auto& lp = outputs[w].prompt_logprobs;
    for (std::int64_t t = windows[w].score_from; t < windows[w].end; ++t) {
      const auto i = static_cast<std::size_t>(t - windows[w].begin);
      require<InvalidArgument>(i < lp.size() && lp[i], "perplexity: window ", w, " has no logprob for its token ", i,
                               " (ask for prompt_logprobs = 0)");
      r.nll -= static_cast<double>(lp[i]->logprob);
      ++r.scored;
    }
  }
  return r;
}

}  // namespace infer
