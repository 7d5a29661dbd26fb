// A completions request's response as a ResponseSource, driven as the transport drives it — poll() when the
// waker fires, never blocking — over engine workers with a scripted engine (one token a step per request,
// `slots` requests at a time). What it checks: the head and body of whole and streamed responses; the
// waker firing on admission and on every event; cancel() aborting at every stage (queued for admission,
// waiting for a slot, running), after which nothing is left outstanding; fallback to the next engine when
// the first is full; a 503 when an engine does not admit within the admission timeout.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "infer/serve/engine_response.hpp"

using namespace infer;
using namespace infer::serve;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

/// One token ("x", id 7) a step (of 1 ms) for each of its first `slots` requests, the others waiting;
/// max_tokens ends a request (length), abort() ends it at the next step (abort), as the real engines
/// report them.
class ScriptedEngine final : public EngineHandle {
 public:
  explicit ScriptedEngine(std::int32_t slots) : slots_(slots) {}
  RequestId add_request(std::vector<std::int32_t> prompt, SamplingParams params) override {
    reqs_.push_back({next_, params.max_tokens, 0, false, static_cast<std::int32_t>(prompt.size())});
    return next_++;
  }
  void abort(RequestId id) override {
    for (auto& r : reqs_)
      if (r.id == id) r.aborted = true;
    ++aborts;
  }
  std::vector<RequestOutput> step() override {
    std::this_thread::sleep_for(1ms);
    std::vector<RequestOutput> outs;
    std::int32_t running = 0;
    for (auto it = reqs_.begin(); it != reqs_.end();) {
      RequestOutput o;
      o.id = it->id;
      o.metrics.prompt_tokens = it->prompt;
      o.outputs.resize(1);
      if (it->aborted) {
        o.finished = true;
        o.outputs[0].finish_reason = FinishReason::abort;
      } else if (running < slots_) {
        ++running;
        ++it->produced;
        o.outputs[0].delta_text = "x";
        o.outputs[0].delta_token_ids = {7};
        if (it->produced == it->max_tokens) {
          o.finished = true;
          o.outputs[0].finish_reason = FinishReason::length;
        }
      } else {
        ++it;
        continue;  // waiting for a slot: nothing to report
      }
      outs.push_back(o);
      it = o.finished ? reqs_.erase(it) : it + 1;
    }
    return outs;
  }
  [[nodiscard]] bool has_unfinished() const override { return !reqs_.empty(); }
  [[nodiscard]] std::size_t num_waiting() const override {
    return reqs_.size() > static_cast<std::size_t>(slots_) ? reqs_.size() - static_cast<std::size_t>(slots_) : 0;
  }
  [[nodiscard]] std::size_t num_running() const override { return std::min<std::size_t>(reqs_.size(), slots_); }
  [[nodiscard]] KvStats kv_stats() const override { return {}; }
  [[nodiscard]] EngineStats stats() const override { return {}; }
  [[nodiscard]] const ModelConfig& config() const override { return config_; }
  [[nodiscard]] const Tokenizer* tokenizer() const override { return nullptr; }
  [[nodiscard]] EngineInfo info() const override {
    return {.kind = "paged", .backend = "cpu", .block_size = 16, .max_model_len = 1 << 20, .max_input = 1 << 20,
            .max_output = 1 << 20, .vocab_size = 100, .max_num_seqs = slots_};
  }

  std::atomic<int> aborts{0};

 private:
  struct Req {
    RequestId id;
    std::int32_t max_tokens, produced;
    bool aborted;
    std::int32_t prompt;
  };
  std::int32_t slots_;
  ModelConfig config_;
  RequestId next_ = 1;
  std::vector<Req> reqs_;
};

struct Scripted {
  ScriptedEngine* engine = nullptr;  ///< owned by the worker's thread
  std::unique_ptr<EngineWorker> worker;
};

Scripted scripted_worker(const std::string& name, std::int32_t slots, std::size_t max_waiting = 64) {
  WorkerOptions wo;
  wo.name = name;
  wo.max_waiting = max_waiting;
  auto made = std::make_shared<ScriptedEngine*>(nullptr);
  Scripted e;
  e.worker = std::make_unique<EngineWorker>(
      [made, slots]() -> std::unique_ptr<EngineHandle> {
        auto p = std::make_unique<ScriptedEngine>(slots);
        *made = p.get();
        return p;
      },
      wo);
  e.worker->start();
  REQUIRE(e.worker->wait_loaded(10s));  // the factory has run
  e.engine = *made;
  return e;
}

