#pragma once
/// \file
/// `Tokenizer::from_gguf`: the vocabulary a GGUF file carries in its `tokenizer.*` metadata, as
/// llama.cpp writes it. Kept apart from tokenizer.hpp so that only code reading GGUF files depends on
/// the GGUF reader.
///
/// Keys read: `tokenizer.ggml.model` (must be "gpt2", i.e. byte-level BPE — "llama" is SentencePiece and
/// is refused with UnsupportedError), `.tokens`, `.token_type`, `.merges` ("a b" strings), `.pre` (the
/// pre-tokenizer name, see PreTokenizer::from_gguf_name; absent = "default"), `.bos_token_id`,
/// `.eos_token_id`, `.unknown_token_id`, `.padding_token_id`, `.add_bos_token` (absent = false), and
/// `tokenizer.chat_template`.
///
/// Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
/// (0 = undefined is read as normal). Control tokens become special added tokens and user-defined ones
/// non-special added tokens: both are matched verbatim in the input, as HF does with added tokens.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/io/gguf.hpp"
#include "infer/tokenizer/tokenizer.hpp"

namespace infer {

namespace detail {

/// The `tokenizer.*` metadata of a GGUF file as plain values, before validation.
struct GgufVocab {
  std::string source;  ///< names the file in messages
  std::string model;
  std::vector<std::string> tokens;
  std::vector<std::int64_t> token_types;  ///< empty: all normal
  std::vector<std::string> merges;
  std::optional<std::string> pre;
  std::optional<std::int64_t> bos_id, eos_id, unknown_id, padding_id;
  std::optional<bool> add_bos;
  std::string chat_template;
};

inline GgufVocab read_gguf_vocab(const gguf::File& file) {
  GgufVocab v;
  v.source = cat("GGUF '", file.source(), "'");
  v.model = file.get<std::string>("tokenizer.ggml.model");
  if (v.model != "gpt2") {
    const char* hint = v.model == "llama" ? " (SentencePiece)" : "";
    throw UnsupportedError(cat(v.source, ": tokenizer.ggml.model is '", v.model, "'", hint,
                               "; only 'gpt2' (byte-level BPE) tokenizers are supported"));
  }
  v.tokens = file.get_strings("tokenizer.ggml.tokens");
  if (file.find("tokenizer.ggml.token_type")) v.token_types = file.get_ints("tokenizer.ggml.token_type");
  v.merges = file.get_strings("tokenizer.ggml.merges");
  v.pre = file.get_optional<std::string>("tokenizer.ggml.pre");
  v.bos_id = file.get_optional<std::int64_t>("tokenizer.ggml.bos_token_id");
  v.eos_id = file.get_optional<std::int64_t>("tokenizer.ggml.eos_token_id");
  v.unknown_id = file.get_optional<std::int64_t>("tokenizer.ggml.unknown_token_id");
  v.padding_id = file.get_optional<std::int64_t>("tokenizer.ggml.padding_token_id");
  v.add_bos = file.get_optional<bool>("tokenizer.ggml.add_bos_token");
  v.chat_template = file.get_optional<std::string>("tokenizer.chat_template").value_or("");
  return v;
}

inline TokenizerSpec spec_from_gguf_vocab(GgufVocab v) {
  TokenizerSpec spec;
  spec.source = v.source;
  const std::size_t n = v.tokens.size();
  if (n == 0) throw TokenizerError(cat(v.source, ": tokenizer.ggml.tokens is empty"));
  if (n > 0x7fffffff) throw TokenizerError(cat(v.source, ": tokenizer.ggml.tokens has too many entries (", n, ")"));
  if (!v.token_types.empty() && v.token_types.size() != n) {
    throw TokenizerError(cat(v.source, ": tokenizer.ggml.token_type has ", v.token_types.size(),
                             " entries but tokenizer.ggml.tokens has ", n));
  }
  for (std::size_t i = 0; i < v.token_types.size(); ++i) {
    const std::int64_t t = v.token_types[i];
    if (t < 0 || t > 6) {
      throw TokenizerError(cat(v.source, ": tokenizer.ggml.token_type[", i, "] = ", t, " for token '", v.tokens[i],
                               "' is not a known type (0-6)"));
    }
    if (t == 3 || t == 4) {
      if (v.tokens[i].empty()) {
        throw TokenizerError(cat(v.source, ": ", t == 3 ? "control" : "user-defined", " token ", i, " is empty"));
      }
      spec.added_tokens.push_back(AddedToken{static_cast<std::int32_t>(i), v.tokens[i], t == 3});
    }
  }
  spec.merges.reserve(v.merges.size());
  for (std::size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& s = v.merges[r];
    const auto sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos) {
      throw TokenizerError(cat(v.source, ": tokenizer.ggml.merges[", r, "] '", s,
                               "' is not two tokens separated by one space"));
    }
    spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  spec.pre_tokenizer = PreTokenizer::from_gguf_name(v.pre.value_or("default"));
  // llama.cpp (and HF's Llama-3 tokenizer.json) look whole words up before merging.
  spec.ignore_merges = spec.pre_tokenizer.kind() == PreTokenizerKind::llama3;

  auto id = [&](const std::optional<std::int64_t>& x, const char* key) -> std::optional<std::int32_t> {
    if (!x) return std::nullopt;
    if (*x < 0 || static_cast<std::uint64_t>(*x) >= n) {
      throw TokenizerError(cat(v.source, ": ", key, " = ", *x, " is out of range (the vocabulary has ", n, " tokens)"));
    }
    return static_cast<std::int32_t>(*x);
  };
  spec.bos_id = id(v.bos_id, "tokenizer.ggml.bos_token_id");
  spec.eos_id = id(v.eos_id, "tokenizer.ggml.eos_token_id");
  spec.unknown_id = id(v.unknown_id, "tokenizer.ggml.unknown_token_id");
  spec.padding_id = id(v.padding_id, "tokenizer.ggml.padding_token_id");
  spec.add_bos = v.add_bos.value_or(false);
  if (spec.add_bos && !spec.bos_id) {
    throw TokenizerError(cat(v.source, ": tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing"));
  }
  spec.chat_template = std::move(v.chat_template);
  spec.tokens = std::move(v.tokens);
  return spec;
}

}  // namespace detail

inline Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  return Tokenizer(detail::spec_from_gguf_vocab(detail::read_gguf_vocab(file)));
}

}  // namespace infer
