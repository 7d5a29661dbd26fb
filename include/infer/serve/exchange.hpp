#pragma once
/// \file
/// `Exchange`: one HTTP request's responses, assembled from its engine requests' streams. A completions
/// request with k prompts and n samples is k engine requests and k·n choices (choice index
/// prompt·n + sample, as OpenAI numbers them); a chat request is one engine request.
///
/// Streaming, `poll()` turns each delta into an SSE chunk as it arrives (chat opens every choice with
/// `{"role": "assistant"}`), and `stream_tail()` adds the usage chunk when asked for and `[DONE]`.
/// Otherwise the deltas accumulate and `final_body()` is the whole response. The destructor cancels
/// every engine request that has not finished: however a handler leaves (client gone, write error,
/// exception), the engine thread aborts what it no longer needs and the KV blocks return.
///
/// No sockets here: the server calls poll() when the streams' waker says something arrived
/// (engine_response.hpp), and the unit tests drive it by pushing events into the streams directly.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/serve/openai_format.hpp"
#include "infer/serve/protocol.hpp"
#include "infer/serve/request_stream.hpp"

namespace infer::serve {

struct ExchangeSetup {
  bool chat = false;
  bool stream = false;
  StreamOptions stream_options;
  bool logprobs = false;
  std::int32_t top_logprobs = 0;
  std::int32_t n = 1;
  std::string id;       ///< cmpl-... / chatcmpl-...
  std::string model;    ///< the served model name
  std::int64_t created = 0;
  const Tokenizer* tokenizer = nullptr;
  std::vector<std::string> echo;             ///< per prompt: text prepended to its choices (completions echo)
  std::vector<std::int32_t> prompt_tokens;   ///< per prompt
};

class Exchange {
 public:
  Exchange(ExchangeSetup setup, std::vector<std::shared_ptr<RequestStream>> streams)
      : s_(std::move(setup)), streams_(std::move(streams)), done_(streams_.size(), false),
        cached_(streams_.size(), 0), choices_(streams_.size() * static_cast<std::size_t>(s_.n)),
        opened_(choices_.size(), false) {
    s_.prompt_tokens.resize(streams_.size(), 0);
    s_.echo.resize(streams_.size());
    for (std::size_t i = 0; i < choices_.size(); ++i) choices_[i].text = s_.echo[i / static_cast<std::size_t>(s_.n)];
  }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  ~Exchange() { cancel(); }

  /// Aborts every engine request of this exchange that has not finished.
  void cancel() noexcept {
    for (std::size_t i = 0; i < streams_.size(); ++i)
      if (!done_[i]) streams_[i]->cancel();
  }

  [[nodiscard]] bool finished() const {
    for (bool d : done_)
      if (!d) return false;
    return true;
  }
  [[nodiscard]] const ExchangeSetup& setup() const noexcept { return s_; }
  [[nodiscard]] const std::optional<std::string>& error() const noexcept { return error_; }
  [[nodiscard]] const std::vector<ChoiceText>& choices() const noexcept { return choices_; }

  /// Waits up to `wait` for the next events and takes them; streaming, appends their SSE chunks to
  /// `sse`. Returns whether anything arrived.
  bool poll(std::chrono::milliseconds wait, std::string* sse) {
    if (s_.stream && sse && !started_) {
      started_ = true;
      for (std::size_t c = 0; c < choices_.size(); ++c) {
        if (s_.chat) {
          open_choice(c, *sse);
        } else if (const std::string& echo = s_.echo[c / static_cast<std::size_t>(s_.n)]; !echo.empty()) {
          json choice = completion_choice(static_cast<std::int64_t>(c), echo, nullptr, FinishReason::none);
          *sse += sse_event(with_usage(completion_chunk(s_.id, s_.created, s_.model, json::array({choice}))));
        }
      }
    }
    bool any = false;
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      if (done_[i]) continue;
      events_.clear();
      // Wait on the first unfinished stream only; the others are drained without waiting.
      if (!streams_[i]->wait_events(any ? std::chrono::milliseconds(0) : wait, events_)) continue;
      any = true;
      for (const StreamEvent& ev : events_) take(i, ev, sse);
    }
    return any;
  }

  /// The end of a stream: the usage chunk (when asked for) and [DONE].
  [[nodiscard]] std::string stream_tail() const {
    std::string out;
    if (error_) out += sse_event(ApiError::internal(*error_).to_json());
    if (s_.stream_options.include_usage) {
      json chunk = s_.chat ? chat_chunk(s_.id, s_.created, s_.model, json::array())
                           : completion_chunk(s_.id, s_.created, s_.model, json::array());
      chunk["usage"] = usage();
      out += sse_event(chunk);
    }
    out += sse_done;
    return out;
  }

