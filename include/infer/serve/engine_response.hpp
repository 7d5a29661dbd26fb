#pragma once
/// \file
/// `EngineResponse`: the response to one completions or chat request as the engines produce it — a
/// `ResponseSource` (http_message.hpp) that the transport polls when woken, so no thread waits on it.
///
/// First admission. The prompts go to the router's first candidate engine; when it refuses them (full,
/// failed, a shape or context it cannot take, or no admission within `admission_timeout`: a stalled loop)
/// they go to the next candidate. The first engine that admits them all serves the request; when every
/// candidate refused, the client gets a 503 if any was merely busy (it should retry), else the first
/// engine's 4xx. Then the `Exchange`'s output: streaming, a 200 head and server-sent events as tokens
/// arrive; otherwise the whole body once finished (a 500 when the engine failed the request after
/// admitting it). The engine thread's events reach the transport through the streams' waker.
///
/// `cancel()` — the client left — aborts whatever stage the request is in: still queued for admission,
/// waiting for a slot, prefilling or decoding; the engine thread aborts it at its next turn and its KV
/// blocks return to the pool.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/serve/api_error.hpp"
#include "infer/serve/engine_worker.hpp"
#include "infer/serve/exchange.hpp"
#include "infer/serve/http_message.hpp"
#include "infer/serve/metrics.hpp"
#include "infer/serve/openai_format.hpp"
#include "infer/serve/protocol.hpp"

namespace infer::serve {

/// What the router's choices add up to, for infer:router_requests_total and infer:router_fallbacks_total.
struct RoutingCounters {
  LabeledCounter routed;     ///< by the engine that served
  LabeledCounter fallbacks;  ///< by "first->served"
};

/// A generation request as the handler prepared it: tokenized, validated, its engines chosen.
struct EngineRequest {
  std::vector<std::vector<std::int32_t>> prompts;
  GenerationRequest request;            ///< sampling parameters, max_tokens as asked, stream
  bool chat = false;
  std::vector<std::size_t> candidates;  ///< engine indices, in the order to try
  ExchangeSetup setup;                  ///< the engine's tokenizer is filled in on admission
};

class EngineResponse final : public ResponseSource {
 public:
  /// `workers` and `counters` must outlive the response (the server owns them).
  EngineResponse(EngineRequest r, const std::vector<EngineWorker*>& workers, std::chrono::milliseconds admission_timeout,
                 RoutingCounters& counters)
      : r_(std::move(r)), workers_(workers), admission_timeout_(admission_timeout), counters_(counters) {}
  EngineResponse(const EngineResponse&) = delete;
  EngineResponse& operator=(const EngineResponse&) = delete;
  ~EngineResponse() override { cancel(); }

  void set_waker(std::function<void()> wake) override { waker_ = std::move(wake); }

  Progress poll() override {
    Progress p;
    try {
      if (!exchange_) admit(p);
      if (exchange_ && !p.done) take(p);
    } catch (const std::exception& e) {  // a bug: answer it rather than leave the client waiting
      if (!head_sent_) p.head = error_response(to_api_error(e));
      p.done = true;
    }
    head_sent_ = head_sent_ || p.head.has_value();
    return p;
  }

  [[nodiscard]] Clock::time_point deadline() const override {
    return exchange_ ? Clock::time_point::max() : admission_deadline_;
  }
  [[nodiscard]] std::string probe() const override { return std::string(sse_comment); }

  void cancel() noexcept override {
    if (exchange_) exchange_->cancel();
    for (auto& s : streams_) s->cancel();
  }

