#pragma once
/// \file
/// `LogitsProcessor`: turns one sequence's raw logits into the distribution it is sampled from, in place.
/// The order is vLLM's: min-tokens masking, repetition penalty, frequency/presence penalties,
/// temperature, top-k, top-p, min-p. Tokens that are removed get -inf, so a later softmax gives them
/// exactly zero mass and an argmax never picks them.
///
/// Every step runs in O(vocab) (top-p in O(vocab · log(kept))): the k-th largest value comes from
/// `nth_element`, and the nucleus is found by sorting a growing head of the candidates rather than all
/// of them. Scratch buffers are members and keep their capacity, so after the first call on a vocabulary
/// nothing is allocated per token. One processor per thread: it is not safe to share one between threads.
///
/// Tie policy: top-k and top-p cut by value, so every token tied with the last one kept is kept too (the
/// result never depends on token order); an exact mass boundary (top-p) or ratio boundary (min-p) keeps
/// the token, within a relative tolerance of 1e-6 so that float rounding of a boundary that is exact in
/// real arithmetic does not decide it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sampling/sampling_params.hpp"

namespace infer {

namespace detail {
inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
/// Relative tolerance for the top-p mass and min-p ratio boundaries (see the file comment).
inline constexpr double boundary_tolerance = 1e-6;

/// The largest logit; InvalidArgument when a logit is NaN or +inf (a numerical failure upstream that
/// would otherwise make every comparison meaningless) or when all are -inf (nothing can be sampled).
inline float checked_max(std::span<const float> logits, const char* who) {
  if (logits.empty()) throw InvalidArgument(detail::cat(who, ": logits are empty; pass the vocabulary's logits"));
  float mx = neg_inf;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
      throw InvalidArgument(detail::cat(who, ": logit of token ", i, " is ", v, "; logits must be finite or -inf"));
    }
    mx = std::max(mx, v);
  }
  if (mx == neg_inf) throw InvalidArgument(detail::cat(who, ": every logit is -inf; no token can be sampled"));
  return mx;
}
}  // namespace detail

class LogitsProcessor {
 public:
  /// Applies every step `params` enables, in the order above. `prompt` and `output` are the sequence's
  /// token ids (the penalties read them); `eos_id` is masked with the stop ids while fewer than
  /// `min_tokens` have been generated (unless `ignore_eos`). InvalidArgument for a token id outside the
  /// logits, or for NaN/+inf logits.
  void apply(std::span<float> logits, const SamplingParams& params, std::span<const std::int32_t> prompt,
             std::span<const std::int32_t> output, std::optional<std::int32_t> eos_id = std::nullopt) {
    (void)detail::checked_max(logits, "LogitsProcessor");
    apply_min_tokens(logits, params, output.size(), eos_id);
    apply_penalties(logits, params, prompt, output);
    if (params.greedy()) return;  // the remaining steps never change the argmax
    apply_temperature(logits, params.temperature);
    apply_top_k(logits, params.top_k);
    apply_top_p(logits, params.top_p);
    apply_min_p(logits, params.min_p);
  }

  /// While `num_generated < min_tokens`, masks the tokens that would end generation: the stop ids, and
  /// EOS unless `ignore_eos`. Masking (rather than only refusing to stop) is what vLLM does: a request
  /// that asks for at least N tokens gets N real tokens, not N-1 and an ignored EOS.
  static void apply_min_tokens(std::span<float> logits, const SamplingParams& params, std::size_t num_generated,
                               std::optional<std::int32_t> eos_id) {
    if (num_generated >= static_cast<std::size_t>(std::max(params.min_tokens, 0))) return;
    auto mask = [&](std::int32_t id, const char* what) {
      check_id(logits, id, what);
      logits[static_cast<std::size_t>(id)] = detail::neg_inf;
    };
    for (std::int32_t id : params.stop_token_ids) mask(id, "stop_token_ids");
    if (eos_id && !params.ignore_eos) mask(*eos_id, "eos_id");
  }

  /// Repetition penalty (HF semantics) over the tokens seen in prompt or output, then OpenAI's frequency
  /// and presence penalties over the output tokens' counts:
  ///   l = l > 0 ? l / rep : l * rep;   l -= frequency * count + presence * (count > 0).
  void apply_penalties(std::span<float> logits, const SamplingParams& params, std::span<const std::int32_t> prompt,
                       std::span<const std::int32_t> output) {
    const bool rep = params.repetition_penalty != 1.0f;
    const bool freq_pres = params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
    if (!rep && !freq_pres) return;
    if (counts_.size() < logits.size()) counts_.resize(logits.size(), 0);
    // Ids are checked before anything is counted, so a bad id leaves the scratch all-zero.
    for (std::int32_t id : output) check_id(logits, id, "output");
    if (rep) {
      for (std::int32_t id : prompt) check_id(logits, id, "prompt");
    }
    touched_.clear();
    // counts_ holds output counts; a prompt-only token is marked with a count of -1 so that one
    // vocabulary-sized array answers both "seen anywhere" and "how often in the output".
    for (std::int32_t id : output) {
      std::int32_t& c = counts_[static_cast<std::size_t>(id)];
      if (c == 0) touched_.push_back(id);
      ++c;
    }
    if (rep) {
      for (std::int32_t id : prompt) {
        std::int32_t& c = counts_[static_cast<std::size_t>(id)];
        if (c == 0) {
          c = -1;
          touched_.push_back(id);
        }
      }
    }
    for (std::int32_t id : touched_) {
      const auto i = static_cast<std::size_t>(id);
      float l = logits[i];
      if (rep) l = l > 0.0f ? l / params.repetition_penalty : l * params.repetition_penalty;
      const std::int32_t count = counts_[i];
      if (count > 0) l -= params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
      logits[i] = l;
      counts_[i] = 0;  // leave the scratch all-zero for the next call
    }
  }

