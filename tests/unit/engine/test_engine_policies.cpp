// An engine composed with a researcher's scheduler: built from a policy instance, reached through
// scheduler(), observed step by step (StepTrace, the JSONL writer), stopped with a PolicyError naming a
// scheduler that leaks blocks or admits nothing; per-request priority; infer::LLM over a user's engine type.
#include "engine_test_support.hpp"

#include <array>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <utility>

#include "infer/engine/llm.hpp"
#include "infer/testing/tiny_model.hpp"

using namespace infer;
using namespace infer::test;
using Catch::Contains;

namespace {

/// Shortest prompt first, aged by the steps waited; at most `budget` prefill tokens per step.
struct Researcher {
  double rate = 1;
  std::int32_t budget = 16;
  double score(const Sequence& s, const StepContext& ctx) const {
    return -s.prompt_len + rate * static_cast<double>(ctx.step - s.added_step);
  }
  std::int32_t prefill_budget(const StepContext&) const { return budget; }
};
using ResearchScheduler = ContinuousBatchScheduler<Researcher>;
using ResearchEngine = Engine<cpu, llama, PagedBlockAllocator<16>, ResearchScheduler, PagedAttention<>, F32>;

/// Forgets to return a finished sequence's blocks: it takes them again after finishing it.
struct LeakingScheduler : ContinuousBatchScheduler<> {
  using ContinuousBatchScheduler<>::ContinuousBatchScheduler;
  template <class A>
  void finish(Sequence* seq, A& alloc) {
    const bool was_running = seq->status == SeqStatus::running;
    ContinuousBatchScheduler<>::finish(seq, alloc);
    if (was_running) static_cast<void>(alloc.allocate(*seq));
  }
};
using LeakingEngine = Engine<cpu, llama, PagedBlockAllocator<16>, LeakingScheduler, PagedAttention<>, F32>;

constexpr std::size_t kBytesPerToken = 3 * 2 * 2 * 64 * 4;  // small_llama: layers x (K, V) x kv heads x dim x f32

/// Random prompts of these lengths, ids in [2, vocab) (small_llama has 512, tiny_llama 256).
std::vector<Tokens> prompts_of(std::initializer_list<std::int32_t> lengths, std::uint32_t seed, std::int32_t vocab = 512) {
  std::mt19937 rng(seed);
  std::vector<Tokens> out;
  for (auto n : lengths) {
    Tokens p(static_cast<std::size_t>(n));
    for (auto& t : p) t = std::uniform_int_distribution<std::int32_t>(2, vocab - 1)(rng);
    out.push_back(std::move(p));
  }
  return out;
}

/// Every trace of a run, in order.
struct Recorder {
  std::vector<StepTrace>* traces;
  void operator()(const StepTrace& t) const { traces->push_back(t); }
};

std::vector<RequestId> admissions(const std::vector<StepTrace>& traces) {
  std::vector<RequestId> out;
  for (const auto& t : traces)
    for (const auto& a : t.admitted) out.push_back(a.request);
  return out;
}

std::int32_t max_prefill(const std::vector<StepTrace>& traces) {
  std::int32_t most = 0;
  for (const auto& t : traces) {
    std::int32_t n = 0;
    for (const auto& c : t.chunks) n += c.decode ? 0 : c.count;
    most = std::max(most, n);
  }
  return most;
}

}  // namespace

TEST_CASE("an engine built from a policy instance: the stock engine's tokens, the policy's order and budget",
          "[engine][policy]") {
  const auto prompts = prompts_of({30, 5, 12, 8}, 3);
  std::vector<Tokens> stock;
  {
    PagedEngine<cpu, 16> engine(testing::tiny_model(3), EngineOptions{});
    stock = run_batch(engine, prompts, greedy_params(6));
  }
  const EngineOptions options;
  ResearchEngine engine(testing::tiny_model(3), options, ResearchScheduler(options.scheduler, Researcher{1, 16}));
  std::vector<StepTrace> traces;
  engine.set_step_observer(Recorder{&traces});
  CHECK(run_batch(engine, prompts, greedy_params(6)) == stock);
  // Step 0 scores -30, -5, -12, -8: requests 1 (5 tokens), 3 (8) and the first 3 tokens of 2 fill the 16;
  // step 1 gives 2 its other 9 and request 0 (score -29 by now) the last 7.
  CHECK(admissions(traces) == std::vector<RequestId>{1, 3, 2, 0});
  CHECK(max_prefill(traces) == 16);

  SECTION("the policy is reached through scheduler(): a smaller budget for the next run") {
    engine.scheduler().policy().budget = 4;
    traces.clear();
    CHECK(run_batch(engine, prompts, greedy_params(6)) == stock);
    CHECK(max_prefill(traces) == 4);
    check_all_blocks_free(engine);
  }
  SECTION("a budget of 0 admits nothing: a PolicyError naming the scheduler, not a spin") {
    engine.scheduler().policy().budget = 0;
    engine.add_request(prompts[0], greedy_params(2));
    CHECK_THROWS_AS(engine.step(), PolicyError);
    CHECK_THROWS_WITH(engine.run_to_completion(),
                      Contains("infer::ContinuousBatchScheduler<(anonymous namespace)::Researcher>") &&
                          Contains("planned an empty step while 1 sequences wait and 0 run"));
  }
}

