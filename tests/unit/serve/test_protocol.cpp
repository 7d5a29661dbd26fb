// Request bodies → typed requests: every field's type and range, error messages that name the field,
// prompts in all four shapes, messages, and the context-length check with both numbers.
#include <catch2/catch.hpp>

#include <string>

#include "infer/serve/protocol.hpp"

using namespace infer;
using namespace infer::serve;
using Catch::Contains;
using nlohmann::json;

namespace {
/// The ParamError a body raises: its param and message.
std::pair<std::string, std::string> completion_error(const json& body) {
  try {
    (void)parse_completion_request(body);
  } catch (const ParamError& e) {
    return {e.param(), e.what()};
  }
  FAIL("no ParamError for " << body.dump());
  return {};
}
std::pair<std::string, std::string> chat_error(const json& body) {
  try {
    (void)parse_chat_request(body);
  } catch (const ParamError& e) {
    return {e.param(), e.what()};
  }
  FAIL("no ParamError for " << body.dump());
  return {};
}
json with(json body, const std::string& key, json value) {
  body[key] = std::move(value);
  return body;
}
const json base = {{"prompt", "hi"}};
}  // namespace

TEST_CASE("a completions body maps onto SamplingParams field by field", "[serve][protocol]") {
  const json body = {{"model", "m"},          {"prompt", "Hello"},       {"max_tokens", 7},
                     {"temperature", 0.5},    {"top_p", 0.9},            {"top_k", 40},
                     {"min_p", 0.05},         {"n", 3},                  {"stop", {"\n", "END"}},
                     {"seed", -5},            {"presence_penalty", 0.5}, {"frequency_penalty", -0.5},
                     {"repetition_penalty", 1.1}, {"logprobs", 2},       {"ignore_eos", true},
                     {"stop_token_ids", {2, 3}},  {"min_tokens", 1},     {"user", "ignored"},
                     {"priority", -3},        {"tag", "batch-job"},      {"some_future_field", {{"x", 1}}}};
  const CompletionRequest r = parse_completion_request(body);
  CHECK(r.model == "m");
  REQUIRE(r.prompts.size() == 1);
  CHECK(r.prompts[0].text == "Hello");
  CHECK(r.max_tokens == 7);
  CHECK(r.params.temperature == 0.5f);
  CHECK(r.params.top_p == 0.9f);
  CHECK(r.params.top_k == 40);
  CHECK(r.params.min_p == 0.05f);
  CHECK(r.params.n == 3);
  CHECK(r.params.stop == std::vector<std::string>{"\n", "END"});
  CHECK(r.params.seed == static_cast<std::uint64_t>(std::int64_t{-5}));
  CHECK(r.params.presence_penalty == 0.5f);
  CHECK(r.params.frequency_penalty == -0.5f);
  CHECK(r.params.repetition_penalty == 1.1f);
  CHECK(r.logprobs);
  CHECK(r.params.logprobs == 2);
  CHECK(r.params.ignore_eos);
  CHECK(r.params.stop_token_ids == std::vector<std::int32_t>{2, 3});
  CHECK(r.params.min_tokens == 1);
  CHECK(r.params.priority == -3);
  CHECK(r.params.tag == "batch-job");
  CHECK_FALSE(r.stream);
  CHECK_NOTHROW(r.params.validate());
}

TEST_CASE("null means not given, and defaults are OpenAI's", "[serve][protocol]") {
  const CompletionRequest r = parse_completion_request(
      {{"prompt", "x"}, {"temperature", nullptr}, {"max_tokens", nullptr}, {"stop", nullptr}, {"logprobs", nullptr}});
  CHECK(r.params.temperature == 1.0f);
  CHECK_FALSE(r.max_tokens);
  CHECK(r.params.stop.empty());
  CHECK_FALSE(r.logprobs);
  CHECK_FALSE(r.params.logprobs);
}

TEST_CASE("prompts: a string, a list of strings, token ids, lists of token ids", "[serve][protocol]") {
  CHECK(parse_completion_request({{"prompt", {"a", "b"}}}).prompts.size() == 2);
  const auto ids = parse_completion_request({{"prompt", {1, 2, 3}}}).prompts;
  REQUIRE(ids.size() == 1);
  CHECK_FALSE(ids[0].text);
  CHECK(ids[0].ids == std::vector<std::int32_t>{1, 2, 3});
  const auto lists = parse_completion_request({{"prompt", {{1, 2}, {3}}}}).prompts;
  REQUIRE(lists.size() == 2);
  CHECK(lists[1].ids == std::vector<std::int32_t>{3});
  CHECK(completion_error({{"max_tokens", 3}}).first == "prompt");
  CHECK(completion_error({{"prompt", json::array()}}).first == "prompt");
  CHECK(completion_error({{"prompt", 5}}).first == "prompt");
  CHECK(completion_error({{"prompt", {"a", 3}}}).first == "prompt[1]");
  CHECK(completion_error({{"prompt", {1, -2}}}).first == "prompt[1]");
  CHECK(completion_error({{"prompt", {json::array()}}}).first == "prompt");
  CHECK(completion_error({{"prompt", {1, "x"}}}).first == "prompt[1]");
  json many = json::array();
  for (int i = 0; i < 65; ++i) many.push_back("p");
  CHECK(completion_error({{"prompt", many}}).second.find("at most 64") != std::string::npos);
  CHECK(completion_error({{"prompt", {"a", "b", "c"}}, {"n", 100}}).first == "n");  // 300 choices
}

