#pragma once
/// \file
/// Chat templates: a conversation → the prompt text the model was trained on. Models ship a Jinja
/// template; rather than embedding a Jinja interpreter, the formats that cover the supported families
/// are implemented directly, chosen by inspecting the model's template string, and render the bytes
/// jinja2 renders under HF transformers' apply_chat_template (what vLLM serves). Tests compare them with
/// the real templates rendered that way (tests/fixtures/chat_templates/, scripts/make_chat_references.py).
///
/// | format     | models                       | recognised by (in the template string)                       |
/// | ---------- | ---------------------------- | ------------------------------------------------------------ |
/// | `chatml`   | SmolLM2, Qwen2               | `<|im_start|>`                                               |
/// | `llama3`   | Meta-Llama-3-*-Instruct      | `<|start_header_id|>` and Meta's `message['content'] | trim + '<|eot_id|>'` |
/// | `llama3.1` | Llama-3.1, 3.2, 3.3 Instruct | the same, and `Cutting Knowledge Date: December 2023`        |
/// | `mistral`  | Mistral v3: Mistral-7B-Instruct-v0.3, Mixtral-8x22B, Mistral-Large-2407 | `[INST]`, `"[INST] " + message["content"] + "[/INST]"` and `" " + message["content"]|trim + eos_token` |
///
/// | format     | renders                                                                                  |
/// | ---------- | ---------------------------------------------------------------------------------------- |
/// | `chatml`   | `<|im_start|>{role}\n{content}<|im_end|>\n` per message                                   |
/// | `llama3`   | `<|begin_of_text|>`, then `<|start_header_id|>{role}<|end_header_id|>\n\n{trim(content)}<|eot_id|>` per message |
/// | `llama3.1` | `<|begin_of_text|>`, a system turn always: `Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n{trim(first system message, or "")}`, then the other messages as `llama3`, except that `ipython` and `tool` messages become an `ipython` turn holding the content as a JSON string (tojson) |
/// | `mistral`  | `<s>`, then `[INST] {user}[/INST]` and ` {trim(assistant)}</s>`; the system text joins the *last* message when that is a user turn: `[INST] {system}\n\n{user}[/INST]` |
///
/// `trim` is Python's str.strip(), as Jinja's filter: Unicode whitespace too (U+00A0, U+3000, U+2028,
/// U+0085, U+001C..U+001F, ...). Templates that carry a marker but not the rest (a Llama-3 fine-tune's
/// own format, a Mistral template of another version: v1's `' [/INST]'`, Nemo's `"[INST]" +`) are
/// refused rather than rendered in a format the model was not trained on.
///
/// ChatML templates that insert a default system prompt when the conversation does not start with one
/// (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by Hugging Face"; Qwen2.5: "You are
/// Qwen, ...") get the same behaviour: the default text is read out of the template string itself.
///
/// Llama-3.1's `{date}` is the template's `date_string` literal ("26 Jul 2024"). Templates that compute
/// it with `strftime_now(fmt)` (Llama-3.2) get today's local date in that format, at every apply(): HF
/// defines strftime_now, so that is what transformers and vLLM write. set_date_string() fixes the date,
/// as apply_chat_template's `date_string=` argument does.
///
/// Where infer refuses what jinja would render, on purpose (a ChatTemplateError naming the message):
///   - an empty conversation (transformers refuses it too);
///   - a role the format does not have (chatml: system/user/assistant/tool; Llama-3: system/user/
///     assistant/ipython/tool): the template would write it as a header the model never saw;
///   - Mistral: a conversation of only a system message (the template renders just `<s>`, dropping it).
/// Mistral's other rules are the template's own: after an optional first system message, user and
/// assistant alternate starting with user; `tool` messages are refused because they need a tool_call_id
/// ChatMessage does not carry (the template raises without one). The system text is dropped, as the
/// template drops it, when the conversation ends with an assistant turn.
///
/// The rendered text contains special tokens as text (and Llama-3/Mistral's BOS); encode it with
/// `parse_special = true` and `add_bos = false`. Anything unrecognised is a ChatTemplateError that says
/// how to pick a format explicitly.

#include <ctime>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/tokenizer/utf8.hpp"

