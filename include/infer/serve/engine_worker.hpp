#pragma once
/// \file
/// `EngineWorker`: the engine thread. It loads the model, then loops: take new submissions (admit or
/// reject each), abort requests whose clients went away, run one `step()`, hand each request's deltas
/// to its `RequestStream`, and publish a snapshot of the engine's counters for /metrics and /health.
/// Nothing else touches the engine: HTTP handlers only call `submit()` and read their streams.
///
/// Back-pressure: at most `max_waiting` requests may wait for a slot (submitted but not yet running);
/// beyond that `submit()` throws ServiceError("queue_full") — the server's 503 with Retry-After — instead
/// of letting latency grow without bound.
///
/// Liveness: the loop stamps a heartbeat on every turn (at least every 100 ms when idle). `health()`
/// reports a stall when requests are outstanding and the heartbeat is older than `stall_timeout_s`:
/// a step that never returns is not a healthy engine, whatever the process looks like from outside.
///
/// Shutdown: `begin_drain()` refuses new submissions while running ones finish; `stop()` aborts what is
/// left, runs the steps that return its blocks, and joins the thread (the engine dies on its own thread).
///
/// Tests: `hold()` parks the loop between two turns until `release()`, so a test can pin a state (work
/// queued behind a stalled engine, a request cancelled before admission, a drain with work outstanding)
/// that would otherwise last only as long as the machine is slow. The server offers it only with
/// --enable-test-hooks.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "infer/serve/api_error.hpp"
#include "infer/engine/engine_registry.hpp"
#include "infer/serve/metrics.hpp"
#include "infer/serve/request_stream.hpp"

namespace infer::serve {

struct WorkerOptions {
  std::string name = "default";       ///< the engine's name in metrics, headers and the router's config
  std::size_t max_waiting = 256;      ///< requests waiting for a slot before submit() refuses (503)
  double stall_timeout_s = 5.0;       ///< outstanding work and no loop progress for this long = unhealthy
  int retry_after_s = 1;              ///< Retry-After of a queue-full 503
};

/// The engine's state as the engine thread last published it.
struct WorkerSnapshot {
  EngineStats stats;
  KvStats kv;
  std::size_t running = 0;   ///< sequences the scheduler runs
  std::size_t waiting = 0;   ///< requests waiting for a slot (in the scheduler or not yet admitted)
  std::size_t live = 0;      ///< admitted requests not finished
  double seconds_since_progress = 0;
};

struct Health {
  bool ok = false;
  std::string code;     ///< loading, load_failed, engine_stalled, engine_failed, shutting_down; empty when ok
  std::string message;
};

class EngineWorker {
 public:
  enum class State { created, loading, ready, failed, stopped };
  using Factory = std::function<std::unique_ptr<EngineHandle>()>;

  EngineWorker(Factory factory, WorkerOptions options) : factory_(std::move(factory)), options_(std::move(options)) {
    require<InvalidArgument>(options_.max_waiting >= 1, "max_waiting = 0: at least one request must be able to wait");
    require<InvalidArgument>(options_.stall_timeout_s > 0, "stall_timeout_s = ", options_.stall_timeout_s, " must be > 0");
  }
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;
  ~EngineWorker() { stop(); }

  /// Starts the engine thread, which loads the model; returns at once (health() says "loading").
  void start() {
    std::lock_guard lock(mu_);
    if (thread_.joinable() || state_ != State::created) return;
    state_ = State::loading;
    beat();
    thread_ = std::thread([this] { run(); });
  }

