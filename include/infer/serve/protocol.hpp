#pragma once
/// \file
/// OpenAI request bodies → typed requests. `parse_completion_request` and `parse_chat_request` read a
/// JSON body field by field into a `SamplingParams` and the request's prompt or messages, checking each
/// field's type and range on the way, so an error names the field (`ParamError::param()`) and its value.
///
/// The rules are vLLM's OpenAI server's, or stricter: temperature in [0, 2], top_p in (0, 1], min_p in
/// [0, 1], presence/frequency penalties in [-2, 2], repetition_penalty > 0, max_tokens >= 1, n in
/// [1, 128], stop lists of at most 16 strings; fields the server does not know are ignored (clients send
/// `user`, `metadata`, ... freely), while fields it knows but cannot honour (`tools`, `logit_bias`,
/// `suffix`, a JSON `response_format`) are refused rather than silently dropped. JSON `null` means
/// "not given" for every optional field, as in the OpenAI API.
///
/// Nothing here needs a model: the checks that do (token ids against the vocabulary, prompt plus
/// max_tokens against the context) are in `resolve_max_tokens` and the server, once prompts are tokenized.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/sampling/sampling_params.hpp"
#include "infer/serve/api_error.hpp"
#include "infer/tokenizer/chat_template.hpp"

namespace infer::serve {

using nlohmann::json;

/// Limits of a request's shape (beyond SamplingParams' own).
struct RequestLimits {
  static constexpr std::size_t max_prompts = 64;            ///< strings (or id lists) in one completions request
  static constexpr std::size_t max_choices = 256;           ///< prompts × n
  static constexpr std::size_t max_messages = 1024;
  static constexpr std::size_t max_stop_token_ids = 64;
  static constexpr std::size_t max_tokens_in_detokenize = 1 << 20;
};

/// One prompt of a completions request: text to tokenize, or token ids given by the client.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<std::int32_t> ids;  ///< when `text` is absent
};

struct StreamOptions {
  bool include_usage = false;           ///< a last chunk with `usage` (and `"usage": null` on the others)
  bool continuous_usage_stats = false;  ///< vLLM's extension: usage on every chunk
};

/// What both endpoints share.
struct GenerationRequest {
  std::optional<std::string> model;
  SamplingParams params;                 ///< max_tokens is resolved later (see `max_tokens`)
  std::optional<std::int32_t> max_tokens;  ///< as given; the default depends on the endpoint and the prompt
  bool stream = false;
  StreamOptions stream_options;
  bool logprobs = false;                 ///< return logprobs (params.logprobs = how many alternatives)
};

struct CompletionRequest : GenerationRequest {
  std::vector<PromptInput> prompts;
  bool echo = false;  ///< prepend the prompt's text to each choice
};

struct ChatRequest : GenerationRequest {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  ///< vLLM's extension: open the assistant's turn (default true)
};

struct TokenizeRequest {
  std::optional<std::string> model;
  std::optional<std::string> prompt;      ///< either a prompt...
  std::vector<ChatMessage> messages;      ///< ...or messages, rendered by the chat template
  bool add_special_tokens = true;         ///< prompt: BOS as the model says; messages: parse special tokens
  bool add_generation_prompt = true;
  bool return_token_strs = false;
};

struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<std::int32_t> tokens;
};

namespace detail {

inline std::string_view type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

/// A JSON value shortened for a message (a client may send megabytes in a wrong field).
inline std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) {
    s.resize(57);
    s.append("...");
  }
  return s;
}

[[noreturn]] inline void wrong_type(const std::string& name, const json& v, std::string_view expected) {
  throw ParamError(name, infer::detail::cat("'", name, "' must be ", expected, ", got ", type_name(v), " (", shown(v), ")"));
}

[[noreturn]] inline void out_of_range(const std::string& name, const std::string& value, std::string_view range) {
  throw ParamError(name, infer::detail::cat("'", name, "' = ", value, " is out of range; use a value in ", range));
}

std::int64_t as_integer(const json& v, const std::string& name, std::int64_t lo, std::int64_t hi, std::string_view range);

