#pragma once
/// \file
/// Regex pre-tokenizers: the step that cuts text into "words" before BPE runs on each word alone.
/// A pre-tokenizer is a sequence of regex splits in HF `tokenizers`' `Split(Regex, Isolated)` sense:
/// every match becomes a piece and so does every non-empty gap between matches; each step re-splits the
/// pieces of the previous one. The named kinds are the ones byte-level models ship with:
///
/// | kind     | steps                                       | used by                      |
/// | -------- | ------------------------------------------- | ---------------------------- |
/// | `gpt2`   | the GPT-2 regex                             | GPT-2, ByteLevel(use_regex)  |
/// | `smollm` | `\p{N}` (each digit alone), then GPT-2      | SmolLM2 (Digits + ByteLevel) |
/// | `llama3` | the Llama-3 regex (digits in runs of ≤ 3)   | Llama-3                      |
/// | `qwen2`  | the Qwen2 regex (single digits)             | Qwen2 / Qwen2.5              |
///
/// PCRE2 is compiled with UTF + UCP (so `\s`, `\p{L}` are Unicode-aware) and JIT where available. The
/// compiled code is immutable and shared; match data is created per call, so one PreTokenizer may be used
/// from any number of threads at once. Input must be valid UTF-8 (the tokenizer checks it once, which
/// lets every match skip PCRE2's own O(n) check — without that, splitting would be quadratic).

#include <pcre2.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/tokenizer/utf8.hpp"

namespace infer {

enum class PreTokenizerKind { gpt2, smollm, llama3, qwen2, custom };

constexpr std::string_view to_string(PreTokenizerKind k) noexcept {
  switch (k) {
    case PreTokenizerKind::gpt2: return "gpt2";
    case PreTokenizerKind::smollm: return "smollm";
    case PreTokenizerKind::llama3: return "llama3";
    case PreTokenizerKind::qwen2: return "qwen2";
    case PreTokenizerKind::custom: return "custom";
  }
  return "?";
}

namespace pretokenizer_patterns {
inline constexpr std::string_view gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view llama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
/// What HF's `Digits(individual_digits=true)` isolates: every character with the Unicode Numeric type.
inline constexpr std::string_view digit = R"(\p{N})";
}  // namespace pretokenizer_patterns

namespace detail {

inline std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  const int n = pcre2_get_error_message(code, buf.data(), buf.size());
  if (n < 0) return cat("PCRE2 error ", code);
  return std::string(reinterpret_cast<const char*>(buf.data()), static_cast<std::size_t>(n));
}

/// One compiled pattern. Shared (copies are cheap) and immutable after construction.
class Regex {
 public:
  explicit Regex(std::string_view pattern) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code == nullptr) {
      throw TokenizerError(cat("pre-tokenizer regex does not compile at offset ", offset, ": ",
                               pcre2_message(err), " (pattern: ", pattern_, ")"));
    }
    // JIT is an optimisation only: where it is unavailable pcre2_match interprets the pattern.
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    code_.reset(code, pcre2_code_free);
  }

  [[nodiscard]] const std::string& pattern() const noexcept { return pattern_; }
  /// Whether PCRE2's JIT compiled the pattern (otherwise matching interprets it: same results, slower).
  [[nodiscard]] bool jit() const noexcept { return jit_; }

  /// Appends the isolated split of `text` (matches and the gaps between them) to `out`.
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    if (!md) throw std::bad_alloc();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    std::size_t last = 0;    // end of the last emitted piece
    std::size_t offset = 0;  // where the next search starts
    while (offset <= text.size()) {
      int rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // Very long runs can exhaust the JIT's machine stack; the interpreter keeps its frames on the heap.
        rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md.get(), nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        throw TokenizerError(cat("pre-tokenizer regex failed at byte ", offset, " of a ", text.size(),
                                 "-byte text: ", pcre2_message(rc), " (pattern: ", pattern_, ")"));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const std::size_t start = ov[0];
      const std::size_t end = ov[1];
      if (end == start) {
        // An empty match emits nothing; step over one code point so the search moves on.
        if (start >= text.size()) break;
        const auto cp = utf8::decode(text, start);
        offset = start + (cp ? cp->length : 1);
        continue;
      }
      if (start > last) out.push_back(text.substr(last, start - last));
      out.push_back(text.substr(start, end - start));
      last = offset = end;
    }
    if (last < text.size()) out.push_back(text.substr(last));
  }

 private:
  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};

}  // namespace detail