/// Stands in for the transport: counts wakes and lets a test wait for the next one.
struct Waker {
  std::mutex mu;
  std::condition_variable cv;
  int wakes = 0;
  std::function<void()> fn() {
    return [this] {
      {
        std::lock_guard lock(mu);
        ++wakes;
      }
      cv.notify_all();
    };
  }
  int count() {
    std::lock_guard lock(mu);
    return wakes;
  }
  /// Waits until more than `seen` wakes have come (bounded); returns the count.
  int wait_beyond(int seen) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, 10s, [&] { return wakes > seen; });
    return wakes;
  }
};

EngineRequest request(bool stream, std::int32_t max_tokens, std::vector<std::size_t> candidates = {0}) {
  EngineRequest r;
  r.prompts = {{1, 2, 3}};
  r.request.params.max_tokens = max_tokens;
  r.request.params.temperature = 0;
  r.request.max_tokens = max_tokens;
  r.request.stream = stream;
  r.candidates = std::move(candidates);
  r.setup.stream = stream;
  r.setup.id = "cmpl-1";
  r.setup.model = "m";
  r.setup.prompt_tokens = {3};
  return r;
}

/// Polls `src` at each wake until it is done (bounded): the transport's loop, without a socket.
std::vector<ResponseSource::Progress> drive(ResponseSource& src, Waker& w) {
  std::vector<ResponseSource::Progress> parts;
  for (int rounds = 0; rounds < 100000; ++rounds) {
    const int seen = w.count();  // before poll(): a wake during it is not missed
    auto p = src.poll();
    const bool done = p.done;
    parts.push_back(std::move(p));
    if (done) break;
    w.wait_beyond(seen);
  }
  return parts;
}

void wait_idle(EngineWorker& w) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (w.outstanding() != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  CHECK(w.outstanding() == 0);
}

}  // namespace

TEST_CASE("engine response: a whole body once finished, polled only at wakes", "[serve][engine_response]") {
  Scripted e = scripted_worker("a", 4);
  std::vector<EngineWorker*> workers{e.worker.get()};
  RoutingCounters counters;
  Waker w;
  EngineResponse src(request(false, 5), workers, 10s, counters);
  src.set_waker(w.fn());
  const auto parts = drive(src, w);
  REQUIRE(!parts.empty());
  const auto& last = parts.back();
  REQUIRE(last.head);
  CHECK_FALSE(last.chunked);
  CHECK(last.head->status == 200);
  const json body = json::parse(last.head->body);
  CHECK(body["choices"][0]["text"] == "xxxxx");
  CHECK(body["choices"][0]["finish_reason"] == "length");
  CHECK(body["usage"]["completion_tokens"] == 5);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) CHECK_FALSE(parts[i].head);  // no head before the end
  CHECK(w.count() >= 2);                                                          // admission, then events
  CHECK(counters.routed.get("a") == 1);
}

TEST_CASE("engine response: a stream's head first, then the events, [DONE] last", "[serve][engine_response]") {
  Scripted e = scripted_worker("a", 4);
  std::vector<EngineWorker*> workers{e.worker.get()};
  RoutingCounters counters;
  Waker w;
  EngineResponse src(request(true, 3), workers, 10s, counters);
  src.set_waker(w.fn());
  const auto parts = drive(src, w);
  std::string sse;
  int heads = 0;
  for (const auto& p : parts) {
    if (p.head) {
      ++heads;
      CHECK(p.chunked);
      CHECK(p.head->content_type == "text/event-stream");
      CHECK(p.head->status == 200);
    }
    sse += p.data;
  }
  CHECK(heads == 1);
  CHECK(parts.back().done);
  CHECK(sse.rfind("data: [DONE]\n\n") == sse.size() - 14);
  CHECK(src.probe() == ":\n\n");  // an SSE comment: what a half-closed client is probed with
}