/// Reads the fields of one JSON object; a missing field and `null` are both "not given".
class Fields {
 public:
  explicit Fields(const json& obj, std::string prefix = {}) : obj_(obj), prefix_(std::move(prefix)) {}

  [[nodiscard]] std::string name(std::string_view field) const { return prefix_ + std::string(field); }

  [[nodiscard]] const json* get(std::string_view field) const {
    auto it = obj_.find(field);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  [[nodiscard]] std::optional<std::string> string(std::string_view field) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(name(field), *v, "a string");
    return v->get<std::string>();
  }

  [[nodiscard]] std::optional<bool> boolean(std::string_view field) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(name(field), *v, "a boolean");
    return v->get<bool>();
  }

  /// A finite number (integers accepted) in [lo, hi]; `lo_open` makes the lower end exclusive.
  [[nodiscard]] std::optional<double> number(std::string_view field, double lo, double hi, bool lo_open,
                                             std::string_view range) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(name(field), *v, "a number");
    const double d = v->get<double>();
    const bool lo_ok = lo_open ? d > lo : d >= lo;
    if (!std::isfinite(d) || !lo_ok || d > hi) out_of_range(name(field), shown(*v), range);
    return d;
  }

  /// An integer in [lo, hi]. A float with an integral value (2.0) is accepted, as pydantic does.
  [[nodiscard]] std::optional<std::int64_t> integer(std::string_view field, std::int64_t lo, std::int64_t hi,
                                                    std::string_view range) const {
    const json* v = get(field);
    if (!v) return std::nullopt;
    return as_integer(*v, name(field), lo, hi, range);
  }

  [[nodiscard]] const json& object() const noexcept { return obj_; }

 private:
  const json& obj_;
  std::string prefix_;
};

inline std::int64_t as_integer(const json& v, const std::string& name, std::int64_t lo, std::int64_t hi,
                               std::string_view range) {
  if (v.is_number_unsigned()) {
    // A parsed non-negative number is unsigned in nlohmann::json, so the lower bound matters here too.
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi) || (lo > 0 && u < static_cast<std::uint64_t>(lo)))
      out_of_range(name, shown(v), range);
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    if (i < lo || i > hi) out_of_range(name, shown(v), range);
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) wrong_type(name, v, "an integer");
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) out_of_range(name, shown(v), range);
    return static_cast<std::int64_t>(d);
  }
  wrong_type(name, v, "an integer");
}

inline std::int32_t as_token_id(const json& v, const std::string& name) {
  return static_cast<std::int32_t>(
      as_integer(v, name, 0, std::numeric_limits<std::int32_t>::max(), "[0, vocab_size)"));
}

inline std::vector<std::int32_t> token_list(const json& arr, const std::string& name) {
  std::vector<std::int32_t> ids;
  ids.reserve(arr.size());
  for (std::size_t i = 0; i < arr.size(); ++i) ids.push_back(as_token_id(arr[i], infer::detail::cat(name, "[", i, "]")));
  return ids;
}

inline const json& require_object(const json& body) {
  if (!body.is_object()) {
    throw ParamError("body", infer::detail::cat("the request body must be a JSON object, got ", type_name(body)));
  }
  return body;
}

/// `stop`: a string or a list of strings (SamplingParams checks count, length and UTF-8 validity too,
/// but the messages here name the request field).
inline std::vector<std::string> stop_list(const Fields& f) {
  const json* v = f.get("stop");
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > SamplingParams::max_stop_strings) {
      throw ParamError("stop", infer::detail::cat("'stop' has ", v->size(), " strings; at most ",
                                                  SamplingParams::max_stop_strings, " are allowed"));
    }
    for (std::size_t i = 0; i < v->size(); ++i) {
      const json& s = (*v)[i];
      if (!s.is_string()) wrong_type(infer::detail::cat("stop[", i, "]"), s, "a string");
      out.push_back(s.get<std::string>());
    }
  } else {
    wrong_type("stop", *v, "a string or an array of strings");
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::string n = v->is_string() ? std::string("stop") : infer::detail::cat("stop[", i, "]");
    if (out[i].empty()) throw ParamError(n, infer::detail::cat("'", n, "' is empty; remove it"));
    if (out[i].size() > SamplingParams::max_stop_bytes)
      throw ParamError(n, infer::detail::cat("'", n, "' is ", out[i].size(), " bytes long; at most ",
                                             SamplingParams::max_stop_bytes, " are allowed"));
    if (!utf8::is_valid(out[i])) throw ParamError(n, infer::detail::cat("'", n, "' is not valid UTF-8"));
  }
  return out;
}

