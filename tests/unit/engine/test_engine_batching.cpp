// Batching must not change results: 64 concurrent requests of mixed lengths get the tokens each gets alone,
// also when a small KV cache forces chunked prefill and preemption; every block returns afterwards.
#include "engine_test_support.hpp"

#include <map>
#include <random>
#include <set>

using namespace infer;
using namespace infer::test;

namespace {

struct Workload {
  std::vector<Tokens> prompts;
  std::vector<std::int32_t> max_tokens;
};

Workload mixed_workload(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Workload w;
  for (std::size_t i = 0; i < n; ++i) {
    Tokens p(std::uniform_int_distribution<std::size_t>(1, 70)(rng));
    for (auto& t : p) t = std::uniform_int_distribution<std::int32_t>(3, 255)(rng);
    w.prompts.push_back(std::move(p));
    w.max_tokens.push_back(std::uniform_int_distribution<std::int32_t>(1, 40)(rng));
  }
  return w;
}

template <class E>
std::vector<Tokens> run_together(E& engine, const Workload& w) {
  for (std::size_t i = 0; i < w.prompts.size(); ++i) engine.add_request(w.prompts[i], greedy_params(w.max_tokens[i]));
  std::vector<Tokens> out;
  for (const auto& r : engine.run_to_completion()) out.push_back(r.outputs[0].token_ids);
  return out;
}

}  // namespace

TEST_CASE("64 concurrent requests get the tokens each gets alone", "[engine][batching]") {
  const Workload w = mixed_workload(64, 7);
  std::vector<Tokens> alone;
  {
    PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
    for (std::size_t i = 0; i < w.prompts.size(); ++i)
      alone.push_back(run_batch(engine, {w.prompts[i]}, greedy_params(w.max_tokens[i]))[0]);
    check_all_blocks_free(engine);
  }
  for (std::size_t i = 0; i < alone.size(); ++i) REQUIRE(alone[i].size() == static_cast<std::size_t>(w.max_tokens[i]));

  SECTION("a roomy cache: one big continuous batch") {
    PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
    const auto together = run_together(engine, w);
    for (std::size_t i = 0; i < alone.size(); ++i) {
      INFO("request " << i);
      CHECK(together[i] == alone[i]);
    }
    CHECK(engine.stats().preemptions == 0);
    check_all_blocks_free(engine);
  }
  SECTION("a small cache and token budget: chunked prefill and preemption by recompute") {
    EngineOptions o;
    o.max_model_len = 128;
    o.kv_cache_bytes = 24 * 16 * 512;  // 24 blocks of 16 tokens at 512 bytes per token
    o.scheduler.max_num_batched_tokens = 48;
    o.scheduler.max_num_seqs = 16;
    PagedEngine<cpu, 16> engine(fixture("tiny_llama"), o);
    REQUIRE(engine.kv_stats().total_blocks == 24);
    const auto together = run_together(engine, w);
    for (std::size_t i = 0; i < alone.size(); ++i) {
      INFO("request " << i);
      CHECK(together[i] == alone[i]);
    }
    CHECK(engine.stats().preemptions > 0);
    check_all_blocks_free(engine);
  }
  SECTION("the static engine, refilling slots in flight") {
    StaticEngine<cpu, Shape{.max_batch = 8, .max_input = 80, .max_output = 48}> engine(fixture("tiny_llama"),
                                                                                     EngineOptions{});
    const auto together = run_together(engine, w);
    for (std::size_t i = 0; i < alone.size(); ++i) {
      INFO("request " << i);
      CHECK(together[i] == alone[i]);
    }
    check_all_blocks_free(engine);
  }
}

TEST_CASE("a seeded request samples the same tokens whatever else is in the batch", "[engine][batching][sampling]") {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.seed = 42;
  p.max_tokens = 24;
  const Tokens prompt = {10, 20, 30, 40, 50};
  PagedEngine<cpu, 16> engine(fixture("tiny_llama"), EngineOptions{});
  const auto alone = run_batch(engine, {prompt}, p)[0];

  SamplingParams other = p;
  other.seed.reset();      // unseeded neighbours draw from fresh entropy,
  other.ignore_eos = true;  // and run their 24 steps whatever they draw
  const RequestId a = engine.add_request(Tokens{5, 6, 7}, other);
  const RequestId mine = engine.add_request(prompt, p);
  const RequestId b = engine.add_request(Tokens(40, 9), other);
  // Step by hand to see who got a token in which step: the invariance below only means something if
  // `mine` really ran in the same batches as its neighbours.
  std::map<RequestId, Tokens> got;
  std::map<RequestId, std::int64_t> steps_with_token;
  std::int64_t shared_steps = 0;
  while (engine.has_unfinished()) {
    std::set<RequestId> stepped;
    for (const auto& r : engine.step()) {
      if (!r.outputs[0].delta_token_ids.empty()) stepped.insert(r.id);
      if (r.finished) got[r.id] = r.outputs[0].token_ids;
    }
    for (RequestId id : stepped) steps_with_token[id]++;
    if (stepped.count(mine) && stepped.count(a) && stepped.count(b)) shared_steps++;
  }
  CHECK(got[mine] == alone);
  // All three ran to max_tokens (mine: it draws no EOS, as alone), one token per step, and every one of
  // mine's 24 steps was also a step of both neighbours: its tokens came out of batches it shared.
  for (RequestId id : {a, mine, b}) {
    INFO("request " << id);
    CHECK(got[id].size() == 24);
    CHECK(steps_with_token[id] == 24);
  }
  CHECK(shared_steps == 24);

  p.seed = 43;
  const auto different_seed = run_batch(engine, {prompt}, p)[0];
  CHECK(different_seed != alone);
  check_all_blocks_free(engine);
}