/// A sequence of isolated regex splits. Copyable (the compiled patterns are shared) and thread-safe.
class PreTokenizer {
 public:
  /// The patterns a named kind splits by, in order.
  static std::vector<std::string> kind_patterns(PreTokenizerKind kind) {
    namespace p = pretokenizer_patterns;
    switch (kind) {
      case PreTokenizerKind::gpt2: return {std::string(p::gpt2)};
      case PreTokenizerKind::smollm: return {std::string(p::digit), std::string(p::gpt2)};
      case PreTokenizerKind::llama3: return {std::string(p::llama3)};
      case PreTokenizerKind::qwen2: return {std::string(p::qwen2)};
      case PreTokenizerKind::custom: break;
    }
    throw InvalidArgument("PreTokenizer: kind 'custom' has no fixed patterns; use PreTokenizer::from_patterns");
  }

  static PreTokenizer from_kind(PreTokenizerKind kind) { return PreTokenizer(kind, kind_patterns(kind)); }

  /// Maps a GGUF `tokenizer.ggml.pre` name onto a kind; unknown names are a TokenizerError that lists the
  /// known ones (a wrong split silently changes every id, so guessing is worse than refusing).
  static PreTokenizer from_gguf_name(std::string_view name) {
    if (name == "smollm") return from_kind(PreTokenizerKind::smollm);
    if (name == "llama-bpe" || name == "llama3") return from_kind(PreTokenizerKind::llama3);
    if (name == "qwen2") return from_kind(PreTokenizerKind::qwen2);
    if (name == "gpt2" || name == "default") return from_kind(PreTokenizerKind::gpt2);
    throw TokenizerError(detail::cat("unknown pre-tokenizer '", name,
                             "' (tokenizer.ggml.pre); known: smollm, llama-bpe, llama3, qwen2, gpt2, default"));
  }

  /// Splits by each pattern in turn. A sequence equal to a named kind's is reported as that kind.
  static PreTokenizer from_patterns(std::vector<std::string> patterns) {
    for (auto kind : {PreTokenizerKind::gpt2, PreTokenizerKind::smollm, PreTokenizerKind::llama3,
                      PreTokenizerKind::qwen2}) {
      if (kind_patterns(kind) == patterns) return PreTokenizer(kind, std::move(patterns));
    }
    return PreTokenizer(PreTokenizerKind::custom, std::move(patterns));
  }

  [[nodiscard]] PreTokenizerKind kind() const noexcept { return kind_; }

  [[nodiscard]] std::vector<std::string> patterns() const {
    std::vector<std::string> out;
    out.reserve(steps_.size());
    for (const auto& r : steps_) out.push_back(r.pattern());
    return out;
  }

  /// Appends the pieces of `text` (views into it, in order, covering it exactly) to `out`.
  /// Precondition: `text` is valid UTF-8 (see the file comment); the other overload checks it.
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    if (text.empty()) return;
    if (steps_.empty()) {
      out.push_back(text);
      return;
    }
    std::vector<std::string_view> cur{text};
    std::vector<std::string_view> next;
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      std::vector<std::string_view>& dst = (i + 1 == steps_.size()) ? out : next;
      for (std::string_view piece : cur) steps_[i].split(piece, dst);
      if (i + 1 < steps_.size()) {
        cur.swap(next);
        next.clear();
      }
    }
  }

  /// Convenience form; throws TokenizerError when `text` is not valid UTF-8.
  [[nodiscard]] std::vector<std::string> split(std::string_view text) const {
    const std::size_t valid = utf8::valid_prefix_length(text);
    if (valid != text.size()) {
      throw TokenizerError(detail::cat("text is not valid UTF-8: bad byte 0x", std::hex,
                                       static_cast<unsigned>(static_cast<unsigned char>(text[valid])),
                                       std::dec, " at offset ", valid));
    }
    std::vector<std::string_view> views;
    split(text, views);
    return {views.begin(), views.end()};
  }

 private:
  PreTokenizer(PreTokenizerKind kind, std::vector<std::string> patterns) : kind_(kind) {
    steps_.reserve(patterns.size());
    for (const auto& p : patterns) steps_.emplace_back(p);
  }

  PreTokenizerKind kind_;
  std::vector<detail::Regex> steps_;
};

}  // namespace infer