/// The sampling fields both endpoints share, checked one by one.
inline void parse_common(const Fields& f, GenerationRequest& r) {
  using infer::detail::cat;
  SamplingParams& p = r.params;
  r.model = f.string("model");
  if (auto v = f.number("temperature", 0.0, 2.0, false, "[0, 2] (0 = greedy)")) p.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0.0, 1.0, true, "(0, 1]")) p.top_p = static_cast<float>(*v);
  if (auto v = f.integer("top_k", -1, std::numeric_limits<std::int32_t>::max(), "-1 or 0 (off), or >= 1"))
    p.top_k = static_cast<std::int32_t>(*v);
  if (auto v = f.number("min_p", 0.0, 1.0, false, "[0, 1]")) p.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0, false, "[-2, 2]")) p.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0, false, "[-2, 2]")) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 0.0, std::numeric_limits<float>::max(), true, "(0, inf) (1 = off)"))
    p.repetition_penalty = static_cast<float>(*v);
  if (auto v = f.integer("n", 1, SamplingParams::max_n, cat("[1, ", SamplingParams::max_n, "]")))
    p.n = static_cast<std::int32_t>(*v);
  if (auto v = f.integer("seed", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                         "the 64-bit integers"))
    p.seed = static_cast<std::uint64_t>(*v);
  // vLLM's `priority` (lower is served earlier by the paged engine's priority scheduler; 0 by default) and
  // infer's `tag` (a label a research policy or the step trace may read; never shown to the model).
  if (auto v = f.integer("priority", std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max(),
                         "the 32-bit integers (lower is served earlier)"))
    p.priority = static_cast<std::int32_t>(*v);
  if (auto v = f.string("tag")) {
    if (v->size() > SamplingParams::max_tag_bytes)
      throw ParamError("tag", cat("'tag' is ", v->size(), " bytes long; at most ", SamplingParams::max_tag_bytes,
                                  " are allowed"));
    if (!utf8::is_valid(*v)) throw ParamError("tag", "'tag' is not valid UTF-8");
    p.tag = std::move(*v);
  }
  p.stop = stop_list(f);
  if (const json* v = f.get("stop_token_ids")) {
    if (!v->is_array()) wrong_type("stop_token_ids", *v, "an array of token ids");
    if (v->size() > RequestLimits::max_stop_token_ids)
      throw ParamError("stop_token_ids", cat("'stop_token_ids' has ", v->size(), " ids; at most ",
                                             RequestLimits::max_stop_token_ids, " are allowed"));
    p.stop_token_ids = token_list(*v, "stop_token_ids");
  }
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = f.boolean("skip_special_tokens")) p.skip_special_tokens = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) p.include_stop_str_in_output = *v;
  if (auto v = f.boolean("stream")) r.stream = *v;
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", *so, "an object");
    if (!r.stream)
      throw ParamError("stream_options", "'stream_options' is only allowed when 'stream' is true");
    Fields sf(*so, "stream_options.");
    r.stream_options.include_usage = sf.boolean("include_usage").value_or(false);
    r.stream_options.continuous_usage_stats = sf.boolean("continuous_usage_stats").value_or(false);
  }
  if (const json* lb = f.get("logit_bias")) {
    if (!lb->is_object()) wrong_type("logit_bias", *lb, "an object");
    if (!lb->empty()) throw ParamError("logit_bias", "'logit_bias' is not supported by this server");
  }
  if (const json* tools = f.get("tools")) {
    if (!tools->is_array()) wrong_type("tools", *tools, "an array");
    if (!tools->empty()) throw ParamError("tools", "'tools' (function calling) is not supported by this server");
  }
  if (const json* rf = f.get("response_format")) {
    if (!rf->is_object()) wrong_type("response_format", *rf, "an object");
    const auto type = Fields(*rf, "response_format.").string("type");
    if (type && *type != "text")
      throw ParamError("response_format.type", cat("'response_format.type' = \"", *type,
                                                   "\" is not supported by this server; only \"text\" is"));
  }
}