TEST_CASE("every range is at least as strict as vLLM's, and the message names the field", "[serve][protocol]") {
  struct Case {
    const char* field;
    json value;
  };
  const Case bad[] = {{"temperature", -0.1},     {"temperature", 2.01},      {"top_p", 0},
                      {"top_p", 1.5},            {"min_p", -0.01},           {"min_p", 1.01},
                      {"presence_penalty", 2.5}, {"presence_penalty", -2.5}, {"frequency_penalty", 3},
                      {"frequency_penalty", -3}, {"repetition_penalty", 0},  {"repetition_penalty", -1},
                      {"max_tokens", 0},         {"max_tokens", -4},         {"n", 0},
                      {"n", 129},                {"top_k", -2},              {"logprobs", 21},
                      {"logprobs", -1},          {"min_tokens", -1},         {"max_tokens", 1e12},
                      {"seed", 1e30},            {"priority", 3e9},          {"priority", -3e9}};
  for (const auto& c : bad) {
    INFO(c.field << " = " << c.value.dump());
    const auto [param, message] = completion_error(with(base, c.field, c.value));
    CHECK(param == c.field);
    CHECK_THAT(message, Contains(c.field) && Contains("out of range"));
  }
  // Parsed bodies hold non-negative numbers as unsigned: the lower bounds hold for them too.
  for (const char* field : {"max_tokens", "n"}) {
    INFO(field);
    CHECK(completion_error(json::parse(std::string(R"({"prompt": "x", ")") + field + R"(": 0})")).first == field);
  }
  CHECK(completion_error(with(base, "tag", std::string(SamplingParams::max_tag_bytes + 1, 'x'))).first == "tag");
  CHECK(completion_error(with(base, "tag", 7)).first == "tag");
  CHECK(completion_error(with(base, "priority", 1.5)).first == "priority");
  CHECK(parse_chat_request({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"priority", 5}}).params.priority == 5);
  // Boundaries are accepted.
  CHECK_NOTHROW(parse_completion_request(with(with(with(base, "temperature", 2), "top_p", 1), "min_p", 1)));
  CHECK_NOTHROW(parse_completion_request(with(with(base, "presence_penalty", -2), "frequency_penalty", 2)));
  CHECK_NOTHROW(parse_completion_request(with(with(base, "n", 128), "top_k", -1)));
  // An integral float is an integer (as pydantic reads it); a fraction is not.
  CHECK(parse_completion_request(with(base, "max_tokens", 4.0)).max_tokens == 4);
  CHECK_THAT(completion_error(with(base, "max_tokens", 4.5)).second, Contains("must be an integer"));
  CHECK(completion_error(with(with(base, "max_tokens", 3), "min_tokens", 4)).first == "min_tokens");
}

TEST_CASE("a wrong type is a 400 naming the field and the type it got", "[serve][protocol]") {
  auto [p1, m1] = completion_error(with(base, "temperature", "hot"));
  CHECK(p1 == "temperature");
  CHECK_THAT(m1, Contains("must be a number") && Contains("a string"));
  CHECK(completion_error(with(base, "temperature", true)).first == "temperature");  // a bool is not a number
  CHECK(completion_error(with(base, "max_tokens", "5")).first == "max_tokens");
  CHECK(completion_error(with(base, "stream", 1)).first == "stream");
  CHECK(completion_error(with(base, "stop", 5)).first == "stop");
  CHECK(completion_error(with(base, "stop", {"a", 5})).first == "stop[1]");
  CHECK(completion_error(with(base, "model", 5)).first == "model");
  CHECK(completion_error(with(base, "stop_token_ids", "1")).first == "stop_token_ids");
  CHECK(completion_error(json::array({1, 2})).first == "body");
  CHECK(completion_error("a string").first == "body");
}

