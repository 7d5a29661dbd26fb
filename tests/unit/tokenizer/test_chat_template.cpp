// Chat templates: SmolLM2's against HF apply_chat_template output for the GGUF's own template, Llama-3
// and Mistral against their documented formats, format detection, default system prompts, and invalid
// conversations.
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "infer/tokenizer/chat_template.hpp"
#include "support/fixtures.hpp"

using infer::ChatFormat;
using infer::ChatMessage;
using infer::ChatTemplate;
using Catch::Matchers::Contains;
using Messages = std::vector<ChatMessage>;

namespace {
nlohmann::json load(const std::string& rel) {
  std::ifstream in(infer::test::fixture(rel));
  REQUIRE(in);
  return nlohmann::json::parse(in);
}
}  // namespace

TEST_CASE("SmolLM2's template renders exactly as HF apply_chat_template", "[chat]") {
  const auto ref = load("smollm2/chat_reference.json");
  const auto tmpl = ChatTemplate::from_source(ref["template"].get<std::string>());
  CHECK(tmpl.format() == ChatFormat::chatml);
  CHECK(tmpl.default_system() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  REQUIRE(ref["cases"].size() == 4);
  for (const auto& c : ref["cases"]) {
    Messages msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    const bool gen = c["add_generation_prompt"].get<bool>();
    INFO("messages: " << c["messages"].dump() << ", add_generation_prompt " << gen);
    CHECK(tmpl.apply(msgs, gen) == c["text"].get<std::string>());
  }
}

TEST_CASE("Qwen2.5-style templates: the default system prompt is the literal, not the spliced message", "[chat]") {
  // Abridged from Qwen2.5's template as stored in tokenizer_config.json: the newlines are Jinja escapes.
  const std::string qwen =
      "{%- if messages[0]['role'] == 'system' %}\n"
      "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
      "{%- else %}\n"
      "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
      "{%- endif %}\n"
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  const auto tmpl = ChatTemplate::from_source(qwen);
  CHECK(tmpl.default_system() == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(tmpl.apply(Messages{{"user", "Hi"}}, true) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(tmpl.apply(Messages{{"system", "S"}, {"user", "Hi"}}, false) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // A plain ChatML template with no default inserts nothing.
  const auto plain = ChatTemplate::from_source(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}");
  CHECK_FALSE(plain.default_system().has_value());
  CHECK(plain.apply(Messages{{"user", "Hi"}}, false) == "<|im_start|>user\nHi<|im_end|>\n");
}

TEST_CASE("Llama-3 renders the documented format", "[chat]") {
  const auto tmpl = ChatTemplate::from_source(
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}...");
  CHECK(tmpl.format() == ChatFormat::llama3);
  const Messages msgs{{"system", "You are a bot."}, {"user", "  Hi there \n"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  CHECK(tmpl.apply(msgs, true) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a bot.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(tmpl.apply(Messages{{"user", "Q"}}, false) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>");
  CHECK(tmpl.end_of_turn() == "<|eot_id|>");
}

TEST_CASE("Mistral renders [INST] turns and requires alternating roles", "[chat]") {
  const auto tmpl = ChatTemplate::from_source("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + ... }}");
  CHECK(tmpl.format() == ChatFormat::mistral);
  CHECK(tmpl.apply(Messages{{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}}, true) ==
        "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
  CHECK(tmpl.apply(Messages{{"system", "Be brief."}, {"user", "Hi"}}, true) == "<s>[INST] Be brief.\n\nHi [/INST]");
  CHECK_THROWS_AS(tmpl.apply(Messages{{"user", "a"}, {"user", "b"}}, true), infer::ChatTemplateError);
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"user", "a"}, {"user", "b"}}, true),
                    Contains("alternate") && Contains("message 1"));
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"assistant", "a"}}, true), Contains("message 0"));
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"user", "a"}, {"system", "b"}}, true), Contains("message 1"));
  CHECK_THROWS_AS(tmpl.apply(Messages{{"system", "s"}}, true), infer::ChatTemplateError);
}

TEST_CASE("from_name picks a format; unknown templates say how to choose one", "[chat]") {
  CHECK(ChatTemplate::from_name("chatml").format() == ChatFormat::chatml);
  CHECK(ChatTemplate::from_name("llama3").format() == ChatFormat::llama3);
  CHECK(ChatTemplate::from_name("mistral").format() == ChatFormat::mistral);
  CHECK_FALSE(ChatTemplate::from_name("chatml").default_system().has_value());
  CHECK_THROWS_AS(ChatTemplate::from_name("vicuna"), infer::ChatTemplateError);
  CHECK_THROWS_WITH(ChatTemplate::from_name("vicuna"), Contains("vicuna") && Contains("chatml"));

  CHECK_THROWS_AS(ChatTemplate::from_source("{% for m in messages %}### {{ m.content }}{% endfor %}"),
                  infer::ChatTemplateError);
  CHECK_THROWS_WITH(ChatTemplate::from_source("{% for m in messages %}### {{ m.content }}{% endfor %}"),
                    Contains("unrecognised") && Contains("from_name") && Contains("###"));
  CHECK_THROWS_WITH(ChatTemplate::from_source(""), Contains("no chat template") && Contains("from_name"));

  auto custom = ChatTemplate::from_name("chatml");
  custom.set_default_system("Be kind.");
  CHECK(custom.apply(Messages{{"user", "x"}}, false) ==
        "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
  auto mistral = ChatTemplate::from_name("mistral");
  CHECK_THROWS_AS(mistral.set_default_system("x"), infer::ChatTemplateError);
}

TEST_CASE("invalid conversations are ChatTemplateErrors", "[chat]") {
  const auto chatml = ChatTemplate::from_name("chatml");
  CHECK_THROWS_AS(chatml.apply(Messages{}, true), infer::ChatTemplateError);
  CHECK_THROWS_WITH(chatml.apply(Messages{}, true), Contains("empty conversation"));
  CHECK_THROWS_AS(chatml.apply(Messages{{"user", "a"}, {"wizard", "b"}}, true), infer::ChatTemplateError);
  CHECK_THROWS_WITH(chatml.apply(Messages{{"user", "a"}, {"wizard", "b"}}, true),
                    Contains("message 1") && Contains("'wizard'"));
  CHECK_THROWS_AS(ChatTemplate::from_name("llama3").apply(Messages{{"bot", "b"}}, true), infer::ChatTemplateError);
}
