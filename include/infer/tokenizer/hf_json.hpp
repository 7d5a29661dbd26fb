#pragma once
/// \file
/// HF `tokenizers` tokenizer.json (and, when given, tokenizer_config.json) → `TokenizerSpec`.
///
/// Only what byte-level BPE models use is accepted; anything else is refused by name rather than
/// half-supported, because a tokenizer that is slightly wrong silently changes every id:
/// - model: `BPE` with `vocab` {token: id} and `merges` as "a b" strings or ["a", "b"] pairs;
///   `ignore_merges` and `unk_token` are honoured; a `continuing_subword_prefix`/`end_of_word_suffix`
///   is UnsupportedError.
/// - pre_tokenizer: `ByteLevel` (use_regex → the GPT-2 split), `Split` (Regex or String pattern,
///   behavior Isolated), `Digits`, and `Sequence` of those; at least one ByteLevel must be present.
///   The resulting pattern list is reported as a named kind when it equals one (SmolLM2's
///   Sequence[Digits(individual_digits), ByteLevel] is `smollm`).
/// - normalizer: none or an empty Sequence. `NFC` (Qwen2) is accepted and not applied: text already in
///   NFC (almost all real text) tokenizes identically; decomposed input may differ from HF.
/// - post_processor: a `TemplateProcessing` whose single-sequence template starts with a special token
///   gives the BOS token and add_bos = true (what HF does with add_special_tokens=True).
/// - tokenizer_config.json: bos/eos/unk/pad tokens, add_bos_token, chat_template.
/// Syntax errors and fields of the wrong JSON type are FormatError; inconsistent contents TokenizerError.

#include <nlohmann/json.hpp>

#include <cctype>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/tokenizer/pretokenizer.hpp"
#include "infer/tokenizer/spec.hpp"

namespace infer::detail {

using Json = nlohmann::json;

inline Json parse_json(std::string_view text, std::string_view source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw FormatError(cat(source, " is not valid JSON: ", e.what()));
  }
}

/// The member `key` of `obj` with the JSON type `type`; absent → nullptr; wrong type → FormatError.
inline const Json* member(const Json& obj, const char* key, Json::value_t type, std::string_view where) {
  if (!obj.is_object()) throw FormatError(cat(where, " must be a JSON object"));
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  const bool ok = it->type() == type || (type == Json::value_t::number_integer && it->is_number_integer());
  if (!ok) throw FormatError(cat(where, ".", key, " must be a JSON ", Json(type).type_name(), ", not ", it->type_name()));
  return &*it;
}

inline const Json& required(const Json& obj, const char* key, Json::value_t type, std::string_view where) {
  const Json* v = member(obj, key, type, where);
  if (!v) throw FormatError(cat(where, " has no '", key, "'"));
  return *v;
}

inline bool flag(const Json& obj, const char* key, bool fallback, std::string_view where) {
  const Json* v = member(obj, key, Json::value_t::boolean, where);
  return v ? v->get<bool>() : fallback;
}

/// A pattern that matches `s` literally (PCRE2 syntax).
inline std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

/// Appends the regex steps of one pre-tokenizer node; returns whether a ByteLevel step was seen.
inline bool collect_pretokenizer(const Json& node, std::vector<std::string>& steps, std::string_view where) {
  const std::string type = required(node, "type", Json::value_t::string, where).get<std::string>();
  if (type == "Sequence") {
    const Json& list = required(node, "pretokenizers", Json::value_t::array, where);
    bool byte_level = false;
    for (std::size_t i = 0; i < list.size(); ++i) {
      byte_level |= collect_pretokenizer(list[i], steps, cat(where, ".pretokenizers[", i, "]"));
    }
    return byte_level;
  }
  if (type == "ByteLevel") {
    if (flag(node, "add_prefix_space", false, where)) {
      throw UnsupportedError(cat(where, ": ByteLevel with add_prefix_space=true is not supported"));
    }
    if (flag(node, "use_regex", true, where)) steps.emplace_back(pretokenizer_patterns::gpt2);
    return true;
  }
  if (type == "Digits") {
    steps.emplace_back(flag(node, "individual_digits", false, where) ? std::string(pretokenizer_patterns::digit)
                                                                     : std::string(R"(\p{N}+)"));
    return false;
  }
  if (type == "Split") {
    const Json& pattern = required(node, "pattern", Json::value_t::object, where);
    const std::string behavior =
        member(node, "behavior", Json::value_t::string, where) ? node["behavior"].get<std::string>() : "Isolated";
    if (behavior != "Isolated") {
      throw UnsupportedError(cat(where, ": Split behavior '", behavior, "' is not supported (only Isolated)"));
    }
    if (flag(node, "invert", false, where)) throw UnsupportedError(cat(where, ": Split with invert=true is not supported"));
    const std::string pwhere = cat(where, ".pattern");
    if (const Json* re = member(pattern, "Regex", Json::value_t::string, pwhere)) {
      steps.push_back(re->get<std::string>());
    } else if (const Json* lit = member(pattern, "String", Json::value_t::string, pwhere)) {
      steps.push_back(regex_escape(lit->get<std::string>()));
    } else {
      throw FormatError(cat(pwhere, " has neither 'Regex' nor 'String'"));
    }
    return false;
  }
  throw TokenizerError(cat(where, ": unsupported pre-tokenizer type '", type,
                           "' (supported: ByteLevel, Split, Digits, Sequence)"));
}