TEST_CASE("stop lists are bounded and checked", "[serve][protocol]") {
  json seventeen = json::array();
  for (int i = 0; i < 17; ++i) {
    std::string stop = "s";
    stop += std::to_string(i);
    seventeen.push_back(stop);
  }
  CHECK_THAT(completion_error(with(base, "stop", seventeen)).second, Contains("at most 16"));
  CHECK(completion_error(with(base, "stop", "")).first == "stop");
  CHECK(completion_error(with(base, "stop", {"ok", ""})).first == "stop[1]");
  CHECK(completion_error(with(base, "stop", std::string(257, 'x'))).first == "stop");
  json ids = json::array();
  for (int i = 0; i < 65; ++i) ids.push_back(i);
  CHECK(completion_error(with(base, "stop_token_ids", ids)).first == "stop_token_ids");
}

TEST_CASE("fields the server knows but cannot honour are refused, not dropped", "[serve][protocol]") {
  CHECK(completion_error(with(base, "logit_bias", {{"50256", -100}})).first == "logit_bias");
  CHECK_NOTHROW(parse_completion_request(with(base, "logit_bias", json::object())));
  CHECK(completion_error(with(base, "suffix", "end")).first == "suffix");
  CHECK(completion_error(with(base, "best_of", 3)).first == "best_of");
  CHECK_NOTHROW(parse_completion_request(with(base, "best_of", 1)));
  CHECK(completion_error(with(base, "stream_options", {{"include_usage", true}})).first == "stream_options");
  CHECK(completion_error(with(with(base, "echo", true), "logprobs", 1)).first == "echo");
  const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  CHECK(chat_error(with(chat, "tools", {{{"type", "function"}}})).first == "tools");
  CHECK(chat_error(with(chat, "response_format", {{"type", "json_object"}})).first == "response_format.type");
  CHECK_NOTHROW(parse_chat_request(with(chat, "response_format", {{"type", "text"}})));
}