/// max_tokens and min_tokens: `max_field` is max_tokens, or for chat max_completion_tokens (which wins).
inline void parse_lengths(const Fields& f, GenerationRequest& r, bool chat) {
  using infer::detail::cat;
  constexpr auto big = std::numeric_limits<std::int32_t>::max();
  if (auto v = f.integer("max_tokens", 1, big, ">= 1")) r.max_tokens = static_cast<std::int32_t>(*v);
  if (chat)
    if (auto v = f.integer("max_completion_tokens", 1, big, ">= 1")) r.max_tokens = static_cast<std::int32_t>(*v);
  if (auto v = f.integer("min_tokens", 0, big, ">= 0 and <= max_tokens")) {
    r.params.min_tokens = static_cast<std::int32_t>(*v);
    if (r.max_tokens && r.params.min_tokens > *r.max_tokens)
      throw ParamError("min_tokens", cat("'min_tokens' = ", *v, " is more than 'max_tokens' = ", *r.max_tokens));
  }
}

inline std::vector<PromptInput> parse_prompts(const Fields& f) {
  using infer::detail::cat;
  const json* v = f.get("prompt");
  if (!v) throw ParamError("prompt", "'prompt' is required: a string, a list of strings, or token ids");
  std::vector<PromptInput> out;
  if (v->is_string()) {
    out.push_back({v->get<std::string>(), {}});
  } else if (v->is_array()) {
    if (v->empty()) throw ParamError("prompt", "'prompt' is an empty list; give at least one prompt");
    const json& first = v->front();
    if (first.is_number()) {  // one prompt as token ids
      out.push_back({std::nullopt, token_list(*v, "prompt")});
    } else {
      if (v->size() > RequestLimits::max_prompts)
        throw ParamError("prompt", cat("'prompt' has ", v->size(), " prompts; at most ", RequestLimits::max_prompts,
                                       " are allowed in one request"));
      for (std::size_t i = 0; i < v->size(); ++i) {
        const json& e = (*v)[i];
        const std::string n = cat("prompt[", i, "]");
        if (e.is_string()) out.push_back({e.get<std::string>(), {}});
        else if (e.is_array()) out.push_back({std::nullopt, token_list(e, n)});
        else wrong_type(n, e, "a string or a list of token ids");
      }
    }
  } else {
    wrong_type("prompt", *v, "a string, a list of strings, or a list of token ids");
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!out[i].text && out[i].ids.empty())
      throw ParamError(out.size() == 1 ? "prompt" : cat("prompt[", i, "]"), "a token-id prompt must not be empty");
  }
  return out;
}

/// `content`: a string, or a list of parts of which only {"type": "text", "text": ...} is supported.
inline std::string message_content(const json& m, const std::string& name, bool may_be_null) {
  using infer::detail::cat;
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    if (may_be_null) return {};
    throw ParamError(name + ".content", cat("'", name, ".content' is required"));
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) wrong_type(name + ".content", *it, "a string or a list of content parts");
  std::string text;
  for (std::size_t j = 0; j < it->size(); ++j) {
    const json& part = (*it)[j];
    const std::string pn = cat(name, ".content[", j, "]");
    if (!part.is_object()) wrong_type(pn, part, "an object");
    Fields pf(part, pn + ".");
    const auto type = pf.string("type");
    if (!type) throw ParamError(pn + ".type", cat("'", pn, ".type' is required"));
    if (*type != "text")
      throw ParamError(pn + ".type", cat("'", pn, ".type' = \"", *type, "\" is not supported; only \"text\" parts are"));
    const auto t = pf.string("text");
    if (!t) throw ParamError(pn + ".text", cat("'", pn, ".text' is required"));
    text += *t;
  }
  return text;
}

