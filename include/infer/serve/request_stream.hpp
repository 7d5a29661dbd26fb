#pragma once
/// \file
/// `RequestStream`: the channel between one HTTP handler and the engine thread, for one engine request.
///
/// The engine is not thread-safe, so only the engine thread touches it. A handler submits a prompt and
/// gets a RequestStream back; the engine thread admits it (or rejects it with an ApiError), then pushes
/// a `StreamEvent` per step in which the request produced tokens or finished. The handler reads events
/// with a bounded wait and, when its client goes away, calls `cancel()`: the engine thread sees the flag
/// between steps and aborts the request, so its KV blocks return to the pool at once.
///
/// A handler on an event loop does not wait: it gives the stream a waker (`set_waker`), which the engine
/// thread calls after each admission, rejection and event, and reads with a zero wait when woken.
///
/// Events carry deltas, not the cumulative output the engine reports, so a long generation costs the
/// channel O(tokens) rather than O(tokens²); a non-streaming handler concatenates them.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "infer/engine/request_output.hpp"
#include "infer/serve/api_error.hpp"

namespace infer::serve {

/// What one sample of a request added in one step.
struct SampleDelta {
  std::int32_t index = 0;
  std::string text;
  std::vector<std::int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  ///< one per new token, when the request asked for logprobs
  FinishReason finish_reason = FinishReason::none;  ///< set in the event where this sample finished
};

struct StreamEvent {
  std::vector<SampleDelta> samples;  ///< only the samples that changed
  bool finished = false;             ///< the request is over: no more events
  std::string error;                 ///< the engine failed the request (finish reason error)
  std::int32_t prompt_tokens = 0;
  std::int32_t cached_prompt_tokens = 0;
};

/// Turns one engine output into a delta event. `reported` remembers which samples' finish was already
/// sent (an n > 1 request keeps reporting a finished sample while its siblings run).
inline StreamEvent make_event(const RequestOutput& out, std::vector<bool>& reported) {
  StreamEvent ev;
  ev.finished = out.finished;
  ev.error = out.error;
  ev.prompt_tokens = out.metrics.prompt_tokens;
  ev.cached_prompt_tokens = out.metrics.cached_prompt_tokens;
  if (reported.size() < out.outputs.size()) reported.resize(out.outputs.size(), false);
  for (const CompletionOutput& o : out.outputs) {
    const auto i = static_cast<std::size_t>(o.index);
    const bool newly_finished = o.finished() && !reported[i];
    if (o.delta_token_ids.empty() && o.delta_text.empty() && !newly_finished) continue;
    SampleDelta d;
    d.index = o.index;
    d.text = o.delta_text;
    d.token_ids = o.delta_token_ids;
    if (!o.logprobs.empty() && o.logprobs.size() >= o.delta_token_ids.size())
      d.logprobs.assign(o.logprobs.end() - static_cast<std::ptrdiff_t>(o.delta_token_ids.size()), o.logprobs.end());
    if (newly_finished) {
      d.finish_reason = o.finish_reason;
      reported[i] = true;
    }
    ev.samples.push_back(std::move(d));
  }
  return ev;
}

class RequestStream {
 public:
  enum class State { queued, admitted, rejected, finished };

  // ---- the handler's side --------------------------------------------------------------------------

  /// Waits until the engine thread has admitted or rejected the request, at most `timeout`.
  /// Returns the state then (queued when the wait timed out).
  State wait_admission(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return state_ != State::queued; });
    return state_;
  }

  /// Moves the events that arrived into `out`, waiting at most `timeout` for the first one.
  /// Returns false when nothing came.
  bool wait_events(std::chrono::milliseconds timeout, std::vector<StreamEvent>& out) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty() || state_ == State::rejected; });
    if (events_.empty()) return false;
    while (!events_.empty()) {
      out.push_back(std::move(events_.front()));
      events_.pop_front();
    }
    return true;
  }

  /// `wake` is called on the engine thread, under the stream's lock, after every admission, rejection and
  /// event from now on (what came before, a read sees already): it must be quick and must not call back
  /// into the stream.
  void set_waker(std::function<void()> wake) {
    std::lock_guard lock(mu_);
    waker_ = std::move(wake);
  }

  /// The client is gone (or the handler gave up): the engine thread aborts the request.
  void cancel() noexcept { cancelled_.store(true, std::memory_order_release); }
  [[nodiscard]] bool cancelled() const noexcept { return cancelled_.load(std::memory_order_acquire); }

  [[nodiscard]] State state() const {
    std::lock_guard lock(mu_);
    return state_;
  }
  [[nodiscard]] bool done() const {
    std::lock_guard lock(mu_);
    return state_ == State::finished || state_ == State::rejected;
  }
  [[nodiscard]] ApiError rejection() const {
    std::lock_guard lock(mu_);
    return rejection_;
  }
  [[nodiscard]] RequestId id() const {
    std::lock_guard lock(mu_);
    return id_;
  }

  // ---- the engine thread's side --------------------------------------------------------------------

  void admit(RequestId id) {
    {
      std::lock_guard lock(mu_);
      id_ = id;
      state_ = State::admitted;
      if (waker_) waker_();
    }
    cv_.notify_all();
  }
  void reject(ApiError e) {
    {
      std::lock_guard lock(mu_);
      rejection_ = std::move(e);
      state_ = State::rejected;
      if (waker_) waker_();
    }
    cv_.notify_all();
  }
  void push(StreamEvent ev) {
    {
      std::lock_guard lock(mu_);
      if (ev.finished) state_ = State::finished;
      events_.push_back(std::move(ev));
      if (waker_) waker_();
    }
    cv_.notify_all();
  }

  /// Engine-thread bookkeeping for make_event().
  std::vector<bool> reported_finish;
  std::optional<Clock::time_point> last_token_at;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  State state_ = State::queued;
  ApiError rejection_;
  RequestId id_ = 0;
  std::function<void()> waker_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace infer::serve