TEST_CASE("a scheduler that keeps a finished sequence's blocks gets a PolicyError naming it, not a hang",
          "[engine][policy][invariants]") {
  EngineOptions o;
  o.max_model_len = 64;
  o.kv_cache_bytes = 12 * 16 * kBytesPerToken;  // 12 blocks: a few leaked requests would fill them
  LeakingEngine engine(testing::tiny_model(), o);
  for (const auto& p : prompts_of({20, 20, 20, 20, 20, 20}, 4)) engine.add_request(p, greedy_params(4));
  CHECK_THROWS_AS(engine.run_to_completion(), PolicyError);
  LeakingEngine again(testing::tiny_model(), o);
  again.add_request(prompts_of({20}, 5)[0], greedy_params(4));
  CHECK_THROWS_WITH(again.run_to_completion(),
                    Contains("scheduler (anonymous namespace)::LeakingScheduler: sequence 0 still holds 2 KV blocks "
                             "after finish()") &&
                        Contains("alloc.free(seq)"));
}

TEST_CASE("the step trace: every chunk, admission, preemption and finish, and the blocks after, also as JSONL",
          "[engine][trace]") {
  EngineOptions o;
  o.max_model_len = 64;
  o.kv_cache_bytes = 6 * 16 * kBytesPerToken;  // 6 blocks for 4 requests of up to 3: preemptions
  PagedEngine<cpu, 16> engine(testing::tiny_model(1), o);
  std::vector<StepTrace> traces;
  std::ostringstream jsonl;
  const JsonlTraceWriter writer(jsonl);
  engine.set_step_observer([&](const StepTrace& t) {
    traces.push_back(t);
    writer(t);
  });
  const auto prompts = prompts_of({20, 18, 20, 17}, 6);
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.add_request(p, greedy_params(20)));
  const auto results = engine.run_to_completion();

  REQUIRE(static_cast<std::int64_t>(traces.size()) == engine.stats().steps);
  std::int64_t preempted = 0, computed = 0;
  std::map<RequestId, std::int32_t> admitted, finished;
  for (std::size_t i = 0; i < traces.size(); ++i) {
    const StepTrace& t = traces[i];
    CHECK(t.step == static_cast<std::int64_t>(i));
    CHECK(t.total_blocks == 6);
    CHECK(t.free_blocks + t.used_blocks == 6);
    computed += t.num_tokens();
    preempted += static_cast<std::int64_t>(t.preempted.size());
    for (const auto& a : t.admitted) admitted[a.request]++;
    for (const auto& f : t.finished) {
      finished[f.request]++;
      CHECK(f.reason == FinishReason::length);
    }
    for (std::size_t c = 1; c < t.chunks.size(); ++c) CHECK((t.chunks[c - 1].decode || !t.chunks[c].decode));
  }
  CHECK(computed == engine.stats().computed_tokens);
  CHECK(preempted == engine.stats().preemptions);
  CHECK(preempted > 0);
  for (RequestId id : ids) {
    CHECK(finished[id] == 1);
    CHECK(admitted[id] == 1 + results[id].metrics.preemptions);  // each preemption is followed by a readmission
  }
  const StepTrace& first = traces.front();
  CHECK(first.admitted.size() == first.chunks.size());
  CHECK(first.chunks[0].request == ids[0]);
  CHECK(first.chunks[0].start == 0);
  CHECK_FALSE(first.chunks[0].decode);
  CHECK(traces.back().used_blocks == 0);
  CHECK(traces.back().num_waiting + traces.back().num_running == 0);

  // One JSON object per line, the same numbers.
  std::istringstream lines(jsonl.str());
  std::string line;
  std::size_t n = 0;
  while (std::getline(lines, line)) {
    REQUIRE(n < traces.size());
    const auto j = nlohmann::json::parse(line);
    const StepTrace& t = traces[n++];
    CHECK(j["step"] == t.step);
    REQUIRE(j["chunks"].size() == t.chunks.size());
    for (std::size_t c = 0; c < t.chunks.size(); ++c) {
      CHECK(j["chunks"][c]["request"] == t.chunks[c].request);
      CHECK(j["chunks"][c]["count"] == t.chunks[c].count);
      CHECK(j["chunks"][c]["kind"] == (t.chunks[c].decode ? "decode" : "prefill"));
    }
    CHECK(j["admitted"].size() == t.admitted.size());
    CHECK(j["preempted"].size() == t.preempted.size());
    CHECK(j["finished"].size() == t.finished.size());
    CHECK(j["blocks"]["free"] == t.free_blocks);
    CHECK(j["blocks"]["used"] == t.used_blocks);
    CHECK(j["waiting"] == t.num_waiting);
    CHECK(j["running"] == t.num_running);
  }
  CHECK(n == traces.size());

  SECTION("without an observer, nothing is traced") {
    engine.set_step_observer(nullptr);
    traces.clear();
    run_batch(engine, {prompts[0]}, greedy_params(2));
    CHECK(traces.empty());
  }
}