inline std::vector<ChatMessage> parse_messages(const json& v) {
  using infer::detail::cat;
  if (!v.is_array()) wrong_type("messages", v, "an array of messages");
  if (v.empty()) throw ParamError("messages", "'messages' is empty; give at least one message");
  if (v.size() > RequestLimits::max_messages)
    throw ParamError("messages", cat("'messages' has ", v.size(), " messages; at most ", RequestLimits::max_messages,
                                     " are allowed"));
  std::vector<ChatMessage> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string name = cat("messages[", i, "]");
    if (!m.is_object()) wrong_type(name, m, "an object with 'role' and 'content'");
    const auto role = Fields(m, name + ".").string("role");
    if (!role) throw ParamError(name + ".role", cat("'", name, ".role' is required"));
    std::string r = *role;
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant")
      throw ParamError(name + ".role", cat("'", name, ".role' = \"", *role,
                                           "\" is not supported; use system, developer, user or assistant"));
    out.push_back({r, message_content(m, name, r == "assistant")});
  }
  return out;
}

}  // namespace detail

/// A request body as one JSON document; ParamError("body") otherwise. nlohmann's parser takes a NUL byte
/// for the end of its input (a C string's end) and would ignore whatever follows it, so a body with a NUL
/// is refused here: JSON text has none outside its strings, and inside them it must be escaped.
inline json parse_json_body(std::string_view body) {
  if (const auto nul = body.find('\0'); nul != std::string_view::npos)
    throw ParamError("body", infer::detail::cat("the request body is not valid JSON: a NUL byte at offset ", nul));
  try {
    return json::parse(body);
  } catch (const json::parse_error& e) {
    throw ParamError("body", infer::detail::cat("the request body is not valid JSON: ", e.what()));
  }
}

/// A POST /v1/completions body. ParamError names the first bad field.
inline CompletionRequest parse_completion_request(const json& body) {
  using infer::detail::cat;
  const detail::Fields f(detail::require_object(body));
  CompletionRequest r;
  detail::parse_common(f, r);
  detail::parse_lengths(f, r, /*chat=*/false);
  r.prompts = detail::parse_prompts(f);
  r.echo = f.boolean("echo").value_or(false);
  if (auto v = f.integer("logprobs", 0, SamplingParams::max_logprobs, cat("[0, ", SamplingParams::max_logprobs, "]"))) {
    r.logprobs = true;
    r.params.logprobs = static_cast<std::int32_t>(*v);
  }
  if (auto v = f.integer("best_of", 1, SamplingParams::max_n, cat("[1, ", SamplingParams::max_n, "]"));
      v && *v != r.params.n)
    throw ParamError("best_of", cat("'best_of' = ", *v, " is not supported; only best_of = n (", r.params.n, ") is"));
  if (auto s = f.string("suffix"); s && !s->empty())
    throw ParamError("suffix", "'suffix' is not supported by this server");
  if (r.echo && r.logprobs) throw ParamError("echo", "'echo' together with 'logprobs' is not supported by this server");
  if (r.prompts.size() * static_cast<std::size_t>(r.params.n) > RequestLimits::max_choices)
    throw ParamError("n", cat(r.prompts.size(), " prompts × n = ", r.params.n, " would make ",
                              r.prompts.size() * static_cast<std::size_t>(r.params.n), " choices; at most ",
                              RequestLimits::max_choices, " are allowed"));
  return r;
}

