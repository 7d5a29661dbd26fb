#pragma once
/// \file
/// `infer::Tokenizer`: byte-level BPE text ↔ ids, as GPT-2, SmolLM2, Llama-3 and Qwen2 use it.
///
/// Encoding runs in four steps, the same as HF `tokenizers`:
///  1. added/special tokens are cut out of the text first (leftmost, then longest match), so
///     "<|im_start|>" becomes one id instead of being spelled out;
///  2. each stretch between them is split into words by the regex pre-tokenizer;
///  3. each word's bytes are mapped to the byte-level alphabet (byte_level.hpp);
///  4. BPE merges each word (bpe.hpp).
/// Decoding concatenates the tokens' bytes and repairs invalid UTF-8 with U+FFFD.
///
/// A Tokenizer is immutable after construction (only the BPE word cache changes, under a lock), copies
/// share their tables, and every member function may be called from many threads at once.
///
/// Loaders: `from_hf_json` (tokenizer.json, see hf_json.hpp) here; `from_gguf` is declared here but
/// defined in gguf_vocab.hpp, so only code that reads GGUF files depends on the GGUF reader — include
/// "infer/tokenizer/gguf_vocab.hpp" to call it.

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/tokenizer/bpe.hpp"
#include "infer/tokenizer/byte_level.hpp"
#include "infer/tokenizer/hf_json.hpp"
#include "infer/tokenizer/pretokenizer.hpp"
#include "infer/tokenizer/spec.hpp"
#include "infer/tokenizer/utf8.hpp"

