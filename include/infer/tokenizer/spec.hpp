#pragma once
/// \file
/// `TokenizerSpec`: everything a byte-level BPE tokenizer is made of, as plain data. The loaders
/// (tokenizer.json in hf_json.hpp, GGUF metadata in gguf_vocab.hpp) only translate their format into a
/// spec; `Tokenizer`'s constructor is the one place that validates it and builds the lookup tables. That
/// keeps each loader small and lets tests and users build a tokenizer from values directly.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/tokenizer/pretokenizer.hpp"

namespace infer {

/// A token matched verbatim in the input before pre-tokenization (HF "added token"; GGUF control and
/// user-defined tokens). `special` ones are only matched when encoding with `parse_special`, are
/// skipped by `decode(..., skip_special = true)`, and report `is_special`.
struct AddedToken {
  std::int32_t id = -1;
  std::string content;
  bool special = true;
};

struct TokenizerSpec {
  /// id → token, in the vocabulary's byte-level alphabet (see byte_level.hpp); for added tokens the
  /// entry is their literal content. Every id in [0, size) must be present.
  std::vector<std::string> tokens;
  /// The merge list in rank order (rank = index): "a" + "b" → "ab".
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added_tokens;
  PreTokenizer pre_tokenizer = PreTokenizer::from_kind(PreTokenizerKind::gpt2);
  std::optional<std::int32_t> bos_id, eos_id, unknown_id, padding_id;
  bool add_bos = false;
  /// Llama-3's BPE looks a whole pre-token up in the vocab before merging (HF `ignore_merges`).
  bool ignore_merges = false;
  std::string chat_template;
  /// Where the spec came from ("tokenizer.json '/path'", "GGUF metadata"): prefixes error messages.
  std::string source = "tokenizer spec";
};

}  // namespace infer
