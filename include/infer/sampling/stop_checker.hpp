#pragma once
/// \file
/// `StopChecker`: decides when one sequence ends and which part of its text may be shown so far.
///
/// It is fed every generated token together with the text that token completed (what
/// `IncrementalDecoder::push` returned), and answers with a finish reason and the text that is now safe
/// to emit. Rules, in this order for each token:
///  1. EOS (unless `ignore_eos`) or a `stop_token_ids` id → FinishReason::stop. The token's own text is
///     dropped unless `include_stop_str_in_output`.
///  2. A stop string in the output text (it may span several tokens) → FinishReason::stop; the text is
///     cut before the stop string, or after it with `include_stop_str_in_output`. If a token completes
///     several, the one that ends first wins (as if text arrived byte by byte), the longer on a tie.
///  3. `max_tokens` tokens generated → FinishReason::length.
/// Rules 1 and 2 apply only to tokens after the first `min_tokens` (the same rule by which `Sampler`
/// masks EOS and stop ids); a stop string that completes within the first `min_tokens` tokens is ignored.
///
/// Streaming: emitted text is never retracted, so a tail of the text that could still grow into a stop
/// string (the longest suffix that is a proper prefix of one) is held back until the next token shows
/// whether it does. With `include_stop_str_in_output` nothing needs holding: the text up to the end of a
/// match is output either way. Invariant: the concatenation of every `emit` and the final `flush()`
/// equals `text()`.
///
/// Use: one checker and one `IncrementalDecoder(tokenizer, params.skip_special_tokens)` per sequence;
/// `push(token, decoder)` after each sampled token, and `flush(decoder)` once the sequence ends for any
/// reason (it returns what was held back, or nothing after a stop).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sampling/sampling_params.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/tokenizer/incremental_decoder.hpp"

namespace infer {

struct StopResult {
  FinishReason reason = FinishReason::none;  ///< none while the sequence goes on
  std::string emit;                          ///< text that became safe to show (often empty)
};

class StopChecker {
 public:
  /// Validates `params` (InvalidArgument, see SamplingParams::validate) and copies what it needs, so the
  /// params may go away. `eos_id` is the tokenizer's EOS, if it has one.
  StopChecker(const SamplingParams& params, std::optional<std::int32_t> eos_id)
      : stop_(params.stop),
        stop_ids_(params.stop_token_ids),
        eos_id_(params.ignore_eos ? std::nullopt : eos_id),
        max_tokens_(params.max_tokens),
        min_tokens_(params.min_tokens),
        include_stop_(params.include_stop_str_in_output) {
    params.validate();
    for (const auto& s : stop_) max_stop_len_ = std::max(max_stop_len_, s.size());
  }

  /// Records `token` (already appended to the sequence) and the text it completed.
  StopResult push(std::int32_t token, std::string_view new_text) {
    if (ended_) {
      throw InvalidArgument(detail::cat("StopChecker::push: the sequence already ended (finish reason '",
                                        to_string(reason_), "'); start a new StopChecker for a new sequence"));
    }
    ++num_tokens_;
    const bool may_stop = num_tokens_ > min_tokens_;
    if (may_stop && is_stop_token(token)) {
      stop_token_ = token;
      if (include_stop_) text_.append(new_text);
      return finish(FinishReason::stop);
    }
    const std::size_t old_size = text_.size();
    text_.append(new_text);
    if (may_stop && cut_at_stop_string(old_size)) return finish(FinishReason::stop);
    if (num_tokens_ >= max_tokens_) return finish(FinishReason::length);
    return StopResult{FinishReason::none, release(hold_from())};
  }

  /// Pushes `token` through `decoder` (InvalidArgument from it for a bad id leaves both unchanged).
  StopResult push(std::int32_t token, IncrementalDecoder& decoder) { return push(token, decoder.push(token)); }

  /// Ends the stream and returns what is still held back. `decoder_tail` is what the decoder's own
  /// `flush()` returned (bytes of an unfinished character); it belongs to the output unless a stop
  /// already ended it. A stop string that the tail completes still cuts the text (and sets the reason to
  /// stop). Calling flush again returns "".
  std::string flush(std::string_view decoder_tail = {}) {
    if (ended_ && reason_ == FinishReason::stop) return {};
    if (flushed_) return {};
    flushed_ = true;
    const std::size_t old_size = text_.size();
    text_.append(decoder_tail);
    if (!ended_ && num_tokens_ > min_tokens_ && cut_at_stop_string(old_size)) reason_ = FinishReason::stop;
    ended_ = true;
    return release(text_.size());
  }

