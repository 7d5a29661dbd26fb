#pragma once
/// \file
/// UTF-8 helpers for the tokenizer: validation (how long the valid prefix is, where the first bad byte
/// sits), code point iteration, encoding, and a streaming sanitizer that turns arbitrary bytes into valid
/// UTF-8. Token bytes are arbitrary (a byte-level BPE token may hold half of an emoji), so every place
/// that hands text to a user goes through `Utf8Sanitizer`: `Tokenizer::decode` and the streaming
/// `IncrementalDecoder` share it, which is what makes their outputs agree byte for byte.
///
/// Invalid input is replaced the way the Unicode standard recommends ("maximal subparts", also what
/// Rust's `String::from_utf8_lossy` and WHATWG do): each maximal prefix of a would-be-valid sequence
/// becomes one U+FFFD, and the byte that broke it starts afresh.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace infer::utf8 {

/// The replacement character U+FFFD, encoded.
inline constexpr std::string_view replacement = "\xEF\xBF\xBD";

/// A decoded code point and how many bytes it took.
struct CodePoint {
  char32_t value;
  std::size_t length;
};

namespace detail {

/// Bytes a sequence with this lead byte has, or 0 when the byte cannot start a sequence
/// (continuation bytes 80-BF, overlong leads C0/C1, and F5-FF which would exceed U+10FFFF).
constexpr std::size_t sequence_length(unsigned char lead) noexcept {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

/// Whether `byte` may follow `lead` as the second byte. The ranges exclude overlong forms (E0, F0),
/// surrogates (ED) and code points past U+10FFFF (F4); later bytes are plain continuation bytes.
constexpr bool valid_second(unsigned char lead, unsigned char byte) noexcept {
  switch (lead) {
    case 0xE0: return byte >= 0xA0 && byte <= 0xBF;
    case 0xED: return byte >= 0x80 && byte <= 0x9F;
    case 0xF0: return byte >= 0x90 && byte <= 0xBF;
    case 0xF4: return byte >= 0x80 && byte <= 0x8F;
    default: return byte >= 0x80 && byte <= 0xBF;
  }
}

constexpr bool is_continuation(unsigned char byte) noexcept { return (byte & 0xC0) == 0x80; }

/// How many bytes from `pos` form a valid sequence's prefix (0 = the lead itself is bad). Returns
/// `need` (the sequence's full length) when complete; fewer when the bytes stop or a byte breaks it.
constexpr std::size_t valid_run(std::string_view s, std::size_t pos, std::size_t& need) noexcept {
  const auto lead = static_cast<unsigned char>(s[pos]);
  need = sequence_length(lead);
  if (need == 0) return 0;
  std::size_t n = 1;
  while (n < need && pos + n < s.size()) {
    const auto b = static_cast<unsigned char>(s[pos + n]);
    if (!(n == 1 ? valid_second(lead, b) : is_continuation(b))) break;
    ++n;
  }
  return n;
}

}  // namespace detail

/// Decodes the code point at `pos`, or nullopt when the bytes there are not a complete valid sequence.
constexpr std::optional<CodePoint> decode(std::string_view s, std::size_t pos) noexcept {
  if (pos >= s.size()) return std::nullopt;
  std::size_t need = 0;
  const std::size_t n = detail::valid_run(s, pos, need);
  if (need == 0 || n != need) return std::nullopt;
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (need == 1) return CodePoint{b0, 1};
  char32_t cp = b0 & (0x7F >> need);
  for (std::size_t i = 1; i < need; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  return CodePoint{cp, need};
}

/// Length in bytes of the longest prefix of `s` that is valid UTF-8.
constexpr std::size_t valid_prefix_length(std::string_view s) noexcept {
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t need = 0;
    const std::size_t n = detail::valid_run(s, pos, need);
    if (need == 0 || n != need) break;
    pos += n;
  }
  return pos;
}

constexpr bool is_valid(std::string_view s) noexcept { return valid_prefix_length(s) == s.size(); }

/// Appends the UTF-8 encoding of `cp` (surrogates and values past U+10FFFF become U+FFFD).
inline void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      out.append(replacement);
      return;
    }
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x110000) {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.append(replacement);
  }
}

/// Streaming bytes → valid UTF-8. `feed` appends every sequence that is complete (or definitely
/// invalid, as U+FFFD) and holds back the bytes of a sequence that may still be completed by later
/// input; `finish` turns what is held into U+FFFD. Feeding bytes in any chunking gives the same text as
/// feeding them at once, which is the property the incremental decoder relies on.
class Utf8Sanitizer {
 public:
  void feed(std::string_view bytes, std::string& out) {
    std::string_view s = bytes;
    std::string joined;
    if (pending_len_ > 0) {
      joined.assign(pending_, pending_len_);
      joined.append(bytes);
      s = joined;
      pending_len_ = 0;
    }
    std::size_t pos = 0;
    while (pos < s.size()) {
      std::size_t need = 0;
      const std::size_t n = detail::valid_run(s, pos, need);
      if (need != 0 && n == need) {
        out.append(s.substr(pos, n));
        pos += n;
      } else if (need != 0 && pos + n == s.size()) {
        // A valid but unfinished sequence at the end: the next token may complete it.
        for (std::size_t i = 0; i < n; ++i) pending_[i] = s[pos + i];
        pending_len_ = n;
        pos += n;
      } else {
        out.append(replacement);
        pos += n == 0 ? 1 : n;  // the byte that broke the sequence is reconsidered as a new start
      }
    }
  }

  void finish(std::string& out) {
    if (pending_len_ > 0) out.append(replacement);
    pending_len_ = 0;
  }

  [[nodiscard]] bool has_pending() const noexcept { return pending_len_ > 0; }
  void reset() noexcept { pending_len_ = 0; }

 private:
  char pending_[4] = {};
  std::size_t pending_len_ = 0;
};

/// Bytes → valid UTF-8 in one go (maximal-subpart replacement).
inline std::string sanitize(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8Sanitizer s;
  s.feed(bytes, out);
  s.finish(out);
  return out;
}

}  // namespace infer::utf8