inline void check_normalizer(const Json& node, std::string_view where) {
  if (node.is_null()) return;
  const std::string type = required(node, "type", Json::value_t::string, where).get<std::string>();
  if (type == "NFC") return;  // see the file comment
  if (type == "Sequence") {
    const Json& list = required(node, "normalizers", Json::value_t::array, where);
    for (std::size_t i = 0; i < list.size(); ++i) check_normalizer(list[i], cat(where, ".normalizers[", i, "]"));
    return;
  }
  throw UnsupportedError(cat(where, ": normalizer '", type, "' is not supported by this byte-level BPE tokenizer"));
}

/// The token a TemplateProcessing puts first, if it is a special token (the BOS).
inline std::optional<std::string> leading_special(const Json& node, std::string_view where) {
  if (node.is_null() || !node.is_object()) return std::nullopt;
  const Json* type = member(node, "type", Json::value_t::string, where);
  if (!type) return std::nullopt;
  if (*type == "Sequence") {
    if (const Json* list = member(node, "processors", Json::value_t::array, where)) {
      for (const auto& p : *list) {
        if (auto t = leading_special(p, where)) return t;
      }
    }
    return std::nullopt;
  }
  if (*type != "TemplateProcessing") return std::nullopt;
  const Json* single = member(node, "single", Json::value_t::array, where);
  if (!single || single->empty() || !(*single)[0].is_object()) return std::nullopt;
  const auto it = (*single)[0].find("SpecialToken");
  if (it == (*single)[0].end() || !it->is_object()) return std::nullopt;
  const auto id = it->find("id");
  if (id == it->end() || !id->is_string()) return std::nullopt;
  return id->get<std::string>();
}

/// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
inline std::optional<std::string> config_token(const Json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

inline std::int32_t id_of(const TokenizerSpec& spec, const std::string& token, std::string_view what) {
  for (const auto& a : spec.added_tokens) {
    if (a.content == token) return a.id;
  }
  for (std::size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == token) return static_cast<std::int32_t>(i);
  }
  throw TokenizerError(cat(spec.source, ": ", what, " '", token, "' is not a token of the vocabulary"));
}