namespace infer {

struct ChatMessage {
  std::string role;
  std::string content;
};

enum class ChatFormat { chatml, llama3, llama3_1, mistral };

constexpr std::string_view to_string(ChatFormat f) noexcept {
  switch (f) {
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::llama3: return "llama3";
    case ChatFormat::llama3_1: return "llama3.1";
    case ChatFormat::mistral: return "mistral";
  }
  return "?";
}

namespace detail {

inline constexpr std::string_view kChooseFormatHint =
    "choose a format explicitly with ChatTemplate::from_name(\"chatml\" | \"llama3\" | \"llama3.1\" | \"mistral\")";

/// Llama-3.1's system turn before the date (and what tells its template from Llama-3.0's).
inline constexpr std::string_view kLlamaKnowledge = "Cutting Knowledge Date: December 2023";
/// The date Llama-3.1's template writes when nothing sets date_string.
inline constexpr std::string_view kLlama31Date = "26 Jul 2024";
/// The format Llama-3.2's template hands strftime_now.
inline constexpr std::string_view kLlamaDateFormat = "%d %b %Y";

/// Reads a Jinja string literal's body (between quotes `quote`) back into text; nullopt when the body
/// contains an unescaped quote, i.e. the literal ends inside it and what follows is an expression.
inline std::optional<std::string> jinja_literal(std::string_view body, char quote) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == quote) return std::nullopt;
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      default: out.push_back(e); break;  // \\, \', \" and anything else: the character itself
    }
  }
  return out;
}

/// The string literal that starts right after `prefix` in `src` (quoted with ' or "), e.g. the
/// argument of `strftime_now(`; nullopt when `prefix` is not followed by a literal.
inline std::optional<std::string> literal_after(std::string_view src, std::string_view prefix) {
  for (std::size_t p = src.find(prefix); p != std::string_view::npos; p = src.find(prefix, p + 1)) {
    const std::size_t q = p + prefix.size();
    if (q >= src.size() || (src[q] != '\'' && src[q] != '"')) continue;
    const char quote = src[q];
    std::size_t end = q + 1;
    while (end < src.size() && src[end] != quote) end += src[end] == '\\' ? 2 : 1;
    if (end >= src.size()) continue;
    return jinja_literal(src.substr(q + 1, end - q - 1), quote);
  }
  return std::nullopt;
}

/// Whether `src` contains the Jinja code `code`, written with either kind of quote (templates copy
/// the same expression with ' or ").
inline bool contains_code(std::string_view src, std::string code) {
  if (src.find(code) != std::string_view::npos) return true;
  for (char& c : code) {
    if (c == '\'') c = '"';
    else if (c == '"') c = '\'';
  }
  return src.find(code) != std::string_view::npos;
}

/// The default system prompt a ChatML template writes as a literal `'<|im_start|>system\n...<|im_end|>'`
/// (newline either real or escaped as \n). Occurrences that splice in `messages[0]['content']` are not
/// literals and are skipped, which is how Qwen2.5's template, which has both, yields its default.
inline std::optional<std::string> chatml_default_system(std::string_view src) {
  constexpr std::string_view marker = "<|im_start|>system";
  constexpr std::string_view end_marker = "<|im_end|>";
  for (std::size_t p = src.find(marker); p != std::string_view::npos; p = src.find(marker, p + 1)) {
    if (p == 0 || (src[p - 1] != '\'' && src[p - 1] != '"')) continue;
    const char quote = src[p - 1];
    std::size_t q = p + marker.size();
    if (q < src.size() && src[q] == '\n') {
      q += 1;
    } else if (src.substr(q, 2) == "\\n") {
      q += 2;
    } else {
      continue;
    }
    const std::size_t end = src.find(end_marker, q);
    if (end == std::string_view::npos) continue;
    if (auto text = jinja_literal(src.substr(q, end - q), quote); text && !text->empty()) return text;
  }
  return std::nullopt;
}