namespace infer {

namespace gguf {
class File;
}

struct EncodeOptions {
  /// Prepend the BOS token; unset = the model's own default (`add_bos_default()`).
  std::optional<bool> add_bos = std::nullopt;
  /// Match special tokens' text as those tokens. False treats it as plain text (what a server should
  /// do with user-supplied content, so a user cannot inject "<|im_end|>").
  bool parse_special = true;
  /// Append the EOS token.
  bool add_eos = false;
};

namespace detail {

/// Leftmost-longest matcher over the added tokens: a byte trie, plus a table of which bytes can start
/// a token so that ordinary text is skipped at one lookup per byte.
class AddedTokenMatcher {
 public:
  void add(std::string_view content, std::int32_t id, bool special) {
    std::int32_t node = 0;
    for (char c : content) {
      const auto b = static_cast<unsigned char>(c);
      std::int32_t child = -1;
      for (const auto& [byte, idx] : nodes_[node].children) {
        if (byte == b) child = idx;
      }
      if (child < 0) {
        child = static_cast<std::int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].id = id;
    nodes_[node].special = special;
    starts_[static_cast<unsigned char>(content[0])] = true;
  }

  struct Match {
    std::size_t length;
    std::int32_t id;
  };

  /// The longest added token starting at `pos` (special ones only when `with_special`).
  [[nodiscard]] std::optional<Match> longest_at(std::string_view text, std::size_t pos, bool with_special) const {
    if (!starts_[static_cast<unsigned char>(text[pos])]) return std::nullopt;
    std::optional<Match> best;
    std::int32_t node = 0;
    for (std::size_t i = pos; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      std::int32_t child = -1;
      for (const auto& [byte, idx] : nodes_[node].children) {
        if (byte == b) child = idx;
      }
      if (child < 0) break;
      node = child;
      if (nodes_[node].id >= 0 && (with_special || !nodes_[node].special)) best = Match{i + 1 - pos, nodes_[node].id};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> children;
    std::int32_t id = -1;
    bool special = false;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> starts_{};
};

inline std::string read_text_file(const std::filesystem::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(cat("cannot open ", what, " '", path.string(), "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError(cat("cannot read ", what, " '", path.string(), "'"));
  return ss.str();
}

}  // namespace detail

class Tokenizer {
 public:
  /// Validates `spec` (TokenizerError names the offending entry) and builds the tables.
  explicit Tokenizer(TokenizerSpec spec) : d_(std::make_shared<Data>(std::move(spec))) {}

  /// Loads an HF tokenizer.json; a tokenizer_config.json next to it, when present, adds the BOS/EOS
  /// tokens, add_bos_token and the chat template.
  static Tokenizer from_hf_json(const std::filesystem::path& path) {
    const std::string json = detail::read_text_file(path, "tokenizer.json");
    const auto config_path = path.parent_path() / "tokenizer_config.json";
    std::string config;
    if (std::filesystem::exists(config_path)) config = detail::read_text_file(config_path, "tokenizer_config.json");
    return Tokenizer(detail::spec_from_hf_json(json, detail::cat("tokenizer.json '", path.string(), "'"), config));
  }

  /// Loads tokenizer.json (and optionally tokenizer_config.json) text held in memory.
  static Tokenizer from_hf_json_string(std::string_view json, std::string_view config_json = {}) {
    return Tokenizer(detail::spec_from_hf_json(json, "tokenizer.json", config_json));
  }

  /// Loads the vocabulary stored in a GGUF file's metadata. Defined in gguf_vocab.hpp.
  inline static Tokenizer from_gguf(const gguf::File& file);

  /// Text → ids. TokenizerError when `text` is not valid UTF-8 (naming the offset), InvalidArgument when
  /// BOS/EOS is asked for and the model has none.
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text, EncodeOptions options = {}) const {
    const std::size_t valid = utf8::valid_prefix_length(text);
    if (valid != text.size()) {
      throw TokenizerError(detail::cat("cannot encode: text is not valid UTF-8 (byte 0x", std::hex,
                                       static_cast<unsigned>(static_cast<unsigned char>(text[valid])), std::dec,
                                       " at offset ", valid, " of ", text.size(), ")"));
    }
    std::vector<std::int32_t> ids;
    ids.reserve(text.size() / 3 + 2);
    if (options.add_bos.value_or(d_->spec.add_bos)) {
      if (!d_->spec.bos_id) throw InvalidArgument("encode: add_bos was requested but this tokenizer has no BOS token");
      ids.push_back(*d_->spec.bos_id);
    }
    std::vector<std::string_view> words;
    auto plain = [&](std::string_view segment) {
      words.clear();
      d_->spec.pre_tokenizer.split(segment, words);
      for (std::string_view w : words) d_->bpe.encode_word(w, ids);
    };
    std::size_t segment_start = 0;
    for (std::size_t pos = 0; pos < text.size();) {
      if (const auto m = d_->added.longest_at(text, pos, options.parse_special)) {
        plain(text.substr(segment_start, pos - segment_start));
        ids.push_back(m->id);
        pos += m->length;
        segment_start = pos;
      } else {
        ++pos;
      }
    }
    plain(text.substr(segment_start));
    if (options.add_eos) {
      if (!d_->spec.eos_id) throw InvalidArgument("encode: add_eos was requested but this tokenizer has no EOS token");
      ids.push_back(*d_->spec.eos_id);
    }
    return ids;
  }

  /// Ids → text. Bytes that do not form valid UTF-8 (a sequence cut off by the last id) become U+FFFD.
  /// InvalidArgument names an id outside [0, vocab_size()).
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const {
    std::string bytes;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      check_id(ids[i], "decode", i);
      if (skip_special && is_special(ids[i])) continue;
      bytes.append(d_->bytes[static_cast<std::size_t>(ids[i])]);
    }
    return utf8::sanitize(bytes);
  }

  /// The raw bytes token `id` stands for (may be part of a UTF-8 sequence). InvalidArgument when out of range.
  [[nodiscard]] const std::string& token_bytes(std::int32_t id) const {
    check_id(id, "token_bytes");
    return d_->bytes[static_cast<std::size_t>(id)];
  }

  /// The vocabulary entry of `id` (byte-level text, e.g. "Ġworld"; added tokens' literal content).
  [[nodiscard]] const std::string& token(std::int32_t id) const {
    check_id(id, "token");
    return d_->spec.tokens[static_cast<std::size_t>(id)];
  }

  /// The id of vocabulary entry `token` (in the form `token()` returns).
  [[nodiscard]] std::optional<std::int32_t> find(std::string_view token) const { return d_->bpe.find(token); }

  [[nodiscard]] bool is_special(std::int32_t id) const noexcept {
    return id >= 0 && static_cast<std::size_t>(id) < d_->special.size() && d_->special[static_cast<std::size_t>(id)];
  }

  [[nodiscard]] std::size_t vocab_size() const noexcept { return d_->spec.tokens.size(); }
  [[nodiscard]] std::optional<std::int32_t> bos_id() const noexcept { return d_->spec.bos_id; }
  [[nodiscard]] std::optional<std::int32_t> eos_id() const noexcept { return d_->spec.eos_id; }
  [[nodiscard]] std::optional<std::int32_t> unknown_id() const noexcept { return d_->spec.unknown_id; }
  [[nodiscard]] std::optional<std::int32_t> padding_id() const noexcept { return d_->spec.padding_id; }
  [[nodiscard]] bool add_bos_default() const noexcept { return d_->spec.add_bos; }
  [[nodiscard]] const std::vector<AddedToken>& added_tokens() const noexcept { return d_->spec.added_tokens; }
  [[nodiscard]] const PreTokenizer& pre_tokenizer() const noexcept { return d_->spec.pre_tokenizer; }
  /// The model's Jinja chat template as stored (empty when it has none); see chat_template.hpp.
  [[nodiscard]] const std::string& chat_template_source() const noexcept { return d_->spec.chat_template; }
  /// Everything it was built from (what an engine file stores to rebuild it).
  [[nodiscard]] const TokenizerSpec& spec() const noexcept { return d_->spec; }

 private:
  struct Data {
    explicit Data(TokenizerSpec s)
        : spec(std::move(s)), bpe(spec.tokens, spec.merges, spec.unknown_id, spec.ignore_merges, spec.source) {
      const std::size_t n = spec.tokens.size();
      if (n == 0) throw TokenizerError(detail::cat(spec.source, ": the vocabulary is empty"));
      auto check = [&](const std::optional<std::int32_t>& id, const char* what) {
        if (id && (*id < 0 || static_cast<std::size_t>(*id) >= n)) {
          throw TokenizerError(detail::cat(spec.source, ": ", what, " id ", *id, " is out of range (vocabulary has ", n,
                                           " tokens)"));
        }
      };
      check(spec.bos_id, "BOS");
      check(spec.eos_id, "EOS");
      check(spec.unknown_id, "unknown-token");
      check(spec.padding_id, "padding");
      special.assign(n, false);
      std::vector<bool> literal(n, false);
      for (const auto& a : spec.added_tokens) {
        check(a.id, "added token");
        if (a.content.empty()) throw TokenizerError(detail::cat(spec.source, ": added token id ", a.id, " is empty"));
        if (spec.tokens[static_cast<std::size_t>(a.id)] != a.content) {
          throw TokenizerError(detail::cat(spec.source, ": added token '", a.content, "' has id ", a.id,
                                           ", whose vocabulary entry is '", spec.tokens[static_cast<std::size_t>(a.id)], "'"));
        }
        if (!utf8::is_valid(a.content)) {
          throw TokenizerError(detail::cat(spec.source, ": added token id ", a.id, " is not valid UTF-8"));
        }
        added.add(a.content, a.id, a.special);
        special[static_cast<std::size_t>(a.id)] = a.special;
        literal[static_cast<std::size_t>(a.id)] = true;
      }
      // Decoding is a table lookup: each token's bytes are computed once.
      bytes.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        bytes[i] = literal[i] ? spec.tokens[i] : byte_level::decode(spec.tokens[i]);
      }
    }

    TokenizerSpec spec;
    detail::BpeModel bpe;
    detail::AddedTokenMatcher added;
    std::vector<bool> special;
    std::vector<std::string> bytes;
  };

  void check_id(std::int32_t id, const char* what, std::optional<std::size_t> index = std::nullopt) const {
    if (id < 0 || static_cast<std::size_t>(id) >= d_->spec.tokens.size()) {
      throw InvalidArgument(detail::cat(what, ": token id ", id,
                                        index ? detail::cat(" (at position ", *index, ")") : std::string(),
                                        " is out of range; the vocabulary has ", d_->spec.tokens.size(), " tokens"));
    }
  }

  std::shared_ptr<const Data> d_;
};

}  // namespace infer