  /// Divides by `temperature` (> 0; 1 is a no-op).
  static void apply_temperature(std::span<float> logits, float temperature) {
    if (temperature == 1.0f) return;
    if (!(temperature > 0.0f) || !std::isfinite(temperature)) {
      throw InvalidArgument(detail::cat("apply_temperature: temperature = ", temperature, " must be finite and > 0"));
    }
    const float inv = 1.0f / temperature;
    for (float& l : logits) l *= inv;
  }

  /// Keeps the tokens whose logit is >= the k-th largest (ties with it included). k <= 0 or k >= vocab: off.
  void apply_top_k(std::span<float> logits, std::int32_t k) {
    if (k <= 0 || static_cast<std::size_t>(k) >= logits.size()) return;
    values_.assign(logits.begin(), logits.end());
    const auto kth = values_.begin() + (k - 1);
    std::nth_element(values_.begin(), kth, values_.end(), std::greater<float>());
    const float threshold = *kth;
    for (float& l : logits) {
      if (l < threshold) l = detail::neg_inf;
    }
  }

  /// Nucleus: keeps the most likely tokens, in order, until their probability mass reaches `top_p`
  /// (at least one token; ties with the last kept one are kept). top_p >= 1: off.
  void apply_top_p(std::span<float> logits, float top_p) {
    if (top_p >= 1.0f) return;
    const float mx = detail::checked_max(logits, "apply_top_p");
    candidates_.clear();
    double total = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] == detail::neg_inf) continue;
      candidates_.emplace_back(logits[i], static_cast<std::int32_t>(i));
      total += std::exp(static_cast<double>(logits[i]) - mx);
    }
    const double target = static_cast<double>(top_p) * total * (1.0 - detail::boundary_tolerance);
    auto higher = [](const Candidate& a, const Candidate& b) { return a.first > b.first; };
    // Sort only a head of the candidates, doubling it until the mass is reached: a peaked distribution
    // (the usual case) needs a few dozen tokens, not a sort of the whole vocabulary.
    float cutoff = mx;
    double mass = 0.0;
    std::size_t done = 0;
    std::size_t chunk = 64;
    bool reached = false;
    while (!reached && done < candidates_.size()) {
      const std::size_t end = std::min(candidates_.size(), done + chunk);
      const auto first = candidates_.begin() + static_cast<std::ptrdiff_t>(done);
      const auto last = candidates_.begin() + static_cast<std::ptrdiff_t>(end);
      if (end < candidates_.size()) std::nth_element(first, last, candidates_.end(), higher);
      std::sort(first, last, higher);
      for (std::size_t j = done; j < end; ++j) {
        mass += std::exp(static_cast<double>(candidates_[j].first) - mx);
        cutoff = candidates_[j].first;
        if (mass >= target) {
          reached = true;
          break;
        }
      }
      done = end;
      chunk *= 2;
    }
    for (float& l : logits) {
      if (l < cutoff) l = detail::neg_inf;
    }
  }

  /// Drops tokens whose probability is below `min_p` × the largest probability (a boundary token is
  /// kept). Compared in log space, so no softmax is needed. min_p <= 0: off.
  static void apply_min_p(std::span<float> logits, float min_p) {
    if (!(min_p > 0.0f)) return;
    const float mx = detail::checked_max(logits, "apply_min_p");
    const double log_threshold = std::log(static_cast<double>(min_p)) + std::log1p(-detail::boundary_tolerance);
    for (float& l : logits) {
      if (static_cast<double>(l) - static_cast<double>(mx) < log_threshold) l = detail::neg_inf;
    }
  }

 private:
  using Candidate = std::pair<float, std::int32_t>;

  static void check_id(std::span<const float> logits, std::int32_t id, const char* what) {
    if (id < 0 || static_cast<std::size_t>(id) >= logits.size()) {
      throw InvalidArgument(detail::cat("LogitsProcessor: ", what, " token id ", id,
                                        " is out of range; the logits have ", logits.size(), " entries"));
    }
  }

  std::vector<std::int32_t> counts_;  ///< per-token output count (-1: prompt only); all zero between calls
  std::vector<std::int32_t> touched_;
  std::vector<float> values_;
  std::vector<Candidate> candidates_;
};

}  // namespace infer