  /// Flushes `decoder` and this checker together.
  std::string flush(IncrementalDecoder& decoder) { return flush(decoder.flush()); }

  [[nodiscard]] bool finished() const noexcept { return reason_ != FinishReason::none; }
  [[nodiscard]] FinishReason reason() const noexcept { return reason_; }
  /// The output text so far (cut at the stop string once one matched), including held-back text.
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  /// Bytes of `text()` already emitted.
  [[nodiscard]] std::size_t emitted() const noexcept { return emitted_; }
  /// Bytes of `text()` held back because they might start a stop string.
  [[nodiscard]] std::size_t held_back() const noexcept { return text_.size() - emitted_; }
  [[nodiscard]] std::int32_t num_tokens() const noexcept { return num_tokens_; }
  /// Which stop string ended the sequence (index into SamplingParams::stop), if one did.
  [[nodiscard]] std::optional<std::size_t> stop_string_index() const noexcept { return stop_string_; }
  /// Which token id (EOS or a stop id) ended the sequence, if one did.
  [[nodiscard]] std::optional<std::int32_t> stop_token() const noexcept { return stop_token_; }

 private:
  [[nodiscard]] bool is_stop_token(std::int32_t token) const noexcept {
    if (eos_id_ && token == *eos_id_) return true;
    return std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
  }

  /// Looks for a stop string that ends in the text appended after `old_size`; on a match cuts `text_`
  /// and records which string it was. Only the last (longest stop - 1) old bytes can be part of a new
  /// match, so the search is bounded by the new text, not the whole output.
  bool cut_at_stop_string(std::size_t old_size) {
    std::size_t best_end = std::string::npos;
    std::size_t best_pos = 0;
    std::size_t best_index = 0;
    // Without include_stop_, no match can start in emitted text: its start would have been held back.
    const std::size_t floor = include_stop_ ? 0 : emitted_;
    for (std::size_t i = 0; i < stop_.size(); ++i) {
      const std::string& s = stop_[i];
      const std::size_t from = std::max(floor, old_size - std::min(old_size, s.size() - 1));
      const std::size_t pos = text_.find(s, from);
      if (pos == std::string::npos) continue;
      const std::size_t end = pos + s.size();
      if (end < best_end || (end == best_end && pos < best_pos)) {
        best_end = end;
        best_pos = pos;
        best_index = i;
      }
    }
    if (best_end == std::string::npos) return false;
    text_.resize(include_stop_ ? best_end : best_pos);
    stop_string_ = best_index;
    return true;
  }

  /// Where the held-back tail starts: the earliest position whose suffix is a proper prefix of a stop
  /// string (so the longest such suffix), or the end of the text when there is none.
  [[nodiscard]] std::size_t hold_from() const {
    const std::size_t size = text_.size();
    if (include_stop_ || max_stop_len_ == 0) return size;
    std::size_t pos = std::max(emitted_, size - std::min(size, max_stop_len_ - 1));
    for (; pos < size; ++pos) {
      const std::size_t tail = size - pos;
      for (const auto& s : stop_) {
        if (s.size() > tail && text_.compare(pos, tail, s, 0, tail) == 0) return pos;
      }
    }
    return size;
  }

  /// Emits text_[emitted_, upto).
  std::string release(std::size_t upto) {
    std::string out = text_.substr(emitted_, upto - emitted_);
    emitted_ = upto;
    return out;
  }

  StopResult finish(FinishReason reason) {
    reason_ = reason;
    ended_ = true;
    return StopResult{reason, release(text_.size())};
  }

  std::vector<std::string> stop_;
  std::vector<std::int32_t> stop_ids_;
  std::optional<std::int32_t> eos_id_;
  std::int32_t max_tokens_;
  std::int32_t min_tokens_;
  bool include_stop_;
  std::size_t max_stop_len_ = 0;

  std::string text_;
  std::size_t emitted_ = 0;
  std::int32_t num_tokens_ = 0;
  FinishReason reason_ = FinishReason::none;
  bool ended_ = false;    ///< finished, or flushed: no more pushes
  bool flushed_ = false;
  std::optional<std::size_t> stop_string_;
  std::optional<std::int32_t> stop_token_;
};

}  // namespace infer