/// Whether Python's str.isspace() holds for code point `c`: what Jinja's `trim` (str.strip()) removes.
constexpr bool py_isspace(char32_t c) noexcept {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/// Jinja's `trim`: `s` without leading and trailing Python whitespace. Bytes that are not valid UTF-8
/// (which a Python string cannot hold) count as text and stop the trimming.
inline std::string py_strip(std::string_view s) {
  std::size_t b = 0;
  while (b < s.size()) {
    const auto cp = utf8::decode(s, b);
    if (!cp || !py_isspace(cp->value)) break;
    b += cp->length;
  }
  std::size_t e = s.size();
  while (e > b) {
    std::size_t start = e - 1;  // back up to the lead byte of the last character
    while (start > b && e - start < 4 && utf8::detail::is_continuation(static_cast<unsigned char>(s[start]))) --start;
    const auto cp = utf8::decode(s, start);
    if (!cp || start + cp->length != e || !py_isspace(cp->value)) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

/// `s` as a JSON string, exactly as Python's json.dumps(s, ensure_ascii=False) writes it (the tojson
/// filter HF's environment installs): quotes, backslashes and control characters escaped, everything
/// else (DEL, U+2028, non-ASCII) as is.
inline std::string py_json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out.push_back(hex[c >> 4]);
          out.push_back(hex[c & 0xF]);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

/// `when` in strftime format `format` (C locale names, as Python's strftime in a default process).
inline std::string format_date(std::string_view format, const std::tm& when) {
  const std::string fmt(format);
  char buf[128];
  const std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &when);
  if (n == 0 && !fmt.empty()) {
    throw ChatTemplateError(cat("the chat template's date format '", fmt, "' gives no text or more than ", sizeof buf,
                                " bytes"));
  }
  return std::string(buf, n);
}

/// Today's local date in strftime format `format`: what HF's strftime_now(format) returns.
inline std::string format_today(std::string_view format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  return format_date(format, local);
}

inline bool one_of(std::string_view role, std::initializer_list<std::string_view> roles) {
  for (auto r : roles) {
    if (role == r) return true;
  }
  return false;
}

}  // namespace detail

class ChatTemplate {
 public:
  /// Picks the format by inspecting a model's Jinja template (e.g. Tokenizer::chat_template_source()).
  /// ChatTemplateError when the source is empty or matches no format infer implements.
  static ChatTemplate from_source(std::string_view jinja) {
    using detail::cat;
    if (jinja.empty()) {
      throw ChatTemplateError(cat("the model has no chat template; ", detail::kChooseFormatHint));
    }
    const std::string_view head = jinja.substr(0, 80);
    const std::string begins = cat("it begins \"", head, jinja.size() > head.size() ? "...\"" : "\"");
    if (jinja.find("<|im_start|>") != std::string_view::npos) {
      ChatTemplate t(ChatFormat::chatml);
      t.default_system_ = detail::chatml_default_system(jinja);
      return t;
    }
    if (jinja.find("<|start_header_id|>") != std::string_view::npos) {
      // Meta's templates, 3.0 to 3.3, all write a turn with this expression; fine-tunes that reuse the
      // header tokens in another layout (firefunction, functionary) do not.
      if (!detail::contains_code(jinja, "message['content'] | trim + '<|eot_id|>'")) {
        throw ChatTemplateError(cat("chat template uses Llama-3's <|start_header_id|> but not Meta's turn format ",
                                    "(message['content'] | trim + '<|eot_id|>'), so infer cannot tell what it ",
                                    "renders (", begins, "); ", detail::kChooseFormatHint));
      }
      if (jinja.find(detail::kLlamaKnowledge) == std::string_view::npos) {
        return ChatTemplate(ChatFormat::llama3);
      }
      ChatTemplate t(ChatFormat::llama3_1);
      if (auto fmt = detail::literal_after(jinja, "strftime_now(")) {
        // HF defines strftime_now, so such a template writes today's date, not its fallback literal.
        t.date_format_ = std::move(*fmt);
        t.date_string_.reset();
      } else if (auto date = detail::literal_after(jinja, "date_string = ")) {
        t.date_string_ = std::move(*date);
      } else {
        throw ChatTemplateError(cat("Llama-3.1-style chat template with neither a date_string literal nor "
                                    "strftime_now(...), so infer cannot tell which date it writes (", begins, "); ",
                                    detail::kChooseFormatHint, " and set_date_string()"));
      }
      return t;
    }
    if (jinja.find("[INST]") != std::string_view::npos) {
      if (!detail::contains_code(jinja, R"("[INST] " + message["content"] + "[/INST]")") ||
          !detail::contains_code(jinja, R"(" " + message["content"]|trim + eos_token)")) {
        throw ChatTemplateError(cat("chat template uses Mistral's [INST] but is not Mistral's v3 template ",
                                    "(\"[INST] \" + message[\"content\"] + \"[/INST]\", \" \" + ",
                                    "message[\"content\"]|trim + eos_token), the only Mistral format infer ",
                                    "implements (", begins, "); ", detail::kChooseFormatHint));
      }
      return ChatTemplate(ChatFormat::mistral);
    }
    throw ChatTemplateError(cat("unrecognised chat template (it contains none of <|im_start|>, <|start_header_id|>, ",
                                "[INST]; ", begins, "); ", detail::kChooseFormatHint));
  }

  /// "chatml", "llama3", "llama3.1" or "mistral" (no default system prompt; llama3.1 writes the date
  /// Llama-3.1's template does, 26 Jul 2024).
  static ChatTemplate from_name(std::string_view name) {
    if (name == "chatml") return ChatTemplate(ChatFormat::chatml);
    if (name == "llama3") return ChatTemplate(ChatFormat::llama3);
    if (name == "llama3.1") return ChatTemplate(ChatFormat::llama3_1);
    if (name == "mistral") return ChatTemplate(ChatFormat::mistral);
    throw ChatTemplateError(
        detail::cat("unknown chat template name '", name, "'; known: chatml, llama3, llama3.1, mistral"));
  }

  [[nodiscard]] ChatFormat format() const noexcept { return format_; }
  /// The system prompt inserted when a conversation does not start with one (ChatML only).
  [[nodiscard]] const std::optional<std::string>& default_system() const noexcept { return default_system_; }
  ChatTemplate& set_default_system(std::optional<std::string> text) {
    if (text && format_ != ChatFormat::chatml) {
      throw ChatTemplateError(detail::cat("a default system prompt is only supported by chatml, not ", to_string(format_)));
    }
    default_system_ = std::move(text);
    return *this;
  }

  /// The date llama3.1's system turn writes; nullopt means today's, in date_format(), at each apply()
  /// (the other formats write no date).
  [[nodiscard]] const std::optional<std::string>& date_string() const noexcept { return date_string_; }
  /// The strftime format of today's date when date_string() is nullopt.
  [[nodiscard]] const std::string& date_format() const noexcept { return date_format_; }
  /// Fixes the date (as apply_chat_template's date_string= does), or with nullopt writes today's.
  ChatTemplate& set_date_string(std::optional<std::string> date) {
    if (format_ != ChatFormat::llama3_1) {
      throw ChatTemplateError(detail::cat("only llama3.1 writes a date, not ", to_string(format_)));
    }
    date_string_ = std::move(date);
    return *this;
  }

  /// Text that ends an assistant turn: generation stops there.
  [[nodiscard]] std::string_view end_of_turn() const noexcept {
    switch (format_) {
      case ChatFormat::chatml: return "<|im_end|>";
      case ChatFormat::llama3:
      case ChatFormat::llama3_1: return "<|eot_id|>";
      case ChatFormat::mistral: return "</s>";
    }
    return {};
  }

  /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's reply begins
  /// (Mistral's template writes nothing for it: the reply follows `[/INST]`). ChatTemplateError, naming
  /// the message, for what the header comment lists: an empty conversation, a role the format does not
  /// know, and Mistral's role order.
  [[nodiscard]] std::string apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
    if (messages.empty()) throw ChatTemplateError("cannot apply a chat template to an empty conversation");
    switch (format_) {
      case ChatFormat::chatml: return chatml(messages, add_generation_prompt);
      case ChatFormat::llama3: return llama3(messages, add_generation_prompt);
      case ChatFormat::llama3_1: return llama3_1(messages, add_generation_prompt);
      case ChatFormat::mistral: return mistral(messages);
    }
    return {};
  }

  [[nodiscard]] std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    return apply(std::span<const ChatMessage>(messages), add_generation_prompt);
  }

 private:
  explicit ChatTemplate(ChatFormat f) : format_(f) {
    if (f == ChatFormat::llama3_1) date_string_ = std::string(detail::kLlama31Date);
  }

  static void check_roles(std::span<const ChatMessage> messages, std::initializer_list<std::string_view> roles,
                          std::string_view format, std::string_view known) {
    for (std::size_t i = 0; i < messages.size(); ++i) {
      if (!detail::one_of(messages[i].role, roles)) {
        throw ChatTemplateError(detail::cat("message ", i, " has role '", messages[i].role, "', which the ", format,
                                            " chat template does not know (roles: ", known, ")"));
      }
    }
  }

  std::string chatml(std::span<const ChatMessage> messages, bool gen) const {
    check_roles(messages, {"system", "user", "assistant", "tool"}, "chatml", "system, user, assistant, tool");
    std::string out;
    if (default_system_ && messages.front().role != "system") {
      out.append("<|im_start|>system\n").append(*default_system_).append("<|im_end|>\n");
    }
    for (const auto& m : messages) {
      out.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
    }
    if (gen) out.append("<|im_start|>assistant\n");
    return out;
  }

  static void check_llama_roles(std::span<const ChatMessage> messages, std::string_view format) {
    check_roles(messages, {"system", "user", "assistant", "ipython", "tool"}, format,
                "system, user, assistant, ipython, tool");
  }

  static void llama_turn(std::string& out, std::string_view role, std::string_view text) {
    out.append("<|start_header_id|>").append(role).append("<|end_header_id|>\n\n").append(text).append("<|eot_id|>");
  }

  static std::string llama3(std::span<const ChatMessage> messages, bool gen) {
    check_llama_roles(messages, "llama3");
    std::string out = "<|begin_of_text|>";
    for (const auto& m : messages) llama_turn(out, m.role, detail::py_strip(m.content));
    if (gen) out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
    return out;
  }

  std::string llama3_1(std::span<const ChatMessage> messages, bool gen) const {
    check_llama_roles(messages, "llama3.1");
    std::string out = "<|begin_of_text|>";
    // The first message, when it is a system message, goes into the system turn the template always writes.
    const bool system_first = messages.front().role == "system";
    out.append("<|start_header_id|>system<|end_header_id|>\n\n").append(detail::kLlamaKnowledge).append("\n");
    out.append("Today Date: ").append(date_string_ ? *date_string_ : detail::format_today(date_format_)).append("\n\n");
    out.append(system_first ? detail::py_strip(messages.front().content) : std::string()).append("<|eot_id|>");
    for (const auto& m : messages.subspan(system_first ? 1 : 0)) {
      if (m.role == "ipython" || m.role == "tool") {
        // The template tests `content is mapping or content is iterable`, true for a string too: tojson.
        llama_turn(out, "ipython", detail::py_json_string(m.content));
      } else {
        llama_turn(out, m.role, detail::py_strip(m.content));
      }
    }
    if (gen) out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
    return out;
  }

  static std::string mistral(std::span<const ChatMessage> messages) {
    using detail::cat;
    check_roles(messages, {"system", "user", "assistant"}, "mistral",
                "system, user, assistant; tool results need a tool_call_id, which ChatMessage does not carry");
    const bool has_system = messages.front().role == "system";
    const std::size_t first = has_system ? 1 : 0;
    if (first == messages.size()) {
      throw ChatTemplateError("mistral chat template: a system message needs a user message after it (the "
                              "template renders the system text only with a user turn)");
    }
    for (std::size_t i = first; i < messages.size(); ++i) {
      const std::string_view role = messages[i].role;
      if (role == "system") {
        throw ChatTemplateError(cat("mistral chat template: only the first message may be a system message, ",
                                    "but message ", i, " is one"));
      }
      const bool expect_user = (i - first) % 2 == 0;
      if (role != (expect_user ? "user" : "assistant")) {
        throw ChatTemplateError(cat("mistral chat template: roles must alternate user/assistant/user/... ",
                                    "(after an optional first system message), but message ", i, " is '", role,
                                    "' where '", expect_user ? "user" : "assistant", "' belongs"));
      }
    }
    std::string out = "<s>";
    for (std::size_t i = first; i < messages.size(); ++i) {
      const auto& m = messages[i];
      if (m.role == "user") {
        // v3 puts the system text on the last message (only when that is a user turn), untrimmed.
        out.append("[INST] ");
        if (has_system && i + 1 == messages.size()) out.append(messages.front().content).append("\n\n");
        out.append(m.content).append("[/INST]");
      } else {
        out.append(" ").append(detail::py_strip(m.content)).append("</s>");
      }
    }
    return out;
  }

  ChatFormat format_;
  std::optional<std::string> default_system_;
  std::optional<std::string> date_string_;
  std::string date_format_ = std::string(detail::kLlamaDateFormat);
};

}  // namespace infer