TEST_CASE("streaming options", "[serve][protocol]") {
  const CompletionRequest r =
      parse_completion_request({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  CHECK(r.stream);
  CHECK(r.stream_options.include_usage);
  CHECK_FALSE(r.stream_options.continuous_usage_stats);
  CHECK(completion_error({{"prompt", "x"}, {"stream", true}, {"stream_options", 3}}).first == "stream_options");
}

TEST_CASE("chat messages: roles, content strings and text parts", "[serve][protocol]") {
  const json body = {{"messages",
                      {{{"role", "system"}, {"content", "Be brief."}},
                       {{"role", "developer"}, {"content", "Rules."}},
                       {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hello "}}, {{"type", "text"}, {"text", "there"}}}}},
                       {{"role", "assistant"}, {"content", nullptr}}}},
                     {"max_completion_tokens", 9},
                     {"max_tokens", 50},
                     {"logprobs", true},
                     {"top_logprobs", 3}};
  const ChatRequest r = parse_chat_request(body);
  REQUIRE(r.messages.size() == 4);
  CHECK(r.messages[1].role == "system");
  CHECK(r.messages[2].content == "Hello there");
  CHECK(r.messages[3].content.empty());
  CHECK(r.max_tokens == 9);  // max_completion_tokens wins
  CHECK(r.logprobs);
  CHECK(r.params.logprobs == 3);
  CHECK(parse_chat_request({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"logprobs", true}}).params.logprobs == 0);

  CHECK(chat_error({{"model", "m"}}).first == "messages");
  CHECK(chat_error({{"messages", json::array()}}).first == "messages");
  CHECK(chat_error({{"messages", "hi"}}).first == "messages");
  CHECK(chat_error({{"messages", {{{"content", "x"}}}}}).first == "messages[0].role");
  CHECK(chat_error({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}).first == "messages[0].role");
  CHECK(chat_error({{"messages", {{{"role", "user"}}}}}).first == "messages[0].content");
  CHECK(chat_error({{"messages", {{{"role", "user"}, {"content", 3}}}}}).first == "messages[0].content");
  CHECK(chat_error({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}).first ==
        "messages[0].content[0].type");
  CHECK(chat_error({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}).first == "top_logprobs");
  CHECK(chat_error({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_completion_tokens", 0}}).first ==
        "max_completion_tokens");
}

TEST_CASE("max_tokens against the context: both numbers in the message", "[serve][protocol]") {
  CompletionRequest r = parse_completion_request({{"prompt", "x"}, {"max_tokens", 9000}});
  try {
    (void)resolve_max_tokens(r, false, 10, 8192, 8192);
    FAIL("no error");
  } catch (const ParamError& e) {
    CHECK(e.param() == "max_tokens");
    CHECK_THAT(e.what(), Contains("8192") && Contains("9010") && Contains("10 in the prompt") && Contains("9000 in the completion"));
  }
  CHECK(resolve_max_tokens(r, false, 10, 9010, 9010) == 9000);
  r.max_tokens.reset();
  CHECK(resolve_max_tokens(r, false, 10, 8192, 8192) == 16);     // completions: OpenAI's default
  CHECK(resolve_max_tokens(r, true, 10, 8192, 8192) == 8182);    // chat: what the context leaves
  CHECK(resolve_max_tokens(r, true, 10, 8192, 512) == 512);      // ...capped by the engine's slots
  CHECK(resolve_max_tokens(r, false, 8190, 8192, 8192) == 2);
  CHECK_THROWS_AS(resolve_max_tokens(r, false, 8192, 8192, 8192), ParamError);
  r.params.min_tokens = 20;
  CHECK_THROWS_WITH(resolve_max_tokens(r, false, 10, 8192, 8192), Contains("min_tokens"));
}

TEST_CASE("tokenize and detokenize bodies", "[serve][protocol]") {
  const TokenizeRequest t = parse_tokenize_request({{"prompt", "hi"}, {"add_special_tokens", false}});
  CHECK(t.prompt == "hi");
  CHECK_FALSE(t.add_special_tokens);
  CHECK(parse_tokenize_request({{"messages", {{{"role", "user"}, {"content", "x"}}}}}).messages.size() == 1);
  CHECK_THROWS_AS(parse_tokenize_request(json::object()), ParamError);
  CHECK_THROWS_AS(parse_tokenize_request({{"prompt", "x"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}), ParamError);
  CHECK(parse_detokenize_request({{"tokens", {1, 2}}}).tokens.size() == 2);
  CHECK_THROWS_AS(parse_detokenize_request({{"tokens", "12"}}), ParamError);
  CHECK_THROWS_AS(parse_detokenize_request({{"tokens", {-1}}}), ParamError);
  try {
    check_token_ids({1, 49152}, 49152, "tokens");
    FAIL("no error");
  } catch (const ParamError& e) {
    CHECK(e.param() == "tokens");
    CHECK_THAT(e.what(), Contains("49152") && Contains("tokens[1]"));
  }
}

TEST_CASE("errors map to OpenAI's shape and the right status", "[serve][protocol]") {
  const ApiError p = to_api_error(ParamError("top_p", "bad top_p"));
  CHECK(p.status == 400);
  const json j = p.to_json();
  CHECK(j["error"]["message"] == "bad top_p");
  CHECK(j["error"]["type"] == "invalid_request_error");
  CHECK(j["error"]["param"] == "top_p");
  CHECK(j["error"]["code"].is_null());
  CHECK(to_api_error(InvalidArgument("x")).status == 400);
  CHECK(to_api_error(TokenizerError("x")).status == 400);
  CHECK(to_api_error(ChatTemplateError("x")).status == 400);
  CHECK(to_api_error(NotFound("model", "model_not_found", "no")).status == 404);
  const ApiError s = to_api_error(ServiceError("queue_full", "full", 2));
  CHECK(s.status == 503);
  CHECK(s.retry_after_s == 2);
  CHECK(s.to_json()["error"]["code"] == "queue_full");
  CHECK(to_api_error(std::runtime_error("bug")).status == 500);
  CHECK(ApiError::unauthorized("no key").to_json()["error"]["type"] == "authentication_error");
}

TEST_CASE("a body is one JSON document: a NUL byte or anything after the document is a 400", "[serve][protocol]") {
  using namespace std::string_literals;
  CHECK(parse_json_body(R"({"prompt": "x"})")["prompt"] == "x");
  CHECK(parse_json_body(" \n{\"a\": 1} \r\n\t")["a"] == 1);
  auto body_error = [](const std::string& body) -> std::string {
    try {
      (void)parse_json_body(body);
    } catch (const ParamError& e) {
      CHECK(e.param() == "body");
      return e.what();
    }
    FAIL("no ParamError for a body of " << body.size() << " bytes");
    return {};
  };
  // nlohmann's parser alone stops at a NUL and returns what came before it
  CHECK_THAT(body_error("{\"prompt\": \"x\"}\0garbage"s), Contains("NUL byte at offset 15"));
  CHECK_THAT(body_error("{\"prompt\": \"x\"}\0"s), Contains("NUL"));
  CHECK_THAT(body_error("{\"prompt\": \"x\0y\"}"s), Contains("NUL byte at offset 13"));
  CHECK_THAT(body_error(R"({"prompt": "x"} {"prompt": "y"})"), Contains("not valid JSON"));
  CHECK_THAT(body_error(R"({"prompt": "x"}])"), Contains("not valid JSON"));
  CHECK_THAT(body_error(""), Contains("not valid JSON"));
}
