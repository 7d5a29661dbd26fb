#pragma once
/// \file
/// `SamplingParams`: how one request's tokens are chosen and when its generation stops. Field names,
/// meanings and defaults follow vLLM's `SamplingParams` (and so the OpenAI API the server exposes), so a
/// request body maps onto it field by field.
///
/// `validate()` is called where a request enters (the server, the offline API) and again by
/// `StopChecker`; the sampler itself trusts its parameters, because it runs once per token. The limits
/// are at least as strict as vLLM's OpenAI server: a value outside them is almost always a client bug,
/// and rejecting it with a message that names the field is kinder than sampling garbage.

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/tokenizer/utf8.hpp"

namespace infer {

struct SamplingParams {
  /// Largest accepted `n`: each sample is a Sequence holding KV blocks, so a huge n is a denial of service.
  static constexpr std::int32_t max_n = 128;
  static constexpr std::size_t max_stop_strings = 16;
  static constexpr std::size_t max_stop_bytes = 256;
  static constexpr std::int32_t max_logprobs = 20;
  static constexpr std::size_t max_tag_bytes = 256;
  /// Temperatures below this are treated as greedy (as vLLM does): dividing logits by ~1e-7 would
  /// overflow to inf, and the distribution is one-hot to float precision anyway.
  static constexpr float greedy_epsilon = 1e-5f;

  std::int32_t n = 1;                 ///< samples returned for the prompt (each its own sequence)
  float temperature = 1.0f;           ///< 0 = greedy (argmax); higher flattens the distribution
  float top_p = 1.0f;                 ///< nucleus mass kept, in (0, 1]; 1 = off
  std::int32_t top_k = 0;             ///< keep the k most likely tokens; 0 or -1 = off
  float min_p = 0.0f;                 ///< drop tokens less likely than min_p × the most likely; 0 = off
  float repetition_penalty = 1.0f;    ///< HF/CTRL style over prompt and output tokens; 1 = off
  float presence_penalty = 0.0f;      ///< OpenAI: subtracted once from every token already in the output
  float frequency_penalty = 0.0f;     ///< OpenAI: subtracted per occurrence in the output
  std::optional<std::uint64_t> seed;  ///< reproducible sampling for this request; unset = fresh entropy
  std::vector<std::string> stop;      ///< stop strings, matched in the detokenized output
  std::vector<std::int32_t> stop_token_ids;  ///< ids that end generation (in addition to EOS)
  bool ignore_eos = false;            ///< keep generating past the EOS token
  std::int32_t max_tokens = 16;       ///< generated tokens at most (FinishReason::length)
  std::int32_t min_tokens = 0;        ///< EOS / stop ids / stop strings cannot end generation before this
  std::optional<std::int32_t> logprobs;  ///< top logprobs returned per token; 0 = only the sampled token's
  /// vLLM's `prompt_logprobs`: the log-probability of every prompt token given the ones before it
  /// (RequestOutput::prompt_logprobs), what perplexity is computed from. 0 only (each token's own; the top
  /// alternatives of prompt tokens are not computed). Such a request skips the prefix cache's hits: a cached
  /// token is not computed, so its logprob would be missing (vLLM does the same).
  std::optional<std::int32_t> prompt_logprobs;
  bool skip_special_tokens = true;    ///< leave special tokens' text out of the output text
  bool include_stop_str_in_output = false;  ///< keep the matched stop string (or stop token's text)

  // Not sampling but scheduling: carried here so every way a request enters (add_request, infer::LLM,
  // infer-generate's JSONL prompts, a server's request body) brings them to the scheduler unchanged. The
  // engine copies them into each of the request's Sequences.
  /// vLLM's `priority`: lower is served earlier (admitted first, preempted last) by a scheduler that
  /// orders by it — the stock paged engine's PriorityOrder; others ignore it. Any value; 0 by default.
  std::int32_t priority = 0;
  /// A free-form class for a policy of your own to read (e.g. "interactive", "batch"); UTF-8, at most
  /// max_tag_bytes.
  std::string tag;

  /// True when sampling reduces to argmax.
  [[nodiscard]] bool greedy() const noexcept { return temperature < greedy_epsilon; }

  /// Throws InvalidArgument naming the first bad field, its value and the accepted range.
  void validate() const { validate_impl(std::nullopt); }

  /// As `validate()`, and also checks `stop_token_ids` against the model's vocabulary.
  void validate(std::int32_t vocab_size) const {
    if (vocab_size <= 0) {
      throw InvalidArgument(detail::cat("SamplingParams::validate: vocab_size = ", vocab_size, " must be >= 1"));
    }
    validate_impl(vocab_size);
  }

