#pragma once
/// \file
/// Streaming detokenization: ids go in one at a time as they are generated, and only complete UTF-8
/// comes out. A byte-level token may end in the middle of a character (an emoji is often 2-4 tokens);
/// those bytes are held until the character completes, so a client never receives a broken sequence
/// mid-stream. `flush()` at the end emits what is still held (an unfinished sequence as U+FFFD).
///
/// The decoder uses the same sanitizer as `Tokenizer::decode`, so for any ids the concatenation of
/// every `push` and the final `flush` equals `decode(ids)` exactly. One decoder per stream; it keeps a
/// reference to the tokenizer, which must outlive it.

#include <cstdint>
#include <string>

#include "infer/tokenizer/tokenizer.hpp"
#include "infer/tokenizer/utf8.hpp"

namespace infer {

class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(&tokenizer), skip_special_(skip_special) {}

  /// Adds one id; returns the text that became complete (often empty). InvalidArgument for an id out of
  /// range, in which case the decoder's state is unchanged.
  std::string push(std::int32_t id) {
    std::string out;
    const std::string& bytes = tok_->token_bytes(id);  // validates id
    if (skip_special_ && tok_->is_special(id)) return out;
    sanitizer_.feed(bytes, out);
    return out;
  }

  /// Ends the stream: returns what was held back (U+FFFD for an unfinished sequence) and resets.
  std::string flush() {
    std::string out;
    sanitizer_.finish(out);
    return out;
  }

  /// Whether bytes of an unfinished character are being held.
  [[nodiscard]] bool has_pending() const noexcept { return sanitizer_.has_pending(); }

  [[nodiscard]] const Tokenizer& tokenizer() const noexcept { return *tok_; }

  /// Starts a new stream, dropping anything held.
  void reset() noexcept { sanitizer_.reset(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  utf8::Utf8Sanitizer sanitizer_;
};

}  // namespace infer