TEST_CASE("engine response: cancel() aborts at every stage and leaves nothing outstanding", "[serve][engine_response]") {
  Scripted e = scripted_worker("a", 1);
  std::vector<EngineWorker*> workers{e.worker.get()};
  RoutingCounters counters;

  SECTION("queued for admission (the loop held)") {
    e.worker->hold();
    REQUIRE(e.worker->wait_held(10s));
    Waker w;
    EngineResponse src(request(true, 50), workers, 10s, counters);
    CHECK(src.deadline() == std::chrono::steady_clock::time_point::max());
    src.set_waker(w.fn());
    CHECK_FALSE(src.poll().head);  // submitted, not admitted
    CHECK(e.worker->outstanding() == 1);
    src.cancel();
    e.worker->release();
    wait_idle(*e.worker);
    CHECK(e.worker->metrics().rejected.get("cancelled") == 1);
  }
  SECTION("waiting for a slot, and running") {
    Waker wa, wb;
    EngineResponse running(request(true, 100000), workers, 10s, counters);  // 100 s of tokens: cancelled long before
    running.set_waker(wa.fn());
    EngineResponse waiting(request(false, 5), workers, 10s, counters);
    waiting.set_waker(wb.fn());
    // run both until the first streams tokens and the second is admitted (queued behind it)
    for (int i = 0; i < 200; ++i) {
      const int seen = wa.count();
      if (!running.poll().data.empty()) break;
      wa.wait_beyond(seen);
    }
    for (int i = 0; i < 2000; ++i) {  // admitted (live), waiting in the engine behind the running one
      (void)waiting.poll();
      const WorkerSnapshot snap = e.worker->snapshot();
      if (snap.live == 2 && snap.waiting == 1) break;
      std::this_thread::sleep_for(5ms);
    }
    const WorkerSnapshot snap = e.worker->snapshot();
    CHECK(snap.live == 2);
    CHECK(snap.waiting == 1);
    CHECK(snap.running == 1);
    waiting.cancel();
    running.cancel();
    wait_idle(*e.worker);
    CHECK(e.engine->aborts >= 2);
    CHECK(e.worker->metrics().finished.get("abort") == 2);
  }
}

TEST_CASE("engine response: a full engine passes the request on, a stalled one is a 503", "[serve][engine_response]") {
  Scripted a = scripted_worker("a", 1, 1);
  Scripted b = scripted_worker("b", 4);
  std::vector<EngineWorker*> workers{a.worker.get(), b.worker.get()};
  RoutingCounters counters;

  SECTION("fallback") {
    a.worker->hold();
    REQUIRE(a.worker->wait_held(10s));
    Waker w1, w2, w3;
    EngineResponse first(request(false, 2, {0, 1}), workers, 10s, counters), second(request(false, 2, {0, 1}), workers, 10s, counters),
        third(request(false, 2, {0, 1}), workers, 10s, counters);
    first.set_waker(w1.fn());
    second.set_waker(w2.fn());
    third.set_waker(w3.fn());
    (void)first.poll();   // a's slot
    (void)second.poll();  // a's one waiting place
    (void)third.poll();   // a is full: b
    a.worker->release();
    for (auto* src : {&first, &second, &third}) {
      Waker& w = src == &first ? w1 : src == &second ? w2 : w3;
      const auto parts = drive(*src, w);
      REQUIRE(parts.back().head);
      CHECK(parts.back().head->status == 200);
    }
    CHECK(counters.routed.get("a") == 2);
    CHECK(counters.routed.get("b") == 1);
    CHECK(counters.fallbacks.get("a->b") == 1);
  }
  SECTION("no admission within the timeout: 503 engine_stalled, the request withdrawn") {
    a.worker->hold();
    REQUIRE(a.worker->wait_held(10s));
    Waker w;
    EngineResponse src(request(false, 2, {0}), workers, 200ms, counters);
    src.set_waker(w.fn());
    CHECK_FALSE(src.poll().head);
    CHECK(src.deadline() <= std::chrono::steady_clock::now() + 200ms);
    std::this_thread::sleep_until(src.deadline());
    const auto p = src.poll();
    REQUIRE(p.head);
    CHECK(p.done);
    CHECK(p.head->status == 503);
    CHECK(json::parse(p.head->body)["error"]["code"] == "engine_stalled");
    a.worker->release();
    wait_idle(*a.worker);
  }
}