 private:
  /// Moves admission on: submits to the next candidate when none is trying, checks the one that is.
  void admit(Progress& p) {
    for (;;) {
      if (streams_.empty() && !submit_next()) {
        p.head = error_response(last_unavailable_    ? *last_unavailable_
                                : first_client_error_ ? *first_client_error_
                                                      : ApiError::internal("the router offered no engine"));
        p.done = true;
        return;
      }
      if (streams_.empty()) continue;  // that candidate refused at once
      std::optional<ApiError> refused;
      bool all_admitted = true;
      for (auto& s : streams_) {
        const auto state = s->state();
        if (state == RequestStream::State::rejected) {
          refused = s->rejection();
          break;
        }
        all_admitted = all_admitted && state != RequestStream::State::queued;
      }
      if (!refused && !all_admitted) {
        if (Clock::now() < admission_deadline_) return;  // the engine thread has not taken them yet
        refused = ApiError::unavailable(infer::detail::cat("engine '", engine().name(), "' did not admit the request within ",
                                                           admission_timeout_.count(), " ms"),
                                        "engine_stalled", 5);
      }
      if (refused) {
        refuse(*refused);
        continue;
      }
      EngineWorker& w = engine();
      counters_.routed.add(w.name());
      if (next_ > 0) counters_.fallbacks.add(workers_[r_.candidates.front()]->name() + "->" + w.name());
      r_.setup.tokenizer = w.tokenizer();
      exchange_ = std::make_unique<Exchange>(std::move(r_.setup), std::move(streams_));
      streams_.clear();
      return;
    }
  }

  /// Submits every prompt to the next candidate; false when none is left. A candidate that refuses at
  /// once (loading, draining, full, a bad shape for it) is recorded and leaves streams_ empty.
  bool submit_next() {
    if (next_ >= r_.candidates.size()) return false;
    EngineWorker& w = engine();
    try {
      const EngineInfo& info = w.info();
      for (const auto& ids : r_.prompts) check_token_ids(ids, info.vocab_size, "prompt");
      for (const auto& ids : r_.prompts) {
        SamplingParams p = r_.request.params;
        p.max_tokens = resolve_max_tokens(r_.request, r_.chat, static_cast<std::int64_t>(ids.size()), info.max_model_len,
                                          info.max_output);
        p.validate(static_cast<std::int32_t>(info.vocab_size));
        streams_.push_back(w.submit(ids, std::move(p)));
        streams_.back()->set_waker(waker_);  // before admit() looks at it: nothing is missed
      }
      admission_deadline_ = Clock::now() + admission_timeout_;
    } catch (const std::exception& e) {
      refuse(to_api_error(e));
    }
    return true;
  }

  /// The current candidate refused: cancel what it took, remember why, move on (not past a 404 or a
  /// 413, which every engine would answer alike).
  void refuse(const ApiError& err) {
    for (auto& s : streams_) s->cancel();
    streams_.clear();
    if (err.status == 503) last_unavailable_ = err;
    else if (!first_client_error_) first_client_error_ = err;
    next_ = err.status == 404 || err.status == 413 ? r_.candidates.size() : next_ + 1;
  }

  EngineWorker& engine() const { return *workers_[r_.candidates[next_]]; }

  void take(Progress& p) {
    if (exchange_->setup().stream) {
      if (!head_sent_) {
        HttpResponse head;
        head.content_type = "text/event-stream";
        head.header("Cache-Control", "no-cache").header("X-Infer-Engine", engine().name());
        p.head = std::move(head);
        p.chunked = true;
      }
      exchange_->poll(std::chrono::milliseconds(0), &p.data);
      if (exchange_->finished()) {
        p.data += exchange_->stream_tail();
        p.done = true;
      }
      return;
    }
    exchange_->poll(std::chrono::milliseconds(0), nullptr);
    if (!exchange_->finished()) return;
    HttpResponse whole;
    if (exchange_->error()) whole = error_response(ApiError::internal(*exchange_->error()));
    else whole.body = dump_body(exchange_->final_body());
    whole.header("X-Infer-Engine", engine().name());
    p.head = std::move(whole);
    p.done = true;
  }

  EngineRequest r_;
  const std::vector<EngineWorker*>& workers_;
  std::chrono::milliseconds admission_timeout_;
  RoutingCounters& counters_;
  std::function<void()> waker_;

  std::size_t next_ = 0;  ///< the candidate trying (or, once admitted, serving)
  std::vector<std::shared_ptr<RequestStream>> streams_;  ///< its streams while admission is pending
  Clock::time_point admission_deadline_ = Clock::time_point::max();
  std::optional<ApiError> first_client_error_, last_unavailable_;
  std::unique_ptr<Exchange> exchange_;
  bool head_sent_ = false;
};

}  // namespace infer::serve
