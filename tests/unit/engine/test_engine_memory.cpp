// What the KV cache costs and returns: prefix caching across requests, n > 1 samples sharing the prompt's
// blocks, aborts, bad requests, and an engine that refuses to start with a cache too small.
#include "engine_test_support.hpp"

#include <algorithm>
#include <set>

using namespace infer;
using namespace infer::test;
using Catch::Contains;

namespace {
Tokens iota_tokens(std::int32_t n, std::int32_t first) {
  Tokens t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = 3 + (first + i * 7) % 250;
  return t;
}
}  // namespace

TEST_CASE("a shared system prompt across 32 requests is computed once and costs its blocks once", "[engine][prefix]") {
  const Tokens system = iota_tokens(48, 0);  // exactly 3 blocks of 16
  std::vector<Tokens> prompts;
  for (std::int32_t i = 0; i < 32; ++i) {
    Tokens p = system;
    const Tokens tail = iota_tokens(5 + i % 7, 100 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(p));
  }
  // Reference: every request alone, without prefix caching.
  std::vector<Tokens> expected;
  {
    EngineOptions o;
    o.enable_prefix_caching = false;
    PagedEngine<cpu, 16> engine(fixture("tiny_llama"), o);
    for (const auto& p : prompts) expected.push_back(run_batch(engine, {p}, greedy_params(6))[0]);
    CHECK(engine.kv_stats().prefix_hit_tokens == 0);
  }

  // All 32 arrive together: the first admitted computes the system prompt, and the 31 admitted after it
  // in the same step share its blocks (committed when planned, written before any attention reads).
  PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
  std::map<RequestId, Tokens> got;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request(p, greedy_params(6)));
  std::int32_t peak_used = 0;
  while (engine.has_unfinished()) {
    for (const auto& r : engine.step())
      if (r.finished) got[r.id] = r.outputs[0].token_ids;
    peak_used = std::max(peak_used, engine.kv_stats().used_blocks);
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(got[ids[i]] == expected[i]);
  }
  const KvStats kv = engine.kv_stats();
  CHECK(kv.prefix_hit_tokens == 31 * 48);  // every later request found all 3 system blocks
  // A request holds at most 48 + 11 + 6 = 65 tokens: 5 blocks, 3 of them the shared system prompt's. Held
  // once, the system prompt costs 3 blocks in all rather than 3 per request.
  CHECK(peak_used <= 3 + 32 * 2);
  CHECK(peak_used < 32 * 3);
  check_all_blocks_free(engine);
}

TEST_CASE("n > 1 samples share the prompt's blocks and copy on write", "[engine][prefix][sampling]") {
  SamplingParams p;
  p.n = 4;
  p.temperature = 1.5f;
  p.seed = 7;
  p.max_tokens = 10;
  const Tokens prompt = iota_tokens(40, 3);  // 2 full blocks + 8 tokens in a shared partial block
  PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
  engine.add_request(prompt, p);
  std::vector<RequestOutput> done;
  std::int32_t after_fork = -1;
  while (engine.has_unfinished()) {
    for (auto& r : engine.step())
      if (r.finished) done.push_back(r);
    if (after_fork < 0 && engine.stats().generated_tokens >= 4) after_fork = engine.kv_stats().used_blocks;
  }
  // At the fork all four hold the same 3 blocks: 3 used, not 12.
  CHECK(after_fork == 3);
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].outputs.size() == 4);
  std::set<Tokens> distinct;
  for (const auto& o : done[0].outputs) {
    CHECK(o.token_ids.size() == 10);
    CHECK(o.finish_reason == FinishReason::length);
    distinct.insert(o.token_ids);
  }
  CHECK(distinct.size() > 1);
  check_all_blocks_free(engine);

  // Same seed, same four samples.
  engine.add_request(prompt, p);
  const auto again = engine.run_to_completion();
  for (std::size_t i = 0; i < 4; ++i) CHECK(again[0].outputs[i].token_ids == done[0].outputs[i].token_ids);
  check_all_blocks_free(engine);
}