inline TokenizerSpec spec_from_hf_json(std::string_view json_text, std::string_view source,
                                       std::string_view config_text = {}) {
  TokenizerSpec spec;
  spec.source = std::string(source);
  const Json root = parse_json(json_text, source);
  if (!root.is_object()) throw FormatError(cat(source, " must hold a JSON object"));

  const Json& model = required(root, "model", Json::value_t::object, source);
  const std::string mwhere = cat(source, ": model");
  const Json* type = member(model, "type", Json::value_t::string, mwhere);
  if (type && *type != "BPE") {
    throw UnsupportedError(cat(mwhere, ".type is '", type->get<std::string>(),
                               "'; only byte-level BPE tokenizers are supported"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = member(model, key, Json::value_t::string, mwhere); v && !v->get<std::string>().empty()) {
      throw UnsupportedError(cat(mwhere, ".", key, " is not supported by byte-level BPE"));
    }
  }
  spec.ignore_merges = flag(model, "ignore_merges", false, mwhere);

  // Vocabulary: {token: id}; ids must fill [0, n) once each (n grows with the added tokens below).
  const Json& vocab = required(model, "vocab", Json::value_t::object, mwhere);
  std::vector<bool> seen;
  auto place = [&](std::int64_t id, const std::string& token, std::string_view what, bool allow_same) {
    if (id < 0 || id > 0x7fffffff) throw TokenizerError(cat(source, ": ", what, " '", token, "' has id ", id, ", out of range"));
    const auto i = static_cast<std::size_t>(id);
    if (i >= spec.tokens.size()) {
      spec.tokens.resize(i + 1);
      seen.resize(i + 1, false);
    }
    if (seen[i]) {
      if (allow_same && spec.tokens[i] == token) return;
      throw TokenizerError(cat(source, ": ", what, " '", token, "' has id ", id, ", already taken by '", spec.tokens[i], "'"));
    }
    seen[i] = true;
    spec.tokens[i] = token;
  };
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer()) throw FormatError(cat(mwhere, ".vocab['", it.key(), "'] must be an integer id"));
    place(it->get<std::int64_t>(), it.key(), "vocab token", false);
  }

  // Added tokens (their content usually repeats a vocab entry at the same id).
  if (const Json* added = member(root, "added_tokens", Json::value_t::array, source)) {
    for (std::size_t k = 0; k < added->size(); ++k) {
      const std::string where = cat(source, ": added_tokens[", k, "]");
      const Json& a = (*added)[k];
      AddedToken t;
      t.content = required(a, "content", Json::value_t::string, where).get<std::string>();
      const std::int64_t id = required(a, "id", Json::value_t::number_integer, where).get<std::int64_t>();
      if (t.content.empty()) throw TokenizerError(cat(where, " has empty content"));
      t.special = flag(a, "special", false, where);
      place(id, t.content, "added token", true);
      t.id = static_cast<std::int32_t>(id);
      spec.added_tokens.push_back(std::move(t));
    }
  }
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) throw TokenizerError(cat(source, ": no token has id ", i, " (ids must run from 0 to ", seen.size() - 1, ")"));
  }

  // Merges: "a b" strings (older files) or ["a", "b"] pairs (tokenizers >= 0.20).
  const Json& merges = required(model, "merges", Json::value_t::array, mwhere);
  spec.merges.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const Json& m = merges[r];
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos) {
        throw TokenizerError(cat(mwhere, ".merges[", r, "] '", s, "' is not two tokens separated by one space"));
      }
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      throw FormatError(cat(mwhere, ".merges[", r, "] must be \"a b\" or [\"a\", \"b\"], not ", m.dump()));
    }
  }

  const auto normalizer = root.find("normalizer");
  if (normalizer != root.end()) check_normalizer(*normalizer, cat(source, ": normalizer"));

  const std::string pwhere = cat(source, ": pre_tokenizer");
  const auto pre = root.find("pre_tokenizer");
  std::vector<std::string> steps;
  if (pre == root.end() || pre->is_null() || !collect_pretokenizer(*pre, steps, pwhere)) {
    throw TokenizerError(cat(pwhere, " has no ByteLevel step: this is not a byte-level BPE tokenizer"));
  }
  spec.pre_tokenizer = PreTokenizer::from_patterns(std::move(steps));

  if (const Json* unk = member(model, "unk_token", Json::value_t::string, mwhere)) {
    spec.unknown_id = id_of(spec, unk->get<std::string>(), "model.unk_token");
  }
  const auto post = root.find("post_processor");
  if (post != root.end()) {
    if (auto bos = leading_special(*post, cat(source, ": post_processor"))) {
      spec.bos_id = id_of(spec, *bos, "post_processor's leading special token");
      spec.add_bos = true;
    }
  }

  if (!config_text.empty()) {
    const std::string cwhere = cat(source, "'s tokenizer_config.json");
    const Json config = parse_json(config_text, cwhere);
    if (!config.is_object()) throw FormatError(cat(cwhere, " must hold a JSON object"));
    if (auto t = config_token(config, "bos_token")) spec.bos_id = id_of(spec, *t, "bos_token");
    if (auto t = config_token(config, "eos_token")) spec.eos_id = id_of(spec, *t, "eos_token");
    if (auto t = config_token(config, "unk_token")) spec.unknown_id = id_of(spec, *t, "unk_token");
    if (auto t = config_token(config, "pad_token")) spec.padding_id = id_of(spec, *t, "pad_token");
    spec.add_bos = flag(config, "add_bos_token", spec.add_bos, cwhere);
    const auto tmpl = config.find("chat_template");
    if (tmpl != config.end() && tmpl->is_string()) {
      spec.chat_template = tmpl->get<std::string>();
    } else if (tmpl != config.end() && tmpl->is_array()) {
      // Newer configs list named templates; "default" is the one apply_chat_template uses.
      for (const auto& t : *tmpl) {
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
          spec.chat_template = t["template"].get<std::string>();
        }
      }
    }
  }
  if (spec.add_bos && !spec.bos_id) throw TokenizerError(cat(source, ": add_bos_token is set but no BOS token is named"));
  return spec;
}

}  // namespace infer::detail
