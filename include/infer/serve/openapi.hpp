#pragma once
/// \file
/// The server's OpenAPI 3.0 description (GET /openapi.json). It states what the parser accepts — types,
/// ranges, required fields — so generated clients and schema-driven fuzzers (schemathesis, in CI) see
/// the same contract the server enforces; a fuzzer that finds a request the schema allows and the
/// server answers with a 5xx has found a bug in one of the two.

#include <algorithm>
#include <limits>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "infer/sampling/sampling_params.hpp"
#include "infer/serve/protocol.hpp"

namespace infer::serve {

/// `max_choices`: the server's limit on choices per request (prompts × n), which bounds `n` here.
inline nlohmann::json openapi_document(const std::string& version, bool with_api_key,
                                       std::int64_t max_choices = RequestLimits::max_choices) {
  using nlohmann::json;
  auto ref = [](const char* name) { return json{{"$ref", std::string("#/components/schemas/") + name}}; };
  auto nullable = [](json s) {
    s["nullable"] = true;
    return s;
  };
  auto number = [&](double lo, double hi, bool lo_open = false) {
    json s{{"type", "number"}, {"minimum", lo}, {"maximum", hi}};
    if (lo_open) s["exclusiveMinimum"] = true;
    return nullable(s);
  };
  auto integer = [&](json lo, json hi = nullptr) {
    json s{{"type", "integer"}};
    if (!lo.is_null()) s["minimum"] = lo;
    if (!hi.is_null()) s["maximum"] = hi;
    return nullable(s);
  };
  const json str{{"type", "string"}};
  const json token_ids{{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}}};