TEST_CASE("aborted requests, running or waiting, return their blocks at once", "[engine][abort]") {
  EngineOptions o;
  o.scheduler.max_num_seqs = 2;
  // What the first request holds after 3 steps, measured on an engine that runs it alone: the prompts
  // share no block (their first tokens differ), so running beside another does not change it.
  KvStats solo;
  {
    PagedEngine<cpu, 16> engine(fixture("tiny_llama"), o);
    engine.add_request(iota_tokens(20, 0), greedy_params(30));
    for (int s = 0; s < 3; ++s) engine.step();
    solo = engine.kv_stats();
  }
  REQUIRE(solo.live_sequences == 1);
  REQUIRE(solo.used_blocks > 0);

  PagedEngine<cpu, 16> engine(fixture("tiny_llama"), o);
  const auto free0 = engine.kv_stats().free_blocks;
  std::vector<RequestId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(engine.add_request(iota_tokens(20 + i, i), greedy_params(30)));
  std::map<RequestId, std::size_t> generated;
  for (int s = 0; s < 3; ++s)
    for (const auto& r : engine.step()) generated[r.id] = r.outputs[0].token_ids.size();
  REQUIRE(generated[ids[0]] == 3);        // running since the first step, as alone
  REQUIRE(generated.count(ids[4]) == 0);  // still waiting
  REQUIRE(engine.num_running() == 2);
  REQUIRE(engine.num_waiting() == 3);
  const KvStats before = engine.kv_stats();

  // No step() between the abort and the checks: the blocks must be back already.
  engine.abort(ids[0]);  // running
  const KvStats after_running = engine.kv_stats();
  CHECK(after_running.used_blocks == before.used_blocks - solo.used_blocks);
  CHECK(after_running.free_blocks == before.free_blocks + solo.used_blocks);
  CHECK(after_running.tokens_stored == before.tokens_stored - solo.tokens_stored);
  CHECK(after_running.live_sequences == before.live_sequences - 1);
  CHECK(engine.num_running() == 1);

  engine.abort(ids[4]);  // still waiting: it held no block, so nothing in the cache changes
  engine.abort(12345);   // unknown: ignored
  const KvStats after_waiting = engine.kv_stats();
  CHECK(after_waiting.used_blocks == after_running.used_blocks);
  CHECK(after_waiting.free_blocks == after_running.free_blocks);
  CHECK(after_waiting.tokens_stored == after_running.tokens_stored);
  CHECK(after_waiting.live_sequences == after_running.live_sequences);
  CHECK(engine.num_waiting() == 2);

  std::map<RequestId, RequestOutput> out;
  while (engine.has_unfinished())
    for (auto& r : engine.step())
      if (r.finished) out[r.id] = r;
  REQUIRE(out.size() == 5);
  CHECK(out[ids[0]].outputs[0].finish_reason == FinishReason::abort);
  CHECK(out[ids[4]].outputs[0].finish_reason == FinishReason::abort);
  CHECK(out[ids[4]].outputs[0].token_ids.empty());
  CHECK(out[ids[1]].outputs[0].finish_reason == FinishReason::length);
  CHECK(engine.kv_stats().free_blocks == free0);
  check_all_blocks_free(engine);
}

TEST_CASE("bad requests are refused with a message and take no block", "[engine][errors]") {
  PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
  SamplingParams p = greedy_params(8);
  CHECK_THROWS_WITH(engine.add_request(Tokens{}, p), Contains("empty"));
  CHECK_THROWS_WITH(engine.add_request(Tokens{1, 256}, p), Contains("256") && Contains("vocabulary"));
  CHECK_THROWS_WITH(engine.add_request(Tokens(250, 5), greedy_params(10)),
                    Contains("250") && Contains("260") && Contains("256"));
  SamplingParams hot = p;
  hot.temperature = 3.0f;
  CHECK_THROWS_WITH(engine.add_request(Tokens{1, 2}, hot), Contains("temperature"));
  SamplingParams stop = p;
  stop.stop = {"\n"};
  CHECK_THROWS_WITH(engine.add_request(Tokens{1, 2}, stop), Contains("tokenizer"));
  check_all_blocks_free(engine);

  StaticEngine<cpu, Shape{.max_batch = 2, .max_input = 32, .max_output = 16}> fixed(fixture("tiny_llama"), EngineOptions{});
  CHECK_THROWS_WITH(fixed.add_request(Tokens(33, 5), p), Contains("33") && Contains("max_input") && Contains("32"));
  CHECK_THROWS_WITH(fixed.add_request(Tokens(3, 5), greedy_params(17)), Contains("max_output") && Contains("16"));
  check_all_blocks_free(fixed);
}

TEST_CASE("an engine whose KV cache cannot hold one longest sequence refuses to start", "[engine][errors]") {
  EngineOptions o;
  o.kv_cache_bytes = 10 * 16 * 512;  // 160 tokens; tiny_llama's context is 256
  CHECK_THROWS_WITH((PagedEngine<cpu, 16>(fixture("tiny_llama"), o)),
                    Contains("160 tokens") && Contains("256") && Contains("--kv-cache-memory") &&
                        Contains("--max-model-len"));
  o.max_model_len = 160;
  CHECK_NOTHROW(PagedEngine<cpu, 16>(fixture("tiny_llama"), o));
  EngineOptions s;
  s.kv_cache_bytes = 1000;
  CHECK_THROWS_WITH((StaticEngine<cpu, Shape{.max_batch = 2, .max_input = 32, .max_output = 16}>(fixture("tiny_llama"), s)),
                    Contains("static engine") && Contains("1000 bytes"));
}

