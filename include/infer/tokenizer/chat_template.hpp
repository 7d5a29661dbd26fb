#pragma once
/// \file
/// Chat templates: a conversation → the prompt text the model was trained on. Models ship a Jinja
/// template; rather than embedding a Jinja interpreter, the three formats that cover the supported
/// families are implemented directly and chosen by inspecting the model's template string:
///
/// | format    | recognised by            | per message                                                  |
/// | --------- | ------------------------ | ------------------------------------------------------------ |
/// | `chatml`  | `<|im_start|>`           | `<|im_start|>{role}\n{content}<|im_end|>\n` (SmolLM2, Qwen2) |
/// | `llama3`  | `<|start_header_id|>`    | `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>` after `<|begin_of_text|>` |
/// | `mistral` | `[INST]`                 | `<s>[INST] {user} [/INST]{assistant}</s>...`                 |
///
/// ChatML templates that insert a default system prompt when the conversation does not start with one
/// (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by Hugging Face"; Qwen2.5: "You are
/// Qwen, ...") get the same behaviour: the default text is read out of the template string itself.
/// The rendered text contains special tokens as text (and Llama-3/Mistral's BOS); encode it with
/// `parse_special = true` and `add_bos = false`.
///
/// Anything else is a ChatTemplateError that says how to pick a format explicitly.

#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infer/core/error.hpp"

namespace infer {

struct ChatMessage {
  std::string role;
  std::string content;
};

enum class ChatFormat { chatml, llama3, mistral };

constexpr std::string_view to_string(ChatFormat f) noexcept {
  switch (f) {
    case ChatFormat::chatml: return "chatml";
    case ChatFormat::llama3: return "llama3";
    case ChatFormat::mistral: return "mistral";
  }
  return "?";
}

namespace detail {

inline constexpr std::string_view kChooseFormatHint =
    "choose a format explicitly with ChatTemplate::from_name(\"chatml\" | \"llama3\" | \"mistral\")";

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

inline std::string trim_whitespace(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
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
  /// ChatTemplateError when the source is empty or matches no known format.
  static ChatTemplate from_source(std::string_view jinja) {
    if (jinja.empty()) {
      throw ChatTemplateError(detail::cat("the model has no chat template; ", detail::kChooseFormatHint));
    }
    if (jinja.find("<|im_start|>") != std::string_view::npos) {
      ChatTemplate t(ChatFormat::chatml);
      t.default_system_ = detail::chatml_default_system(jinja);
      return t;
    }
    if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate(ChatFormat::llama3);
    if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplate(ChatFormat::mistral);
    const std::string_view head = jinja.substr(0, 80);
    throw ChatTemplateError(detail::cat("unrecognised chat template (it contains none of <|im_start|>, ",
                                        "<|start_header_id|>, [INST]; it begins \"", head,
                                        jinja.size() > head.size() ? "...\"" : "\"", "); ", detail::kChooseFormatHint));
  }

  /// "chatml", "llama3" or "mistral" (no default system prompt).
  static ChatTemplate from_name(std::string_view name) {
    if (name == "chatml") return ChatTemplate(ChatFormat::chatml);
    if (name == "llama3") return ChatTemplate(ChatFormat::llama3);
    if (name == "mistral") return ChatTemplate(ChatFormat::mistral);
    throw ChatTemplateError(detail::cat("unknown chat template name '", name, "'; known: chatml, llama3, mistral"));
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

  /// Text that ends an assistant turn: generation stops there.
  [[nodiscard]] std::string_view end_of_turn() const noexcept {
    switch (format_) {
      case ChatFormat::chatml: return "<|im_end|>";
      case ChatFormat::llama3: return "<|eot_id|>";
      case ChatFormat::mistral: return "</s>";
    }
    return {};
  }

  /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's reply begins.
  /// ChatTemplateError for an empty conversation, a role the format does not know, or (Mistral) roles
  /// that do not alternate user/assistant after an optional leading system message.
  [[nodiscard]] std::string apply(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
    if (messages.empty()) throw ChatTemplateError("cannot apply a chat template to an empty conversation");
    switch (format_) {
      case ChatFormat::chatml: return chatml(messages, add_generation_prompt);
      case ChatFormat::llama3: return llama3(messages, add_generation_prompt);
      case ChatFormat::mistral: return mistral(messages);
    }
    return {};
  }

  [[nodiscard]] std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    return apply(std::span<const ChatMessage>(messages), add_generation_prompt);
  }

 private:
  explicit ChatTemplate(ChatFormat f) : format_(f) {}

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

  static std::string llama3(std::span<const ChatMessage> messages, bool gen) {
    check_roles(messages, {"system", "user", "assistant", "ipython", "tool"}, "llama3",
                "system, user, assistant, ipython, tool");
    std::string out = "<|begin_of_text|>";
    for (const auto& m : messages) {
      // Meta's template trims each message's content.
      out.append("<|start_header_id|>").append(m.role).append("<|end_header_id|>\n\n");
      out.append(detail::trim_whitespace(m.content)).append("<|eot_id|>");
    }
    if (gen) out.append("<|start_header_id|>assistant<|end_header_id|>\n\n");
    return out;
  }

  static std::string mistral(std::span<const ChatMessage> messages) {
    check_roles(messages, {"system", "user", "assistant"}, "mistral", "system, user, assistant");
    std::size_t first = 0;
    std::string system;
    if (messages[0].role == "system") {
      system = messages[0].content;
      first = 1;
      if (messages.size() == 1) throw ChatTemplateError("mistral chat template: a system message needs a user message after it");
    }
    std::string out = "<s>";
    for (std::size_t i = first; i < messages.size(); ++i) {
      const auto& m = messages[i];
      const bool expect_user = (i - first) % 2 == 0;
      if (m.role != (expect_user ? "user" : "assistant")) {
        throw ChatTemplateError(detail::cat("mistral chat template: roles must alternate user/assistant/user/... ",
                                            "(after an optional first system message), but message ", i, " is '",
                                            m.role, "' where '", expect_user ? "user" : "assistant", "' belongs"));
      }
      if (expect_user) {
        // The system prompt rides on the first user turn, as Mistral's later templates do.
        out.append("[INST] ");
        if (i == first && !system.empty()) out.append(system).append("\n\n");
        out.append(m.content).append(" [/INST]");
      } else {
        out.append(m.content).append("</s>");
      }
    }
    return out;
  }

  ChatFormat format_;
  std::optional<std::string> default_system_;
};

}  // namespace infer
