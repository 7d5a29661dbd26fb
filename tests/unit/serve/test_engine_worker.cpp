// The engine thread with the real default model: requests stream their tokens, cancelled ones are
// aborted and return every KV block, a full waiting queue refuses with 503, bad requests are rejected
// before they take a block, stop() ends everything; and, with a scripted engine, a step that does not
// return makes the worker unhealthy, as does a loop parked by hold(). Where a check needs the engine
// thread not to move on (a request still queued, a slot still taken), the test holds the loop instead of
// betting on how fast the machine is.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "infer/serve/engine_worker.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using namespace infer::serve;
using namespace std::chrono_literals;

namespace {

SamplingParams greedy(std::int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

/// Reads a stream to its end (bounded); returns the concatenated tokens and the finish reason.
std::pair<std::vector<std::int32_t>, FinishReason> drain(RequestStream& s, std::chrono::seconds limit = 120s) {
  std::vector<std::int32_t> ids;
  FinishReason reason = FinishReason::none;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<StreamEvent> evs;
  bool finished = false;
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    evs.clear();
    s.wait_events(100ms, evs);
    for (const auto& ev : evs) {
      for (const auto& d : ev.samples) {
        ids.insert(ids.end(), d.token_ids.begin(), d.token_ids.end());
        if (d.finish_reason != FinishReason::none) reason = d.finish_reason;
      }
      finished = finished || ev.finished;
    }
  }
  REQUIRE(finished);
  return {ids, reason};
}

/// Waits (bounded) until the published snapshot shows every KV block free and nothing running.
void require_all_blocks_back(EngineWorker& w) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  WorkerSnapshot s = w.snapshot();
  while ((s.kv.used_blocks != 0 || s.live != 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    s = w.snapshot();
  }
  CHECK(s.kv.used_blocks == 0);
  CHECK(s.kv.free_blocks == s.kv.total_blocks);
  CHECK(s.kv.live_sequences == 0);
  CHECK(s.live == 0);
  CHECK(w.outstanding() == 0);
}

/// Keeps a worker's loop asked to hold for a scope, and releases it however the scope ends, so a failed
/// check does not leave the shared worker parked for the sections after it. Pair with wait_held().
class HoldGuard {
 public:
  explicit HoldGuard(EngineWorker& w) : w_(w) { w_.hold(); }
  ~HoldGuard() { w_.release(); }
  HoldGuard(const HoldGuard&) = delete;
  HoldGuard& operator=(const HoldGuard&) = delete;

 private:
  EngineWorker& w_;
};

/// Returns once the loop has finished the turn it is in, snapshot published: it parks only between turns.
void wait_turn(EngineWorker& w) {
  HoldGuard hold(w);
  REQUIRE(w.wait_held(30s));
}

std::unique_ptr<EngineWorker> smollm_worker(WorkerOptions wo = {}, std::int32_t max_num_seqs = 256) {
  LlmOptions o;
  o.engine_options.scheduler.max_num_seqs = max_num_seqs;
  o.engine_options.kv_cache_bytes = std::size_t{64} << 20;
  o.engine_options.max_model_len = 1024;
  const ModelSpec model{.model = infer::test::default_model()};
  auto w = std::make_unique<EngineWorker>([model, o] { return make_engine(model, o); }, wo);
  w->start();
  REQUIRE(w->wait_loaded(120s));
  return w;
}

/// One loaded worker for the sections of the first test case: Catch2 runs a test case once per section,
/// and loading the model (and a reference engine) every time would be most of this file's run time.
EngineWorker& shared_worker() {
  static const std::unique_ptr<EngineWorker> w = smollm_worker();
  return *w;
}

}  // namespace