TEST_CASE("n > 1 edge cases: one token, abort before the fork, abort after it", "[engine][sampling][abort]") {
  PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
  SamplingParams p;
  p.n = 3;
  p.seed = 1;
  p.max_tokens = 1;
  engine.add_request(iota_tokens(20, 1), p);
  auto done = engine.run_to_completion();
  REQUIRE(done.size() == 1);
  REQUIRE(done[0].outputs.size() == 3);
  for (const auto& o : done[0].outputs) {
    CHECK(o.token_ids.size() == 1);
    CHECK(o.finish_reason == FinishReason::length);
  }
  check_all_blocks_free(engine);

  p.max_tokens = 8;
  const RequestId early = engine.add_request(iota_tokens(20, 2), p);
  engine.abort(early);  // still waiting: its siblings were never forked
  done = engine.run_to_completion();
  REQUIRE(done.size() == 1);
  for (const auto& o : done[0].outputs) CHECK(o.finish_reason == FinishReason::abort);
  check_all_blocks_free(engine);

  const RequestId late = engine.add_request(iota_tokens(20, 3), p);
  engine.step();  // prompt computed, siblings forked
  engine.step();
  engine.abort(late);
  done = engine.run_to_completion();
  REQUIRE(done.size() == 1);
  for (const auto& o : done[0].outputs) {
    CHECK(o.finish_reason == FinishReason::abort);
    CHECK(o.token_ids.size() == 2);
  }
  check_all_blocks_free(engine);
}

namespace {
constexpr std::int32_t kPoisonToken = 13;

/// tiny_llama's decoder, except that the logits row of a chunk holding kPoisonToken is NaN: what a model
/// that overflowed would hand the sampler.
template <class Inner>
struct PoisonedDecoder {
  Inner inner;
  static PoisonedDecoder load(const ModelSource& s) { return PoisonedDecoder{Inner::load(s)}; }
  [[nodiscard]] const ModelConfig& config() const noexcept { return inner.config(); }
  [[nodiscard]] std::size_t kv_bytes_per_token(KvCacheDtype d) const noexcept { return inner.kv_bytes_per_token(d); }
  void forward(std::span<const ForwardChunk> chunks, KvCache<cpu>& cache, std::vector<float>& logits) {
    inner.forward(chunks, cache, logits);
    const auto vocab = static_cast<std::size_t>(config().vocab_size);
    std::size_t row = 0;
    for (const ForwardChunk& c : chunks) {
      if (!c.samples) continue;
      if (std::find(c.tokens.begin(), c.tokens.end(), kPoisonToken) != c.tokens.end())
        std::fill_n(logits.begin() + static_cast<std::ptrdiff_t>(row * vocab), vocab, std::numeric_limits<float>::quiet_NaN());
      ++row;
    }
  }
};
struct poisoned_llama {
  template <class B, class Q, class Attn>
  using decoder = PoisonedDecoder<LlamaModel<B, Q, Attn>>;
};
using PoisonedEngine = Engine<cpu, poisoned_llama, PagedBlockAllocator<16>, ContinuousBatchScheduler<>, PagedAttention<>, F32>;
}  // namespace

TEST_CASE("a request whose logits are not finite fails alone with a message, and its blocks return",
          "[engine][errors]") {
  PoisonedEngine engine(fixture("tiny_llama"), EngineOptions{});
  SamplingParams drawn = greedy_params(6);
  drawn.temperature = 0.8f;
  drawn.seed = 7;
  const RequestId fine_greedy = engine.add_request(Tokens{1, 2, 3, 4}, greedy_params(6));
  const RequestId bad_greedy = engine.add_request(Tokens{5, kPoisonToken, 6}, greedy_params(6));
  const RequestId fine_drawn = engine.add_request(Tokens{7, 8, 9}, drawn);
  const RequestId bad_drawn = engine.add_request(Tokens{10, kPoisonToken}, drawn);
  std::map<RequestId, RequestOutput> out;
  for (auto& r : engine.run_to_completion()) out[r.id] = r;
  REQUIRE(out.size() == 4);
  for (RequestId id : {bad_greedy, bad_drawn}) {
    INFO("request " << id);
    CHECK(out[id].outputs[0].finish_reason == FinishReason::error);
    CHECK_THAT(out[id].error, Contains("finite"));
    CHECK(out[id].outputs[0].token_ids.empty());
  }
  for (RequestId id : {fine_greedy, fine_drawn}) {
    INFO("request " << id);
    CHECK(out[id].outputs[0].finish_reason == FinishReason::length);
    CHECK(out[id].outputs[0].token_ids.size() == 6);
    CHECK(out[id].error.empty());
  }
  check_all_blocks_free(engine);
  // The engine goes on serving.
  engine.add_request(Tokens{1, 2}, greedy_params(3));
  const auto later = engine.run_to_completion();
  REQUIRE(later.size() == 1);
  CHECK(later[0].outputs[0].token_ids.size() == 3);
  check_all_blocks_free(engine);
}