  json sampling = {
      {"model", nullable(str)},
      {"max_tokens", integer(1)},
      {"min_tokens", integer(0)},
      {"temperature", number(0, 2)},
      {"top_p", number(0, 1, true)},
      {"top_k", integer(-1)},
      {"min_p", number(0, 1)},
      {"presence_penalty", number(-2, 2)},
      {"frequency_penalty", number(-2, 2)},
      {"repetition_penalty", nullable({{"type", "number"}, {"minimum", 0}, {"exclusiveMinimum", true}})},
      {"n", integer(1, std::min<std::int64_t>(SamplingParams::max_n, max_choices))},
      {"seed", integer(nullptr)},
      {"priority", nullable({{"type", "integer"}, {"minimum", std::numeric_limits<std::int32_t>::min()},
                             {"maximum", std::numeric_limits<std::int32_t>::max()},
                             {"description", "lower is served earlier (the paged engine's priority scheduler)"}})},
      {"tag", nullable({{"type", "string"}, {"maxLength", SamplingParams::max_tag_bytes},
                        {"description", "a label for scheduling policies and the step trace"}})},
      {"stop", nullable({{"oneOf",
                          {{{"type", "string"}, {"minLength", 1}, {"maxLength", SamplingParams::max_stop_bytes}},
                           {{"type", "array"},
                            {"maxItems", SamplingParams::max_stop_strings},
                            {"items", {{"type", "string"}, {"minLength", 1}, {"maxLength", SamplingParams::max_stop_bytes}}}}}}})},
      {"stop_token_ids", nullable({{"type", "array"}, {"maxItems", RequestLimits::max_stop_token_ids},
                                    {"items", {{"type", "integer"}, {"minimum", 0}}}})},
      {"ignore_eos", nullable({{"type", "boolean"}})},
      {"skip_special_tokens", nullable({{"type", "boolean"}})},
      {"include_stop_str_in_output", nullable({{"type", "boolean"}})},
      {"stream", nullable({{"type", "boolean"}})},
      {"stream_options", nullable({{"type", "object"},
                                   {"properties", {{"include_usage", {{"type", "boolean"}}},
                                                   {"continuous_usage_stats", {{"type", "boolean"}}}}}})},
      {"user", nullable(str)},
  };
  json completion_props = sampling;
  completion_props["prompt"] = {{"oneOf",
                                 {{{"type", "string"}},
                                  {{"type", "array"}, {"minItems", 1}, {"maxItems", RequestLimits::max_prompts},
                                   {"items", {{"type", "string"}}}},
                                  {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "integer"}, {"minimum", 0}}}},
                                  {{"type", "array"}, {"minItems", 1}, {"maxItems", RequestLimits::max_prompts},
                                   {"items", {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "integer"}, {"minimum", 0}}}}}}}}};
  completion_props["echo"] = nullable({{"type", "boolean"}});
  completion_props["logprobs"] = integer(0, SamplingParams::max_logprobs);
  json message = {{"type", "object"},
                  {"required", {"role", "content"}},
                  {"properties",
                   {{"role", {{"type", "string"}, {"enum", {"system", "developer", "user", "assistant"}}}},
                    {"content", {{"oneOf",
                                  {{{"type", "string"}},
                                   {{"type", "array"},
                                    {"items", {{"type", "object"},
                                               {"required", {"type", "text"}},
                                               {"properties", {{"type", {{"type", "string"}, {"enum", {"text"}}}},
                                                               {"text", {{"type", "string"}}}}}}}}}}}},
                    {"name", str}}}};
  json chat_props = sampling;
  chat_props["messages"] = {{"type", "array"}, {"minItems", 1}, {"maxItems", RequestLimits::max_messages}, {"items", ref("ChatMessage")}};
  chat_props["max_completion_tokens"] = integer(1);
  chat_props["logprobs"] = nullable({{"type", "boolean"}});
  chat_props["top_logprobs"] = integer(0, SamplingParams::max_logprobs);
  chat_props["add_generation_prompt"] = nullable({{"type", "boolean"}});

  json error = {{"type", "object"},
                {"required", {"error"}},
                {"properties",
                 {{"error", {{"type", "object"},
                             {"required", {"message", "type", "param", "code"}},
                             {"properties", {{"message", str}, {"type", str}, {"param", nullable(str)}, {"code", nullable(str)}}}}}}}};
  auto errors = [&](std::initializer_list<int> codes) {
    json r;
    for (int c : codes)
      r[std::to_string(c)] = {{"description", c == 503 ? "unavailable: loading, at capacity (see Retry-After) or shutting down"
                                             : c == 401 ? "missing or wrong API key"
                                             : c == 404 ? "unknown model"
                                             : c == 413 ? "request body too large"
                                                        : "invalid request"},
                              {"content", {{"application/json", {{"schema", ref("ErrorResponse")}}}}}};
    return r;
  };
  auto post = [&](const char* summary, const char* schema, std::initializer_list<int> codes, bool sse) {
    json ok = {{"description", "OK"}, {"content", {{"application/json", {{"schema", {{"type", "object"}}}}}}}};
    if (sse) ok["content"]["text/event-stream"] = {{"schema", {{"type", "string"}}}};
    json responses = errors(codes);
    responses["200"] = ok;
    json op = {{"summary", summary},
               {"requestBody", {{"required", true}, {"content", {{"application/json", {{"schema", ref(schema)}}}}}}},
               {"responses", responses}};
    return json{{"post", op}};
  };
  auto get = [&](const char* summary, const char* type, std::initializer_list<int> codes) {
    json responses = errors(codes);
    responses["200"] = {{"description", "OK"}, {"content", {{type, {{"schema", {{"type", std::string(type) == "text/plain" ? "string" : "object"}}}}}}}};
    return json{{"get", {{"summary", summary}, {"responses", responses}}}};
  };

  json doc = {
      {"openapi", "3.0.3"},
      {"info", {{"title", "infer OpenAI-compatible server"}, {"version", version}}},
      {"paths",
       {{"/v1/completions", post("Create a completion", "CompletionRequest", {400, 401, 404, 413, 503}, true)},
        {"/v1/chat/completions", post("Create a chat completion", "ChatCompletionRequest", {400, 401, 404, 413, 503}, true)},
        {"/v1/models", get("List the served models", "application/json", {401})},
        {"/tokenize", post("Tokenize a prompt or messages", "TokenizeRequest", {400, 404, 413, 503}, false)},
        {"/detokenize", post("Turn token ids into text", "DetokenizeRequest", {400, 404, 413, 503}, false)},
        {"/health", get("200 when ready; 503 while loading, when stalled or shutting down", "application/json", {503})},
        {"/metrics", get("Prometheus metrics", "text/plain", {})},
        {"/version", get("Server version", "application/json", {})},
        {"/openapi.json", get("This document", "application/json", {})}}},
      {"components",
       {{"schemas",
         {{"CompletionRequest", {{"type", "object"}, {"required", {"prompt"}}, {"properties", completion_props}}},
          {"ChatCompletionRequest", {{"type", "object"}, {"required", {"messages"}}, {"properties", chat_props}}},
          {"ChatMessage", message},
          {"TokenizeRequest",
           {{"type", "object"},
            {"required", {"prompt"}},
            {"properties", {{"model", nullable(str)}, {"prompt", str}, {"add_special_tokens", {{"type", "boolean"}}},
                            {"return_token_strs", {{"type", "boolean"}}}}}}},
          {"DetokenizeRequest",
           {{"type", "object"}, {"required", {"tokens"}}, {"properties", {{"model", nullable(str)}, {"tokens", token_ids}}}}},
          {"ErrorResponse", error}}}}},
  };
  if (with_api_key) {
    doc["components"]["securitySchemes"] = {{"bearer", {{"type", "http"}, {"scheme", "bearer"}}}};
    for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models"})
      for (auto& [method, op] : doc["paths"][p].items()) op["security"] = json::array({{{"bearer", json::array()}}});
  }
  return doc;
}

}  // namespace infer::serve