 private:
  /// Checks lo <= v <= hi (with open ends where asked); NaN fails every comparison, so it is caught too,
  /// but named separately because "nan is out of range" reads like a bug in the checker.
  static void check_range(const char* name, float v, float lo, bool lo_open, float hi, const char* range,
                          const char* hint = "") {
    if (!std::isfinite(v)) {
      throw InvalidArgument(detail::cat("SamplingParams: ", name, " = ", v, " is not a finite number; use a value in ",
                                        range, hint));
    }
    const bool lo_ok = lo_open ? v > lo : v >= lo;
    if (!lo_ok || v > hi) {
      throw InvalidArgument(detail::cat("SamplingParams: ", name, " = ", v, " is out of range; use a value in ", range,
                                        hint));
    }
  }

  void validate_impl(std::optional<std::int32_t> vocab_size) const {
    if (n < 1 || n > max_n) {
      throw InvalidArgument(detail::cat("SamplingParams: n = ", n, " is out of range; use a value in [1, ", max_n, "]"));
    }
    check_range("temperature", temperature, 0.0f, false, 2.0f, "[0, 2]", " (0 = greedy)");
    check_range("top_p", top_p, 0.0f, true, 1.0f, "(0, 1]", " (1 = off)");
    if (top_k < -1) {
      throw InvalidArgument(detail::cat("SamplingParams: top_k = ", top_k,
                                        " is out of range; use -1 or 0 (off) or a value >= 1"));
    }
    check_range("min_p", min_p, 0.0f, false, 1.0f, "[0, 1]", " (0 = off)");
    if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
      throw InvalidArgument(detail::cat("SamplingParams: repetition_penalty = ", repetition_penalty,
                                        " is out of range; use a finite value > 0 (1 = off)"));
    }
    check_range("presence_penalty", presence_penalty, -2.0f, false, 2.0f, "[-2, 2]", " (0 = off)");
    check_range("frequency_penalty", frequency_penalty, -2.0f, false, 2.0f, "[-2, 2]", " (0 = off)");
    if (max_tokens < 1) {
      throw InvalidArgument(detail::cat("SamplingParams: max_tokens = ", max_tokens, " is out of range; use a value >= 1"));
    }
    if (min_tokens < 0 || min_tokens > max_tokens) {
      throw InvalidArgument(detail::cat("SamplingParams: min_tokens = ", min_tokens,
                                        " is out of range; use a value in [0, max_tokens] (max_tokens = ", max_tokens, ")"));
    }
    if (stop.size() > max_stop_strings) {
      throw InvalidArgument(detail::cat("SamplingParams: stop has ", stop.size(), " strings; at most ", max_stop_strings,
                                        " are allowed"));
    }
    for (std::size_t i = 0; i < stop.size(); ++i) {
      const std::string& s = stop[i];
      if (s.empty()) throw InvalidArgument(detail::cat("SamplingParams: stop[", i, "] is empty; remove it"));
      if (s.size() > max_stop_bytes) {
        throw InvalidArgument(detail::cat("SamplingParams: stop[", i, "] is ", s.size(), " bytes long; at most ",
                                          max_stop_bytes, " bytes are allowed"));
      }
      // Output text is valid UTF-8, so a stop string that is not could never match; the stop checker
      // also relies on stop strings starting at a character boundary when it holds text back.
      if (!utf8::is_valid(s)) {
        throw InvalidArgument(detail::cat("SamplingParams: stop[", i, "] is not valid UTF-8 (first bad byte at offset ",
                                          utf8::valid_prefix_length(s), ")"));
      }
    }
    for (std::size_t i = 0; i < stop_token_ids.size(); ++i) {
      const std::int32_t id = stop_token_ids[i];
      if (id < 0 || (vocab_size && id >= *vocab_size)) {
        throw InvalidArgument(detail::cat("SamplingParams: stop_token_ids[", i, "] = ", id, " is out of range; use an id in [0, ",
                                          vocab_size ? detail::cat(*vocab_size, ")") : std::string("vocab_size)"),
                                          vocab_size ? detail::cat(" (the vocabulary has ", *vocab_size, " tokens)")
                                                     : std::string()));
      }
    }
    if (tag.size() > max_tag_bytes) {
      throw InvalidArgument(detail::cat("SamplingParams: tag is ", tag.size(), " bytes long; at most ", max_tag_bytes,
                                        " bytes are allowed"));
    }
    if (!utf8::is_valid(tag)) {
      throw InvalidArgument(detail::cat("SamplingParams: tag is not valid UTF-8 (first bad byte at offset ",
                                        utf8::valid_prefix_length(tag), ")"));
    }
    if (prompt_logprobs && *prompt_logprobs != 0)
      throw InvalidArgument(detail::cat("SamplingParams: prompt_logprobs = ", *prompt_logprobs,
                                        " is not supported; use 0 (each prompt token's own logprob)"));
    if (logprobs && (*logprobs < 0 || *logprobs > max_logprobs)) {
      throw InvalidArgument(detail::cat("SamplingParams: logprobs = ", *logprobs, " is out of range; use a value in [0, ",
                                        max_logprobs, "] (0 = only the sampled token's)"));
    }
  }
};

}  // namespace infer