TEST_CASE("worker: streamed tokens equal the engine's own greedy output, cancel returns every block", "[serve][worker]") {
  EngineWorker* w = &shared_worker();
  const Tokenizer* tok = w->tokenizer();
  REQUIRE(tok != nullptr);
  CHECK(w->info().kind == "paged");
  CHECK(w->info().max_model_len == 1024);
  CHECK(w->health().ok);
  const auto prompt = tok->encode("The capital of France is");

  // The reference: the same engine type, driven directly (computed once, like the worker).
  static std::vector<std::int32_t> expected;
  if (expected.empty()) {
    LlmOptions o;
    o.engine_options.kv_cache_bytes = std::size_t{64} << 20;
    o.engine_options.max_model_len = 1024;
    auto e = make_engine(ModelSpec{.model = infer::test::default_model()}, o);
    e->add_request(prompt, greedy(12));
    while (e->has_unfinished())
      for (auto& out : e->step())
        if (out.finished) expected = out.outputs[0].token_ids;
  }
  auto s = w->submit(prompt, greedy(12));
  CHECK(s->wait_admission(30s) == RequestStream::State::admitted);
  auto [ids, reason] = drain(*s);
  CHECK(ids == expected);
  CHECK(reason == FinishReason::length);
  require_all_blocks_back(*w);

  SECTION("a cancelled request is aborted mid-generation") {
    auto long_one = w->submit(prompt, greedy(900));
    REQUIRE(long_one->wait_admission(30s) == RequestStream::State::admitted);
    std::vector<StreamEvent> evs;
    while (evs.empty()) long_one->wait_events(100ms, evs);  // it is running
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (w->snapshot().kv.used_blocks == 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
    CHECK(w->snapshot().kv.used_blocks > 0);
    const auto aborted = w->metrics().finished.get("abort");
    long_one->cancel();
    auto [got, why] = drain(*long_one, 30s);
    CHECK(why == FinishReason::abort);
    CHECK(got.size() < 900);
    require_all_blocks_back(*w);
    CHECK(w->metrics().finished.get("abort") == aborted + 1);
  }
  SECTION("a request cancelled before admission never runs") {
    const WorkerSnapshot before = w->snapshot();
    const auto cancelled = w->metrics().rejected.get("cancelled");
    const auto finished = w->metrics().finished.snapshot();
    std::shared_ptr<RequestStream> a;
    {
      HoldGuard hold(*w);  // the engine thread cannot take the request before the client cancels it
      REQUIRE(w->wait_held(30s));
      a = w->submit(prompt, greedy(4));
      a->cancel();
      CHECK(a->state() == RequestStream::State::queued);
      CHECK(w->snapshot().waiting == 1);
    }
    REQUIRE(a->wait_admission(30s) == RequestStream::State::rejected);
    CHECK_THAT(a->rejection().message, Catch::Contains("cancelled"));
    std::vector<StreamEvent> evs;
    CHECK_FALSE(a->wait_events(0ms, evs));  // not one event: no token, no finish
    CHECK(w->metrics().rejected.get("cancelled") == cancelled + 1);
    CHECK(w->metrics().finished.snapshot() == finished);  // not counted as aborted: it never started
    wait_turn(*w);  // the turn that rejected it has published its snapshot
    const WorkerSnapshot after = w->snapshot();
    CHECK(after.stats.requests_added == before.stats.requests_added);  // the engine never saw it
    CHECK(after.stats.computed_tokens == before.stats.computed_tokens);
    CHECK(after.kv.prefix_queried_tokens == before.kv.prefix_queried_tokens);  // no block was looked up
    CHECK(after.kv.used_blocks == 0);
    CHECK(w->outstanding() == 0);
  }
  SECTION("a request the engine refuses is rejected with a 400 before it takes a block") {
    auto bad = w->submit(prompt, greedy(2000));  // beyond max_model_len 1024
    REQUIRE(bad->wait_admission(30s) == RequestStream::State::rejected);
    CHECK(bad->rejection().status == 400);
    CHECK_THAT(bad->rejection().message, Catch::Contains("1024"));
    require_all_blocks_back(*w);
  }
  SECTION("n > 1 streams every sample") {
    SamplingParams p = greedy(5);
    p.n = 3;
    p.temperature = 0.8f;
    p.seed = 1;
    auto m = w->submit(prompt, p);
    REQUIRE(m->wait_admission(30s) == RequestStream::State::admitted);
    auto [all, why] = drain(*m);
    CHECK(all.size() == 15);
    require_all_blocks_back(*w);
  }
  SECTION("stop() aborts what is running, and new submissions are refused") {
    auto own = smollm_worker();  // not the shared one: this section stops it
    w = own.get();
    auto r = w->submit(prompt, greedy(900));
    REQUIRE(r->wait_admission(30s) == RequestStream::State::admitted);
    w->stop();
    CHECK(r->done());
    CHECK_THROWS_AS(w->submit(prompt, greedy(2)), ServiceError);
    CHECK_FALSE(w->health().ok);
  }
}

TEST_CASE("worker: a full waiting queue refuses with queue_full, and the refused take nothing", "[serve][worker]") {
  WorkerOptions wo;
  wo.max_waiting = 2;
  auto w = smollm_worker(wo, /*max_num_seqs=*/1);
  const auto prompt = w->tokenizer()->encode("Hello");
  auto running = w->submit(prompt, greedy(200));
  REQUIRE(running->wait_admission(30s) == RequestStream::State::admitted);
  std::vector<StreamEvent> evs;
  while (evs.empty()) running->wait_events(100ms, evs);  // it holds the only slot
  // Parked, the loop has published that and can neither finish it nor admit the two below.
  HoldGuard hold(*w);
  REQUIRE(w->wait_held(30s));
  auto q1 = w->submit(prompt, greedy(2));
  auto q2 = w->submit(prompt, greedy(2));
  try {
    (void)w->submit(prompt, greedy(2));
    FAIL("the third waiting request was accepted");
  } catch (const ServiceError& e) {
    CHECK(e.reason() == "queue_full");
    CHECK(e.to_api().status == 503);
    CHECK(e.to_api().retry_after_s == 1);
  }
  CHECK(w->full());
  CHECK(w->metrics().rejected.get("queue_full") == 1);
  w->release();
  running->cancel();
  drain(*running, 30s);
  drain(*q1);
  drain(*q2);
  require_all_blocks_back(*w);
  CHECK_FALSE(w->full());
}

TEST_CASE("worker: a burst between two steps fills the free slots before anything counts as waiting",
          "[serve][worker]") {
  WorkerOptions wo;
  wo.max_waiting = 1;
  auto w = smollm_worker(wo, /*max_num_seqs=*/4);
  const auto prompt = w->tokenizer()->encode("Hello");
  // 4 start at the next step and 1 waits; whether or not the engine thread has taken them yet, the
  // sixth is the one beyond capacity. None finishes meanwhile (200 tokens each).
  std::vector<std::shared_ptr<RequestStream>> accepted;
  for (int i = 0; i < 5; ++i) REQUIRE_NOTHROW(accepted.push_back(w->submit(prompt, greedy(200))));
  CHECK_THROWS_AS(w->submit(prompt, greedy(200)), ServiceError);
  for (auto& s : accepted) s->cancel();
  for (auto& s : accepted)  // cancelled before the engine thread took it: rejected, with no events to drain
    if (s->wait_admission(30s) == RequestStream::State::admitted) drain(*s, 30s);
  require_all_blocks_back(*w);
}

namespace {
/// An engine whose step() blocks until released: what a hung forward pass looks like from outside.
class BlockingEngine final : public EngineHandle {
 public:
  std::atomic<bool> release{false};
  RequestId add_request(std::vector<std::int32_t>, SamplingParams) override {
    busy_ = true;
    return 0;
  }
  void abort(RequestId) override { busy_ = false; }
  std::vector<RequestOutput> step() override {
    release.wait(false);
    busy_ = false;
    RequestOutput o;
    o.finished = true;
    o.outputs.resize(1);
    o.outputs[0].finish_reason = FinishReason::stop;
    return {o};
  }
  [[nodiscard]] bool has_unfinished() const override { return busy_; }
  [[nodiscard]] std::size_t num_waiting() const override { return 0; }
  [[nodiscard]] std::size_t num_running() const override { return busy_ ? 1 : 0; }
  [[nodiscard]] KvStats kv_stats() const override { return {}; }
  [[nodiscard]] EngineStats stats() const override { return {}; }
  [[nodiscard]] const ModelConfig& config() const override { return config_; }
  [[nodiscard]] const Tokenizer* tokenizer() const override { return nullptr; }
  [[nodiscard]] EngineInfo info() const override {
    return {.kind = "paged", .backend = "cpu", .block_size = 16, .max_model_len = 64, .max_input = 64,
            .max_output = 64, .vocab_size = 100, .max_num_seqs = 1};
  }

 private:
  bool busy_ = false;
  ModelConfig config_;
};
}  // namespace

TEST_CASE("worker: health is 503 while loading, and when work waits on a step that does not return", "[serve][worker]") {
  BlockingEngine* engine = nullptr;
  std::atomic<bool> may_load{false};
  WorkerOptions wo;
  wo.stall_timeout_s = 0.3;
  EngineWorker w(
      [&]() -> std::unique_ptr<EngineHandle> {
        may_load.wait(false);
        auto e = std::make_unique<BlockingEngine>();
        engine = e.get();
        return e;
      },
      wo);
  w.start();
  CHECK(w.health().code == "loading");
  CHECK_THROWS_AS(w.submit({1}, SamplingParams{}), ServiceError);
  may_load = true;
  may_load.notify_all();
  REQUIRE(w.wait_loaded(10s));
  {
    // No turn for longer than the stall timeout is fine while nothing is waiting.
    HoldGuard hold(w);
    REQUIRE(w.wait_held(10s));
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (w.snapshot().seconds_since_progress <= wo.stall_timeout_s && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(20ms);
    REQUIRE(w.snapshot().seconds_since_progress > wo.stall_timeout_s);
    CHECK(w.health().ok);
  }

  auto s = w.submit({1}, SamplingParams{});
  REQUIRE(s->wait_admission(5s) == RequestStream::State::admitted);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  Health h = w.health();
  while (h.ok && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    h = w.health();
  }
  CHECK(h.code == "engine_stalled");
  CHECK_THAT(h.message, Catch::Contains("no progress"));
  engine->release = true;
  engine->release.notify_all();
  drain(*s, 10s);
  CHECK(w.health().ok);
}

TEST_CASE("worker: hold() parks the loop: work queues, health turns stalled, release() serves it", "[serve][worker]") {
  WorkerOptions wo;
  wo.stall_timeout_s = 0.2;
  EngineWorker w(
      [] {
        auto e = std::make_unique<BlockingEngine>();
        e->release = true;  // every step returns at once: only the hold stops the loop
        return e;
      },
      wo);
  w.start();
  REQUIRE(w.wait_loaded(10s));
  CHECK_FALSE(w.held());
  CHECK_FALSE(w.wait_held(0ms));  // nothing asked it to hold

  w.hold();
  REQUIRE(w.wait_held(10s));
  CHECK(w.held());
  auto s = w.submit({1}, SamplingParams{});
  CHECK(w.outstanding() == 1);
  CHECK(w.snapshot().waiting == 1);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  Health h = w.health();
  while (h.ok && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    h = w.health();
  }
  CHECK(h.code == "engine_stalled");
  CHECK(s->state() == RequestStream::State::queued);  // parked: not admitted however long it waited

  w.release();
  const auto st = s->wait_admission(10s);  // admitted, and maybe finished already: one step serves it
  REQUIRE((st == RequestStream::State::admitted || st == RequestStream::State::finished));
  auto [ids, reason] = drain(*s, 10s);
  CHECK(reason == FinishReason::stop);
  CHECK(w.health().ok);
  CHECK_FALSE(w.held());

  // stop() ends a hold: what queued behind it is refused as the server shuts down.
  w.hold();
  REQUIRE(w.wait_held(10s));
  auto t = w.submit({1}, SamplingParams{});
  w.stop();
  CHECK(t->state() == RequestStream::State::rejected);
  CHECK(t->rejection().status == 503);
  CHECK_FALSE(w.held());
  CHECK(w.outstanding() == 0);
}

TEST_CASE("worker: an engine that cannot load fails, and says why", "[serve][worker]") {
  EngineWorker w([]() -> std::unique_ptr<EngineHandle> { throw IoError("cannot open model 'x.gguf'"); }, {});
  w.start();
  CHECK_FALSE(w.wait_loaded(10s));
  CHECK(w.state() == EngineWorker::State::failed);
  CHECK_THAT(w.load_error(), Catch::Contains("x.gguf"));
  CHECK(w.health().code == "engine_failed");
  CHECK_THROWS_AS(w.submit({1}, SamplingParams{}), ServiceError);
}
