#pragma once
/// \file
/// OpenAI response bodies: completions and chat completions (whole and as server-sent-event chunks),
/// `usage`, logprobs in each endpoint's shape, and the SSE framing. Field names and nesting follow the
/// OpenAI API reference and what vLLM returns, because clients parse them strictly (the `openai`
/// package builds pydantic models from these bodies).
///
/// The functions are pure (JSON in, JSON out), so the unit tests check them without a model or socket.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/engine/request_output.hpp"
#include "infer/serve/request_stream.hpp"
#include "infer/tokenizer/tokenizer.hpp"
#include "infer/tokenizer/utf8.hpp"

namespace infer::serve {

using nlohmann::json;

/// "cmpl-…" / "chatcmpl-…": unique per server run (a random prefix) and per request (a counter).
inline std::string make_response_id(std::string_view prefix) {
  static const std::uint64_t run = [] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<std::uint64_t> next{0};
  char buf[48];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(run),
                static_cast<unsigned long long>(next.fetch_add(1)));
  return std::string(prefix) + "-" + buf;
}

inline std::int64_t unix_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// OpenAI's finish reasons are "stop" and "length"; an aborted request has no client left to read it,
/// and a failed one is reported as an error, so those two names only appear in logs and metrics.
inline json finish_reason_json(FinishReason r) {
  return r == FinishReason::none ? json(nullptr) : json(std::string(to_string(r)));
}

/// One choice of a non-streaming response, accumulated from stream deltas.
struct ChoiceText {
  std::string text;
  std::vector<std::int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  FinishReason finish_reason = FinishReason::none;

  void add(const SampleDelta& d) {
    text += d.text;
    token_ids.insert(token_ids.end(), d.token_ids.begin(), d.token_ids.end());
    logprobs.insert(logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (d.finish_reason != FinishReason::none) finish_reason = d.finish_reason;
  }
};

/// A token's text for logprobs: its bytes, with a byte sequence cut inside a UTF-8 character shown as
/// U+FFFD (the raw bytes are in chat's `bytes` field).
/// Ids the tokenizer does not know (a model vocabulary larger than its tokenizer's) are shown as
/// "token_id:N", as for a model without a tokenizer.
inline bool has_text(const Tokenizer* tok, std::int32_t id) {
  return tok && id >= 0 && static_cast<std::size_t>(id) < tok->vocab_size();
}
inline std::string token_text(const Tokenizer* tok, std::int32_t id) {
  if (!has_text(tok, id)) return "token_id:" + std::to_string(id);
  return utf8::sanitize(tok->token_bytes(id));
}
inline json token_bytes_json(const Tokenizer* tok, std::int32_t id) {
  json b = json::array();
  if (has_text(tok, id))
    for (unsigned char c : tok->token_bytes(id)) b.push_back(static_cast<int>(c));
  return b;
}

/// A logprob as JSON: -inf (a token the sampler masked out) is not valid JSON, so it is clamped to
/// -9999.0 as vLLM does.
inline double logprob_value(float lp) {
  if (std::isnan(lp)) return 0.0;
  return lp < -9999.0f ? -9999.0 : static_cast<double>(lp);
}

/// Completions' logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
/// `offset` is where the first token's text starts in the choice's text.
inline json completion_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps, std::size_t offset,
                                std::int32_t top_n) {
  json tokens = json::array(), values = json::array(), top = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    const std::string t = token_text(tok, lp.token);
    tokens.push_back(t);
    values.push_back(logprob_value(lp.logprob));
    json alts = json::object();
    for (std::size_t i = 0; i < lp.top.size() && static_cast<std::int32_t>(i) < top_n; ++i)
      alts[token_text(tok, lp.top[i].first)] = logprob_value(lp.top[i].second);
    top.push_back(top_n > 0 ? alts : json(nullptr));
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", top}, {"text_offset", offsets}};
}

/// Chat's logprobs: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
inline json chat_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps, std::int32_t top_n) {
  json content = json::array();
  for (const auto& lp : lps) {
    json alts = json::array();
    for (std::size_t i = 0; i < lp.top.size() && static_cast<std::int32_t>(i) < top_n; ++i)
      alts.push_back({{"token", token_text(tok, lp.top[i].first)},
                      {"logprob", logprob_value(lp.top[i].second)},
                      {"bytes", token_bytes_json(tok, lp.top[i].first)}});
    content.push_back({{"token", token_text(tok, lp.token)},
                       {"logprob", logprob_value(lp.logprob)},
                       {"bytes", token_bytes_json(tok, lp.token)},
                       {"top_logprobs", alts}});
  }
  return {{"content", content}};
}

inline json usage_json(std::int64_t prompt_tokens, std::int64_t completion_tokens, std::int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

inline json completion_body(const std::string& id, std::int64_t created, const std::string& model, json choices,
                            json usage) {
  return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
          {"choices", std::move(choices)}, {"usage", std::move(usage)}};
}
inline json chat_body(const std::string& id, std::int64_t created, const std::string& model, json choices, json usage) {
  return {{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model},
          {"choices", std::move(choices)}, {"usage", std::move(usage)}};
}

inline json completion_choice(std::int64_t index, const std::string& text, json logprobs, FinishReason reason) {
  return {{"index", index}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish_reason_json(reason)}};
}
inline json chat_choice(std::int64_t index, const std::string& content, json logprobs, FinishReason reason) {
  return {{"index", index},
          {"message", {{"role", "assistant"}, {"content", content}}},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", finish_reason_json(reason)}};
}

/// A streamed chunk. `choices` may be empty (the usage chunk); `usage` is null on ordinary chunks when
/// the client asked for usage, and absent when it did not (as OpenAI does).
inline json completion_chunk(const std::string& id, std::int64_t created, const std::string& model, json choices) {
  return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}, {"choices", std::move(choices)}};
}
inline json chat_chunk(const std::string& id, std::int64_t created, const std::string& model, json choices) {
  return {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
          {"choices", std::move(choices)}};
}

/// One server-sent event carrying `data`. JSON dumps have no raw newlines, so one data line suffices.
/// Invalid UTF-8 cannot reach here (engine text is sanitized), but dump() replaces it rather than throw.
inline std::string sse_event(const json& data) {
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";
/// An SSE comment: clients ignore it (what the transport probes a half-closed client with).
inline constexpr std::string_view sse_comment = ":\n\n";

/// A JSON body as text, never throwing on bytes that are not UTF-8.
inline std::string dump_body(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace infer::serve
