// Chat templates: SmolLM2's against HF apply_chat_template output for the GGUF's own template; the real
// Llama-3, Llama-3.1, Llama-3.2 and Mistral v3 templates against jinja2's rendering of them
// (tests/fixtures/chat_templates/reference.json, from scripts/make_chat_references.py); format detection
// on real templates, default system prompts, the date Llama-3.1+ writes, and invalid conversations.
#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
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

std::string read_text(const std::string& rel) {
  std::ifstream in(infer::test::fixture(rel), std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Messages messages_of(const nlohmann::json& c) {
  Messages msgs;
  for (const auto& m : c["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return msgs;
}
}  // namespace

TEST_CASE("SmolLM2's template renders exactly as HF apply_chat_template", "[chat]") {
  const auto ref = load("smollm2/chat_reference.json");
  const auto tmpl = ChatTemplate::from_source(ref["template"].get<std::string>());
  CHECK(tmpl.format() == ChatFormat::chatml);
  CHECK(tmpl.default_system() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  REQUIRE(ref["cases"].size() == 4);
  for (const auto& c : ref["cases"]) {
    const bool gen = c["add_generation_prompt"].get<bool>();
    INFO("messages: " << c["messages"].dump() << ", add_generation_prompt " << gen);
    CHECK(tmpl.apply(messages_of(c), gen) == c["text"].get<std::string>());
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

TEST_CASE("Llama-3, 3.1, 3.2 and Mistral v3 render exactly as jinja2 renders their real templates", "[chat]") {
  const auto ref = load("chat_templates/reference.json");
  const std::map<std::string, ChatFormat> formats = {{"llama-3", ChatFormat::llama3},
                                                      {"llama-3.1", ChatFormat::llama3_1},
                                                      {"llama-3.2", ChatFormat::llama3_1},
                                                      {"mistral-v3", ChatFormat::mistral}};
  REQUIRE(ref["templates"].size() == formats.size());
  REQUIRE(ref["cases"].size() == 156);
  std::map<std::string, ChatTemplate> templates;
  for (const auto& [name, t] : ref["templates"].items()) {
    INFO("template " << name);
    const std::string text = t["text"].get<std::string>();
    CHECK(text == read_text("chat_templates/" + t["file"].get<std::string>()));
    auto tmpl = ChatTemplate::from_source(text);
    CHECK(tmpl.format() == formats.at(name));
    if (t.contains("strftime_now")) {
      // Llama-3.2 writes today's date; the reference pinned strftime_now's clock, so its day is given here.
      const auto& now = t["strftime_now"];
      CHECK_FALSE(tmpl.date_string().has_value());
      CHECK(tmpl.date_format() == now["format"].get<std::string>());
      tmpl.set_date_string(now["date"].get<std::string>());
    } else if (tmpl.format() == ChatFormat::llama3_1) {
      CHECK(tmpl.date_string() == "26 Jul 2024");
    }
    templates.emplace(name, tmpl);
  }

  // What jinja renders but infer refuses on purpose (chat_template.hpp says why).
  const std::set<std::pair<std::string, std::string>> refused = {
      {"llama-3", "unknown_role"}, {"llama-3.1", "unknown_role"}, {"llama-3.2", "unknown_role"},
      {"mistral-v3", "system_only"}};
  std::size_t rendered = 0, raised = 0, refusals = 0;  // the cases as jinja ended them, and infer's refusals
  for (const auto& c : ref["cases"]) {
    const std::string name = c["template"].get<std::string>(), id = c["id"].get<std::string>();
    auto tmpl = templates.at(name);
    if (c.contains("date_string")) tmpl.set_date_string(c["date_string"].get<std::string>());
    const Messages msgs = messages_of(c);
    const bool gen = c["add_generation_prompt"].get<bool>();
    INFO(name << " case " << id << ": " << c["messages"].dump() << ", add_generation_prompt " << gen);
    if (refused.count({name, id})) {
      CHECK(c.contains("text"));
      CHECK_THROWS_AS(tmpl.apply(msgs, gen), infer::ChatTemplateError);
      ++refusals;
    } else if (c.contains("error")) {
      CHECK_THROWS_AS(tmpl.apply(msgs, gen), infer::ChatTemplateError);
      ++raised;
    } else {
      CHECK(tmpl.apply(msgs, gen) == c["text"].get<std::string>());
      ++rendered;
    }
  }
  CHECK(refusals == 2 * refused.size());  // each listed refusal met its case, with and without the prompt
  CHECK(rendered == 134);
  CHECK(raised == 14);
}

TEST_CASE("Llama-3.2's strftime_now date: strftime as Python's, and today's by default", "[chat]") {
  const auto ref = load("chat_templates/reference.json");
  const auto& now = ref["templates"]["llama-3.2"]["strftime_now"];
  // The reference's clock, an ISO date-time, formatted by infer as Python formatted it.
  std::tm clock{};
  std::istringstream(now["clock"].get<std::string>()) >> std::get_time(&clock, "%Y-%m-%dT%H:%M:%S");
  CHECK(infer::detail::format_date(now["format"].get<std::string>(), clock) == now["date"].get<std::string>());

  // Without a fixed date the system turn says today's local date, day first, English month abbreviation.
  const auto tmpl = ChatTemplate::from_source(ref["templates"]["llama-3.2"]["text"].get<std::string>());
  const auto today = [] {
    static constexpr const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                             "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    const std::time_t t = std::time(nullptr);
    std::tm local{};
    localtime_r(&t, &local);
    std::ostringstream s;
    s << (local.tm_mday < 10 ? "0" : "") << local.tm_mday << ' ' << months[local.tm_mon] << ' ' << local.tm_year + 1900;
    return s.str();
  };
  const auto says_today = [&](const ChatTemplate& t) {
    const std::string before = today();
    const std::string text = t.apply(Messages{{"user", "Hi"}}, true);
    const std::string after = today();  // the day may turn during apply()
    INFO(text);
    return text.find("\nToday Date: " + before + "\n\n") != std::string::npos ||
           text.find("\nToday Date: " + after + "\n\n") != std::string::npos;
  };
  CHECK(says_today(tmpl));

  // Llama-3.1's template writes its literal; set_date_string(nullopt) asks for today's instead.
  auto fixed = ChatTemplate::from_source(ref["templates"]["llama-3.1"]["text"].get<std::string>());
  CHECK(fixed.apply(Messages{{"user", "Hi"}}, false).find("\nToday Date: 26 Jul 2024\n\n") != std::string::npos);
  fixed.set_date_string(std::nullopt);
  CHECK(says_today(fixed));
  CHECK(ChatTemplate::from_name("llama3.1").date_string() == "26 Jul 2024");
  // With its date_string line cut, Llama-3.1's template would add an undefined date (jinja raises): refused.
  std::string undated = ref["templates"]["llama-3.1"]["text"].get<std::string>();
  const std::string date_line = "{%- set date_string = \"26 Jul 2024\" %}";
  REQUIRE(undated.find(date_line) != std::string::npos);
  undated.erase(undated.find(date_line), date_line.size());
  CHECK_THROWS_WITH(ChatTemplate::from_source(undated), Contains("date_string") && Contains("set_date_string"));
  CHECK_THROWS_AS(ChatTemplate::from_name("llama3").set_date_string("1 Jan 2030"), infer::ChatTemplateError);
}

TEST_CASE("templates that look like Llama-3 or Mistral but are another format are refused, not misrendered",
          "[chat]") {
  // Real templates (tests/fixtures/chat_templates/README.md): Mistral's v1 (' [INST] ' ... ' [/INST]') and
  // Nemo's v3-tekken ("[INST]" without the space), and firefunction-v2 (Llama-3 headers, its own layout).
  for (const char* file : {"mistral-v1.jinja", "mistral-nemo-instruct-2407.jinja", "firefunction-v2.jinja"}) {
    INFO(file);
    const std::string text = read_text(std::string("chat_templates/") + file);
    CHECK_THROWS_AS(ChatTemplate::from_source(text), infer::ChatTemplateError);
    CHECK_THROWS_WITH(ChatTemplate::from_source(text), Contains("from_name"));
  }
  CHECK_THROWS_WITH(ChatTemplate::from_source(read_text("chat_templates/mistral-v1.jinja")), Contains("v3"));
  CHECK_THROWS_WITH(ChatTemplate::from_source(read_text("chat_templates/firefunction-v2.jinja")),
                    Contains("<|start_header_id|>"));
}

TEST_CASE("Mistral v3's role rules name the message that breaks them", "[chat]") {
  const auto tmpl = ChatTemplate::from_source(read_text("chat_templates/mistral-v3.jinja"));
  REQUIRE(tmpl.format() == ChatFormat::mistral);
  CHECK(tmpl.end_of_turn() == "</s>");
  CHECK_THROWS_AS(tmpl.apply(Messages{{"user", "a"}, {"user", "b"}}, true), infer::ChatTemplateError);
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"user", "a"}, {"user", "b"}}, true),
                    Contains("alternate") && Contains("message 1"));
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"assistant", "a"}}, true), Contains("message 0"));
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"user", "a"}, {"system", "b"}}, true),
                    Contains("message 1") && Contains("first message"));
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"system", "s"}, {"user", "a"}, {"assistant", "b"}, {"assistant", "c"}}, true),
                    Contains("message 3") && Contains("'user' belongs"));
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"user", "a"}, {"tool", "42"}}, true),
                    Contains("message 1") && Contains("'tool'") && Contains("tool_call_id"));
  // Jinja renders "<s>" for a lone system message, dropping its text; infer refuses.
  CHECK_THROWS_WITH(tmpl.apply(Messages{{"system", "s"}}, true), Contains("needs a user message"));
}

TEST_CASE("from_name picks a format, and unknown templates say how to choose one", "[chat]") {
  CHECK(ChatTemplate::from_name("chatml").format() == ChatFormat::chatml);
  CHECK(ChatTemplate::from_name("llama3").format() == ChatFormat::llama3);
  CHECK(ChatTemplate::from_name("llama3.1").format() == ChatFormat::llama3_1);
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