/// A POST /v1/chat/completions body.
inline ChatRequest parse_chat_request(const json& body) {
  using infer::detail::cat;
  const detail::Fields f(detail::require_object(body));
  ChatRequest r;
  detail::parse_common(f, r);
  detail::parse_lengths(f, r, /*chat=*/true);
  const json* m = f.get("messages");
  if (!m) throw ParamError("messages", "'messages' is required");
  r.messages = detail::parse_messages(*m);
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  r.logprobs = f.boolean("logprobs").value_or(false);
  if (auto v = f.integer("top_logprobs", 0, SamplingParams::max_logprobs,
                         cat("[0, ", SamplingParams::max_logprobs, "]"))) {
    if (!r.logprobs) throw ParamError("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    r.params.logprobs = static_cast<std::int32_t>(*v);
  } else if (r.logprobs) {
    r.params.logprobs = 0;
  }
  return r;
}

inline TokenizeRequest parse_tokenize_request(const json& body) {
  const detail::Fields f(detail::require_object(body));
  TokenizeRequest r;
  r.model = f.string("model");
  r.prompt = f.string("prompt");
  if (const json* m = f.get("messages")) r.messages = detail::parse_messages(*m);
  if (r.prompt.has_value() == !r.messages.empty())
    throw ParamError(r.prompt ? "messages" : "prompt", "give exactly one of 'prompt' (a string) or 'messages'");
  r.add_special_tokens = f.boolean("add_special_tokens").value_or(true);
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  r.return_token_strs = f.boolean("return_token_strs").value_or(false);
  return r;
}

inline DetokenizeRequest parse_detokenize_request(const json& body) {
  const detail::Fields f(detail::require_object(body));
  DetokenizeRequest r;
  r.model = f.string("model");
  const json* t = f.get("tokens");
  if (!t) throw ParamError("tokens", "'tokens' is required: a list of token ids");
  if (!t->is_array()) detail::wrong_type("tokens", *t, "a list of token ids");
  if (t->size() > RequestLimits::max_tokens_in_detokenize)
    throw ParamError("tokens", infer::detail::cat("'tokens' has ", t->size(), " ids; at most ",
                                                  RequestLimits::max_tokens_in_detokenize, " are allowed"));
  r.tokens = detail::token_list(*t, "tokens");
  return r;
}

/// Checks token ids against the vocabulary; `param` is the request field they came from.
inline void check_token_ids(const std::vector<std::int32_t>& ids, std::int64_t vocab_size, const std::string& param) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab_size)
      throw ParamError(param, infer::detail::cat("'", param, "[", i, "]' = ", ids[i],
                                                 " is out of range; the vocabulary has ", vocab_size, " tokens"));
}

/// The max_tokens a request runs with, and the context check vLLM makes (with both numbers in the
/// message). Completions default to 16 tokens (OpenAI's default); chat to whatever the context leaves,
/// capped by what the engine can ever produce (`engine_max_output`: a static engine's slot size).
inline std::int32_t resolve_max_tokens(const GenerationRequest& r, bool chat, std::int64_t prompt_tokens,
                                       std::int32_t max_model_len, std::int32_t engine_max_output) {
  using infer::detail::cat;
  const char* what = chat ? "messages" : "prompt";
  if (prompt_tokens >= max_model_len)
    throw ParamError(what, cat("This model's maximum context length is ", max_model_len, " tokens. However, your ",
                               what, " has ", prompt_tokens, " tokens, which leaves no room for the completion. "
                               "Please shorten the ", what, "."));
  std::int32_t n = 0;
  if (r.max_tokens) {
    n = *r.max_tokens;
    if (prompt_tokens + n > max_model_len)
      throw ParamError("max_tokens", cat("This model's maximum context length is ", max_model_len,
                                         " tokens. However, you requested ", prompt_tokens + n, " tokens (",
                                         prompt_tokens, " in the ", what, ", ", n, " in the completion). Please reduce "
                                         "the length of the ", what, " or completion."));
  } else {
    n = chat ? static_cast<std::int32_t>(max_model_len - prompt_tokens) : 16;
    n = std::min<std::int32_t>(n, static_cast<std::int32_t>(max_model_len - prompt_tokens));
    n = std::min(n, engine_max_output);
  }
  if (r.params.min_tokens > n)
    throw ParamError("min_tokens", cat("'min_tokens' = ", r.params.min_tokens, " is more than the ", n,
                                       " tokens this request may generate"));
  return n;
}

}  // namespace infer::serve