  /// Waits until the model is loaded or failed to load; true when ready.
  bool wait_loaded(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return state_ != State::loading && state_ != State::created; });
    return state_ == State::ready;
  }

  [[nodiscard]] State state() const {
    std::lock_guard lock(mu_);
    return state_;
  }
  [[nodiscard]] std::string load_error() const {
    std::lock_guard lock(mu_);
    return error_;
  }
  [[nodiscard]] const std::string& name() const noexcept { return options_.name; }
  [[nodiscard]] const WorkerOptions& options() const noexcept { return options_; }

  /// Fixed once ready (ServiceError before).
  [[nodiscard]] const EngineInfo& info() const {
    require_ready();
    return info_;
  }
  /// A copy of the model's tokenizer (shared tables, thread-safe), or nullptr when it has none.
  [[nodiscard]] const Tokenizer* tokenizer() const {
    require_ready();
    return tokenizer_ ? &*tokenizer_ : nullptr;
  }

  /// Queues a request for the engine thread. ServiceError when loading, draining, failed, or when the
  /// waiting queue is full; the stream reports admission (or the engine's InvalidArgument) soon after.
  std::shared_ptr<RequestStream> submit(std::vector<std::int32_t> prompt, SamplingParams params) {
    auto stream = std::make_shared<RequestStream>();
    {
      std::lock_guard lock(mu_);
      check_accepting_locked();
      const std::size_t waiting = beyond_slots(snapshot_.waiting + pending_.size() + admitting_, snapshot_.running);
      if (waiting >= options_.max_waiting) {
        metrics_.rejected.add("queue_full");
        throw ServiceError("queue_full",
                           infer::detail::cat("the server is at capacity: ", waiting, " requests are waiting for engine '",
                                              options_.name, "' (max_waiting = ", options_.max_waiting, "); retry later"),
                           options_.retry_after_s);
      }
      pending_.push_back(Submission{std::move(prompt), std::move(params), stream, Clock::now()});
      outstanding_.fetch_add(1);
    }
    cv_.notify_all();
    return stream;
  }

  /// Whether submit() would refuse for capacity right now (the router's cheap pre-check).
  [[nodiscard]] bool full() const {
    std::lock_guard lock(mu_);
    return state_ == State::ready &&
           beyond_slots(snapshot_.waiting + pending_.size() + admitting_, snapshot_.running) >= options_.max_waiting;
  }

  [[nodiscard]] Health health() const {
    std::lock_guard lock(mu_);
    switch (state_) {
      case State::created:
      case State::loading: return {false, "loading", "the model is loading"};
      case State::failed: return {false, "engine_failed", "the engine failed: " + error_};
      case State::stopped: return {false, "shutting_down", "the engine has stopped"};
      case State::ready: break;
    }
    if (draining_) return {false, "shutting_down", "the server is shutting down"};
    const double idle = seconds_since_beat();
    if (outstanding_.load() > 0 && idle > options_.stall_timeout_s)
      return {false, "engine_stalled",
              infer::detail::cat("engine '", options_.name, "' has made no progress for ", idle, " s with ",
                                 outstanding_.load(), " requests outstanding (stall timeout ", options_.stall_timeout_s,
                                 " s)")};
    return {true, "", "ok"};
  }

  [[nodiscard]] WorkerSnapshot snapshot() const {
    std::lock_guard lock(mu_);
    WorkerSnapshot s = snapshot_;
    s.waiting += pending_.size() + admitting_;
    s.seconds_since_progress = seconds_since_beat();
    return s;
  }
  /// Requests submitted and not finished (queued, waiting or running).
  [[nodiscard]] std::size_t outstanding() const noexcept { return outstanding_.load(); }
  [[nodiscard]] RequestMetricsSet& metrics() noexcept { return metrics_; }

  /// New submissions are refused (ServiceError "shutting_down"); running requests go on.
  void begin_drain() {
    std::lock_guard lock(mu_);
    draining_ = true;
  }
  [[nodiscard]] bool draining() const {
    std::lock_guard lock(mu_);
    return draining_;
  }

  // ---- test hook: holding the loop ------------------------------------------------------------------

  /// The loop parks at the top of its next turn (after the step in progress, if any) and stays there:
  /// no admission, no abort of cancelled requests, no step, no heartbeat. Submissions still queue, count
  /// as waiting and outstanding, and are refused beyond max_waiting, so health() turns engine_stalled
  /// after stall_timeout_s exactly as for a step that does not return. stop() ends a hold.
  void hold() {
    {
      std::lock_guard lock(mu_);
      hold_ = true;
    }
    cv_.notify_all();
  }
  /// Ends hold(): the loop takes what queued meanwhile at the turn it resumes with.
  void release() {
    {
      std::lock_guard lock(mu_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  /// Waits until the loop is parked by hold(); false when it is not within `timeout` (hold() not called,
  /// the model still loading, a step that has not returned, or the engine failed or stopped).
  bool wait_held(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return held_ || !hold_ || state_ == State::failed || state_ == State::stopped; });
    return held_;
  }
  /// Whether the loop is parked by hold() now.
  [[nodiscard]] bool held() const {
    std::lock_guard lock(mu_);
    return held_;
  }

  /// Aborts every request left, returns their blocks, and joins the engine thread.
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      draining_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Submission {
    std::vector<std::int32_t> prompt;
    SamplingParams params;
    std::shared_ptr<RequestStream> stream;
    Clock::time_point submitted;
  };
  struct Live {
    std::shared_ptr<RequestStream> stream;
    Clock::time_point submitted;
  };

  /// Of `waiting` requests not yet running, those that will still wait once the free slots (up to
  /// max_num_seqs sequences) are filled at the next step. A burst that arrives between two steps is
  /// then not refused while slots stand empty; only what would really queue counts against max_waiting.
  [[nodiscard]] std::size_t beyond_slots(std::size_t waiting, std::size_t running) const {
    const auto slots = static_cast<std::size_t>(std::max(info_.max_num_seqs, 0));
    const std::size_t free = slots > running ? slots - running : 0;
    return waiting > free ? waiting - free : 0;
  }

  void require_ready() const {
    if (state_ready_.load(std::memory_order_acquire)) return;
    const Health h = health();
    throw ServiceError(h.code.empty() ? "loading" : h.code, h.message, 5);
  }

  void check_accepting_locked() {
    auto refuse = [&](const char* code, std::string msg, int retry) {
      metrics_.rejected.add(code);
      throw ServiceError(code, msg, retry);
    };
    if (state_ == State::loading || state_ == State::created) refuse("loading", "the model is still loading", 5);
    if (state_ == State::failed) refuse("engine_failed", "the engine failed: " + error_, 5);
    if (draining_ || state_ == State::stopped) refuse("shutting_down", "the server is shutting down", 5);
  }

  void beat() {
    heartbeat_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
  }
  [[nodiscard]] double seconds_since_beat() const {
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    return static_cast<double>(now - heartbeat_ns_.load()) * 1e-9;
  }

  void fail(const std::string& why) {
    std::lock_guard lock(mu_);
    state_ = State::failed;
    error_ = why;
  }

  void run() {
    std::unique_ptr<EngineHandle> engine;
    try {
      engine = factory_();
      info_ = engine->info();
      if (const Tokenizer* t = engine->tokenizer()) tokenizer_.emplace(*t);
    } catch (const std::exception& e) {
      fail(e.what());
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard lock(mu_);
      state_ = State::ready;
      publish_locked(*engine);
    }
    state_ready_.store(true, std::memory_order_release);
    cv_.notify_all();
    beat();

    try {
      loop(*engine);
    } catch (const std::exception& e) {
      // A bug or a broken invariant in the engine: fail every request and refuse new ones.
      fail(infer::detail::cat("engine loop: ", e.what()));
      outstanding_.fetch_sub(live_.size());
      for (auto& [id, l] : live_) l.stream->push(StreamEvent{{}, true, infer::detail::cat("engine failed: ", e.what()), 0, 0});
      live_.clear();
    }
    std::deque<Submission> left;
    {
      std::lock_guard lock(mu_);
      left.swap(pending_);
      if (state_ != State::failed) state_ = State::stopped;
    }
    for (auto& s : left) {
      outstanding_.fetch_sub(1);
      s.stream->reject(ApiError::unavailable("the server is shutting down", "shutting_down", 5));
    }
    engine.reset();  // the engine dies on the thread that used it
  }

  void loop(EngineHandle& engine) {
    std::deque<Submission> incoming;
    for (;;) {
      bool stopping = false;
      {
        std::unique_lock lock(mu_);
        if (!engine.has_unfinished() && pending_.empty() && !stop_ && !hold_)
          cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return !pending_.empty() || stop_ || hold_; });
        if (hold_ && !stop_) {
          held_ = true;
          cv_.notify_all();  // wait_held()
          cv_.wait(lock, [&] { return !hold_ || stop_; });
          held_ = false;
        }
        incoming.swap(pending_);
        admitting_ = incoming.size();  // still counted as waiting by submit() until published below
        stopping = stop_;
      }
      beat();
      if (!incoming.empty()) {
        for (auto& sub : incoming) admit(engine, sub, stopping);
        incoming.clear();
        std::lock_guard lock(mu_);
        publish_locked(engine);
      }
      for (auto& [id, l] : live_)
        if (stopping || l.stream->cancelled()) engine.abort(id);  // ignored when already aborted

      if (engine.has_unfinished()) dispatch(engine.step());
      beat();
      {
        std::lock_guard lock(mu_);
        publish_locked(engine);
      }
      if (stopping && live_.empty() && !engine.has_unfinished()) return;
    }
  }

  void admit(EngineHandle& engine, Submission& sub, bool stopping) {
    auto reject = [&](ApiError e, const char* why) {
      metrics_.rejected.add(why);
      outstanding_.fetch_sub(1);  // before the handler can see the outcome
      sub.stream->reject(std::move(e));
    };
    if (stopping) return reject(ApiError::unavailable("the server is shutting down", "shutting_down", 5), "shutting_down");
    if (sub.stream->cancelled()) return reject(ApiError::bad_request("the client cancelled the request"), "cancelled");
    if (beyond_slots(engine.num_waiting(), engine.num_running()) >= options_.max_waiting)
      return reject(ApiError::unavailable(infer::detail::cat("the server is at capacity: ", engine.num_waiting(),
                                                             " requests are waiting for engine '", options_.name,
                                                             "'; retry later"),
                                          "queue_full", options_.retry_after_s),
                    "queue_full");
    try {
      const RequestId id = engine.add_request(std::move(sub.prompt), std::move(sub.params));
      live_.emplace(id, Live{sub.stream, sub.submitted});
      sub.stream->admit(id);
    } catch (const std::exception& e) {
      reject(to_api_error(e), "invalid");
    }
  }

  void dispatch(const std::vector<RequestOutput>& outs) {
    const auto now = Clock::now();
    for (const RequestOutput& out : outs) {
      auto it = live_.find(out.id);
      if (it == live_.end()) continue;
      RequestStream& s = *it->second.stream;
      StreamEvent ev = make_event(out, s.reported_finish);
      bool tokens = false;
      for (const auto& d : ev.samples) tokens = tokens || !d.token_ids.empty();
      if (tokens) {
        if (!s.last_token_at) metrics_.ttft.observe(std::chrono::duration<double>(now - it->second.submitted).count());
        else metrics_.itl.observe(std::chrono::duration<double>(now - *s.last_token_at).count());
        s.last_token_at = now;
      }
      const bool finished = ev.finished;
      if (finished) {
        const FinishReason r = !out.error.empty() ? FinishReason::error
                               : out.outputs.empty() ? FinishReason::abort
                                                     : out.outputs.front().finish_reason;
        metrics_.finished.add(std::string(to_string(r)));
        metrics_.e2e.observe(std::chrono::duration<double>(now - it->second.submitted).count());
      }
      auto stream = it->second.stream;
      if (finished) {
        live_.erase(it);
        outstanding_.fetch_sub(1);  // before the handler can see the outcome
      }
      stream->push(std::move(ev));
    }
  }

  void publish_locked(const EngineHandle& engine) {
    snapshot_.stats = engine.stats();
    snapshot_.kv = engine.kv_stats();
    snapshot_.running = engine.num_running();
    snapshot_.waiting = engine.num_waiting();
    snapshot_.live = live_.size();
    admitting_ = 0;
  }

  Factory factory_;
  WorkerOptions options_;
  RequestMetricsSet metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::created;
  std::string error_;
  bool draining_ = false;
  bool stop_ = false;
  bool hold_ = false;  ///< hold() asked the loop to park
  bool held_ = false;  ///< the loop is parked
  std::deque<Submission> pending_;
  std::size_t admitting_ = 0;  ///< taken from pending_ by the engine thread, not yet in the snapshot
  WorkerSnapshot snapshot_;

  std::atomic<bool> state_ready_{false};
  std::atomic<std::size_t> outstanding_{0};
  std::atomic<std::int64_t> heartbeat_ns_{0};
  EngineInfo info_;                       ///< written once before state_ready_
  std::optional<Tokenizer> tokenizer_;    ///< written once before state_ready_

  // The engine thread's own.
  std::unordered_map<RequestId, Live> live_;
  std::thread thread_;
};

}  // namespace infer::serve