TEST_CASE("SamplingParams::priority: the stock paged engine admits lower values first", "[engine][priority]") {
  EngineOptions o;
  o.scheduler.max_num_seqs = 1;  // one at a time: the admission order is the whole schedule
  PagedEngine<cpu, 16> engine(testing::tiny_model(2), o);
  std::vector<StepTrace> traces;
  engine.set_step_observer(Recorder{&traces});
  const auto prompts = prompts_of({6, 6, 6, 6}, 7);
  std::vector<RequestId> ids;
  for (std::int32_t i = 0; i < 4; ++i) {
    SamplingParams p = greedy_params(2);
    p.priority = std::array{2, 0, 3, -1}[static_cast<std::size_t>(i)];
    p.tag = "class " + std::to_string(i);
    ids.push_back(engine.add_request(prompts[static_cast<std::size_t>(i)], p));
  }
  engine.run_to_completion();
  CHECK(admissions(traces) == std::vector<RequestId>{ids[3], ids[1], ids[0], ids[2]});

  SamplingParams bad = greedy_params(2);
  bad.tag = std::string(SamplingParams::max_tag_bytes + 1, 'x');
  CHECK_THROWS_WITH(engine.add_request(prompts[0], bad), Contains("tag is 257 bytes long"));
  bad.tag = "\xff";
  CHECK_THROWS_WITH(engine.add_request(prompts[0], bad), Contains("tag is not valid UTF-8"));
}

TEST_CASE("infer::LLM runs a user's engine type: per-prompt parameters, info, a step observer", "[engine][llm]") {
  const ModelSpec spec{.model = fixture("tiny_llama"), .backend = "cpu"};
  LlmOptions options;
  options.progress = false;
  options.summary = false;
  const auto prompts = prompts_of({9, 3, 14}, 8, 256);
  std::vector<SamplingParams> params(3, greedy_params(5));
  params[2].max_tokens = 2;

  LLM stock(spec, options);
  const auto expected = stock.generate_ids(prompts, params);

  // The scheduler's own limits, not the options': info() reports what runs.
  SchedulerConfig two;
  two.max_num_seqs = 2;
  LLM mine(std::in_place_type<ResearchEngine>, spec, options, ResearchScheduler(two, Researcher{0, 8}));
  std::vector<StepTrace> traces;
  mine.set_step_observer(Recorder{&traces});
  const auto got = mine.generate_ids(prompts, params);
  REQUIRE(got.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(got[i].outputs[0].token_ids == expected[i].outputs[0].token_ids);
  CHECK(got[2].outputs[0].token_ids.size() == 2);
  CHECK(admissions(traces) == std::vector<RequestId>{1, 0, 2});  // shortest first, two at a time
  CHECK(max_prefill(traces) == 8);
  CHECK(mine.info().kind == "paged");
  CHECK(mine.info().max_num_seqs == 2);

  CHECK_THROWS_WITH(mine.generate_ids(prompts, std::span(params).first(2)), Contains("3 prompts but 2 SamplingParams"));
  ModelSpec on_gpu = spec;
  on_gpu.backend = "cuda";
  CHECK_THROWS_WITH(make_engine<ResearchEngine>(on_gpu, options),
                    Contains(kHaveCuda ? "this engine type runs on the cpu backend" : "no CUDA backend"));
}