  [[nodiscard]] json usage() const {
    std::int64_t prompt = 0, completion = 0, cached = 0;
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      prompt += s_.prompt_tokens[i];
      cached += cached_[i];
    }
    for (const auto& c : choices_) completion += static_cast<std::int64_t>(c.token_ids.size());
    return usage_json(prompt, completion, cached);
  }

  /// The non-streaming response (call when finished()).
  [[nodiscard]] json final_body() const {
    json choices = json::array();
    for (std::size_t c = 0; c < choices_.size(); ++c) {
      const ChoiceText& ch = choices_[c];
      const auto idx = static_cast<std::int64_t>(c);
      if (s_.chat) {
        choices.push_back(chat_choice(idx, ch.text, s_.logprobs ? chat_logprobs(s_.tokenizer, ch.logprobs, s_.top_logprobs)
                                                                : json(nullptr),
                                      ch.finish_reason));
      } else {
        const std::size_t offset = s_.echo[c / static_cast<std::size_t>(s_.n)].size();
        choices.push_back(completion_choice(
            idx, ch.text, s_.logprobs ? completion_logprobs(s_.tokenizer, ch.logprobs, offset, s_.top_logprobs) : json(nullptr),
            ch.finish_reason));
      }
    }
    return s_.chat ? chat_body(s_.id, s_.created, s_.model, std::move(choices), usage())
                   : completion_body(s_.id, s_.created, s_.model, std::move(choices), usage());
  }

 private:
  void open_choice(std::size_t c, std::string& sse) {
    if (opened_[c]) return;
    opened_[c] = true;
    json choice = {{"index", c}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    sse += sse_event(with_usage(chat_chunk(s_.id, s_.created, s_.model, json::array({choice}))));
  }

  json with_usage(json chunk) const {
    if (s_.stream_options.continuous_usage_stats) chunk["usage"] = usage();
    else if (s_.stream_options.include_usage) chunk["usage"] = nullptr;
    return chunk;
  }

  void take(std::size_t stream, const StreamEvent& ev, std::string* sse) {
    if (ev.cached_prompt_tokens > cached_[stream]) cached_[stream] = ev.cached_prompt_tokens;
    if (ev.prompt_tokens > 0) s_.prompt_tokens[stream] = ev.prompt_tokens;
    for (const SampleDelta& d : ev.samples) {
      const std::size_t c = stream * static_cast<std::size_t>(s_.n) + static_cast<std::size_t>(d.index);
      if (c >= choices_.size()) continue;
      const std::size_t offset = choices_[c].text.size();
      choices_[c].add(d);
      if (!s_.stream || !sse) continue;
      if (d.text.empty() && d.token_ids.empty() && d.finish_reason == FinishReason::none) continue;
      const FinishReason shown_reason = d.finish_reason == FinishReason::abort || d.finish_reason == FinishReason::error
                                            ? FinishReason::none
                                            : d.finish_reason;
      if (s_.chat) {
        json delta = json::object();
        if (!d.text.empty()) delta["content"] = d.text;
        json choice = {{"index", c}, {"delta", delta},
                       {"logprobs", s_.logprobs ? chat_logprobs(s_.tokenizer, d.logprobs, s_.top_logprobs) : json(nullptr)},
                       {"finish_reason", finish_reason_json(shown_reason)}};
        *sse += sse_event(with_usage(chat_chunk(s_.id, s_.created, s_.model, json::array({choice}))));
      } else {
        json choice = completion_choice(
            static_cast<std::int64_t>(c), d.text,
            s_.logprobs ? completion_logprobs(s_.tokenizer, d.logprobs, offset, s_.top_logprobs) : json(nullptr),
            shown_reason);
        *sse += sse_event(with_usage(completion_chunk(s_.id, s_.created, s_.model, json::array({choice}))));
      }
    }
    if (ev.finished) {
      done_[stream] = true;
      if (!ev.error.empty() && !error_) error_ = ev.error;
      // Only the server aborts a request whose client is still there: when it stops before the
      // request could finish (the drain timeout ran out).
      for (const SampleDelta& d : ev.samples)
        if (d.finish_reason == FinishReason::abort && !error_)
          error_ = "the request was aborted: the server is shutting down";
    }
  }

  ExchangeSetup s_;
  std::vector<std::shared_ptr<RequestStream>> streams_;
  std::vector<bool> done_;
  std::vector<std::int32_t> cached_;
  std::vector<ChoiceText> choices_;
  std::vector<bool> opened_;
  std::vector<StreamEvent> events_;
  std::optional<std::string> error_;
  bool started_ = false;
};

}  // namespace infer::serve
