// The derived error bound of whole-model logits (support/rounding_noise.hpp), checked on the CPU where
// bf16 rounding can be reproduced exactly: the CPU decoder with the GPU's bf16 roundings at its projections
// (Bf16Stages, round mode) must stay within B_j = 10·σ_j of the exact decoder at every logit, on many seeds
// (measured: worst |Δ|/σ about 3 over ~10^4 logits, as for a normal sample); and replay_greedy must
// accept what such an emulated-bf16 engine generates, and reject a token or a logprob that is wrong.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>

#include "infer/engine/presets.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/model/dummy.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/fixtures.hpp"
#include "support/greedy_workload.hpp"
#include "support/mixed_gguf.hpp"
#include "support/rounding_noise.hpp"
#include "support/test_seed.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using namespace infer::testing;

namespace {

using EmulatedEngine = Engine<cpu, llama, PagedBlockAllocator<16>, ContinuousBatchScheduler<>, PagedAttention<>, Bf16Stages>;

/// A prompt, then `steps` greedy decode steps of the exact decoder, each also run with the GPU's bf16
/// roundings reproduced (its own cache): every logit of every step within the bound; returns the worst
/// |rounded − exact| / σ seen.
double rounded_within_bound(const ModelSource& src, std::uint32_t seed, int steps) {
  const ModelConfig& c = src.config();
  const auto V = static_cast<std::size_t>(c.vocab_size);
  std::mt19937 rng(seed);
  RoundingNoise noise(src, 8, 16, seed);
  auto rounded = RoundingNoise::Model::load(src);
  KvCache<cpu> cache(static_cast<std::int32_t>(c.num_layers), 8, 16, static_cast<std::int32_t>(c.num_kv_heads),
                     static_cast<std::int32_t>(c.head_dim));
  cache.poison();
  const Tokens table = {3, 0, 6, 1, 7, 2, 5, 4};  // scrambled
  Tokens tokens = random_tokens(37, c.vocab_size, rng);
  std::int32_t pos = 0;
  std::vector<float> got;
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const ForwardChunk chunk{tokens, pos, table, true};
    const std::vector<double>& sigma = noise.step(std::span(&chunk, 1));
    {
      Bf16Stages::Scope round(Bf16Stages::Mode::round);
      rounded.forward(std::span(&chunk, 1), cache, got);
    }
    const std::vector<float>& want = noise.exact();
    REQUIRE(got.size() == V);
    std::size_t bad = 0;
    for (std::size_t j = 0; j < V; ++j) {
      const double d = std::fabs(static_cast<double>(got[j]) - want[j]);
      worst = std::max(worst, d / sigma[j]);
      if (!(d <= noise_bound(want[j], sigma[j])) && ++bad <= 3)
        FAIL_CHECK("step " << s << ", logit " << j << ": rounded " << got[j] << ", exact " << want[j] << ", σ " << sigma[j]);
    }
    pos += static_cast<std::int32_t>(tokens.size());
    tokens = {static_cast<std::int32_t>(std::max_element(want.begin(), want.end()) - want.begin())};
  }
  return worst;
}

/// compare_decoders' steps (tests/cuda/test_cuda_model.cpp: a two-chunk prefill, decode rows beside a continued
/// chunk, decode steps of two rows, then of one) with the round-mode decoder standing in for the GPU: every
/// logit within the bound; returns the worst |rounded − exact| / σ.
double rounded_steps_within_bound(const ModelSource& src, std::uint32_t seed) {
  const ModelConfig& c = src.config();
  const auto V = static_cast<std::size_t>(c.vocab_size);
  constexpr std::int32_t bs = 16, blocks = 24;
  RoundingNoise noise(src, blocks, bs, seed);
  auto rounded = RoundingNoise::Model::load(src);
  KvCache<cpu> cache(static_cast<std::int32_t>(c.num_layers), blocks, bs, static_cast<std::int32_t>(c.num_kv_heads),
                     static_cast<std::int32_t>(c.head_dim));
  cache.poison();
  std::mt19937 rng(seed);
  const Tokens table_a = {5, 17, 2, 11, 20, 0}, table_b = {9, 3, 14, 22, 7, 1};
  const Tokens a = random_tokens(37, c.vocab_size, rng), b = random_tokens(50, c.vocab_size, rng);
  std::vector<float> got;
  double worst = 0;
  auto step = [&](const std::vector<ForwardChunk>& chunks, const char* what) {
    INFO(what);
    const std::vector<double>& sigma = noise.step(chunks);
    {
      Bf16Stages::Scope round(Bf16Stages::Mode::round);
      rounded.forward(chunks, cache, got);
    }
    const std::vector<float>& want = noise.exact();
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0;
    for (std::size_t j = 0; j < want.size(); ++j) {
      const double d = std::fabs(static_cast<double>(got[j]) - want[j]);
      worst = std::max(worst, d / sigma[j]);
      if (!(d <= noise_bound(want[j], sigma[j])) && ++bad <= 3)
        FAIL_CHECK("row " << j / V << ", logit " << j % V << ": rounded " << got[j] << ", exact " << want[j] << ", σ "
                          << sigma[j]);
    }
  };
  const Tokens b_head(b.begin(), b.begin() + 20), b_tail(b.begin() + 20, b.end());
  step({ForwardChunk{a, 0, table_a, true}, ForwardChunk{b_head, 0, table_b, false}}, "prefill: a whole, b's head");
  step({ForwardChunk{random_tokens(1, c.vocab_size, rng), 37, table_a, true}, ForwardChunk{b_tail, 20, table_b, true}},
       "a decodes, b's tail");
  for (std::int32_t i = 0; i < 4; ++i) {
    const Tokens ta = random_tokens(1, c.vocab_size, rng), tb = random_tokens(1, c.vocab_size, rng);
    step({ForwardChunk{ta, 38 + i, table_a, true}, ForwardChunk{tb, 50 + i, table_b, true}}, "decode both");
  }
  return worst;
}

std::vector<GreedyOutput> outputs_of(const std::vector<RequestOutput>& done, const std::vector<Tokens>& prompts) {
  std::vector<GreedyOutput> out;
  for (std::size_t i = 0; i < done.size(); ++i)
    out.push_back({prompts[i], done[i].outputs.at(0).token_ids, done[i].outputs.at(0).logprobs});
  return out;
}

}  // namespace

TEST_CASE("Bf16Stages in exact mode is the F32 decoder, bit for bit", "[model][noise]") {
  const ModelSource src = ModelSource::dummy(small_llama(), 7, "small llama");
  auto exact = RoundingNoise::Model::load(src);
  auto f32 = LlamaModel<cpu, F32, PagedAttention<>>::load(src);
  const ModelConfig& c = src.config();
  auto cache = [&] {
    return KvCache<cpu>(static_cast<std::int32_t>(c.num_layers), 4, 16, static_cast<std::int32_t>(c.num_kv_heads),
                        static_cast<std::int32_t>(c.head_dim));
  };
  KvCache<cpu> a = cache(), b = cache();
  std::mt19937 rng(1);
  const Tokens prompt = random_tokens(20, c.vocab_size, rng), table = {2, 0, 3, 1};
  const ForwardChunk chunk{prompt, 0, table, true};
  std::vector<float> la, lb;
  exact.forward(std::span(&chunk, 1), a, la);
  f32.forward(std::span(&chunk, 1), b, lb);
  CHECK(la == lb);
}

TEST_CASE("the GPU's bf16 rounding, reproduced on the CPU, stays within the derived bound on every logit",
          "[model][noise]") {
  // Two seeds per shape here (CI runs this under sanitizers); INFER_TEST_SEED runs others.
  for (const ModelConfig& config : {small_llama(), small_qwen2()}) {
    INFO(config.architecture);
    for (int k = 0; k < 2; ++k) {
      const std::uint32_t seed = test_seed(detail::cat("rounded decoder ", config.architecture, " ", k));
      const double worst = rounded_within_bound(ModelSource::dummy(config, seed, "dummy"), seed, 5);
      std::printf("  worst |rounded - exact| / sigma %.2f (bound %.0f)\n", worst, kSigmas);
      CHECK(worst < kSigmas);
    }
  }
}

TEST_CASE("replay_greedy accepts an emulated-bf16 engine's greedy outputs and catches a wrong token or logprob",
          "[model][noise]") {
  const ModelSource src = ModelSource::dummy(small_llama(), 11, "small llama");
  std::mt19937 rng(test_seed("replay_greedy"));
  std::vector<Tokens> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(random_tokens(std::uniform_int_distribution<std::size_t>(1, 40)(rng), 512, rng));
  std::vector<RequestOutput> done;
  {
    Bf16Stages::Scope round(Bf16Stages::Mode::round);  // the engine runs on this thread
    EmulatedEngine engine(ModelSource::dummy(small_llama(), 11, "small llama"), EngineOptions{});
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      SamplingParams p = greedy_params(16);
      if (i % 2 == 0) p.logprobs = 5;
      engine.add_request(prompts[i], p);
    }
    done = engine.run_to_completion();
  }
  REQUIRE(done.size() == prompts.size());
  std::vector<GreedyOutput> outputs = outputs_of(done, prompts);
  const ReplayReport good = replay_greedy(src, outputs, 3);
  std::printf("emulated bf16 engine: %s\n", good.summary().c_str());
  for (const auto& f : good.failures) UNSCOPED_INFO(f);
  CHECK(good.ok());
  CHECK(good.steps == 8 * 16);
  CHECK(good.logprobs_checked >= 4 * 16 * 6);

  {
    INFO("a token that is no near-tie of the reference's");
    // Token 5 of request 0 becomes the reference's least likely token there: never within the bound.
    std::vector<GreedyOutput> wrong = outputs;
    GreedyOutput& o = wrong[0];
    Tokens context = o.prompt;
    context.insert(context.end(), o.tokens.begin(), o.tokens.begin() + 5);
    auto f32 = LlamaModel<cpu, F32, PagedAttention<>>::load(src);
    KvCache<cpu> cache(3, 8, 16, 2, 64);
    const Tokens table = {0, 1, 2, 3, 4, 5, 6, 7};
    const ForwardChunk chunk{context, 0, table, true};
    std::vector<float> z;
    f32.forward(std::span(&chunk, 1), cache, z);
    o.tokens.resize(6);
    o.logprobs.clear();
    o.tokens[5] = static_cast<std::int32_t>(std::min_element(z.begin(), z.end()) - z.begin());
    const ReplayReport bad = replay_greedy(src, wrong, 3);
    INFO(bad.summary());
    REQUIRE(bad.failures.size() == 1);
    CHECK_THAT(bad.failures.front(), Catch::Contains("request 0, token 5") && Catch::Contains("beyond the bound"));
  }
  {
    INFO("a logprob off by more than its bound");
    std::vector<GreedyOutput> wrong = outputs;
    GreedyOutput& o = wrong[0];
    REQUIRE_FALSE(o.logprobs.empty());
    o.logprobs[3].logprob -= 0.5f;
    const ReplayReport bad = replay_greedy(src, wrong, 3);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.failures.front(), Catch::Contains("request 0, token 3") && Catch::Contains("the logprob"));
  }
}

TEST_CASE("replay_greedy computes a file model's request once per process, and a reused reference still catches "
          "a wrong token", "[model][noise]") {
  const ModelSource src = ModelSource::open(fixture("tiny_llama"));
  std::mt19937 rng(test_seed("reference memo"));
  std::vector<Tokens> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_tokens(std::uniform_int_distribution<std::size_t>(1, 20)(rng), 256, rng));
  PagedEngine<cpu, 16> engine(ModelSource::open(fixture("tiny_llama")), EngineOptions{});
  std::vector<GreedyOutput> outputs;
  const std::vector<Tokens> done = run_batch(engine, prompts, greedy_params(12));
  for (std::size_t i = 0; i < done.size(); ++i) outputs.push_back({prompts[i], done[i], {}});
  const std::size_t hits = ReferenceMemo::instance().hits();
  const ReplayReport first = replay_greedy(src, outputs, 5);
  CHECK(first.ok());
  CHECK(ReferenceMemo::instance().hits() == hits);  // a tokens sequence not seen before in this process
  const ReplayReport again = replay_greedy(src, outputs, 6);
  CHECK(ReferenceMemo::instance().hits() == hits + outputs.size());
  CHECK(again.steps == first.steps);
  CHECK(again.reference_ties == first.reference_ties);
  CHECK(again.reused == outputs.size());
  // A shorter run of the same tokens is covered, and a wrong last token (the reference's least likely one
  // there) is caught in the reused steps.
  std::vector<GreedyOutput> wrong = outputs;
  wrong[1].tokens.resize(7);
  const ReferenceMemo::Steps steps = ReferenceMemo::instance().find(src.path().string(), wrong[1].prompt, wrong[1].tokens);
  REQUIRE(steps != nullptr);
  const std::vector<float>& z6 = steps->z[6];
  wrong[1].tokens[6] = static_cast<std::int32_t>(std::min_element(z6.begin(), z6.end()) - z6.begin());
  const ReplayReport bad = replay_greedy(src, wrong, 7);
  CHECK(ReferenceMemo::instance().hits() == hits + 2 * outputs.size() + 1);
  REQUIRE(bad.failures.size() == 1);
  CHECK_THAT(bad.failures.front(), Catch::Contains("request 1, token 6") && Catch::Contains("beyond the bound"));
}

// Not a check: the measurement behind tests/README.md's table of near-ties (run with "[.measure]").
TEST_CASE("measure: how often greedy steps of dummy models are near-ties under the bound", "[.measure]") {
  for (const ModelConfig& config : {small_llama(), small_qwen2(), dummy_preset("smollm2-135m")}) {
    const ModelSource src = ModelSource::dummy(config, 31, config.architecture);
    const bool deep = config.num_layers > 3;
    std::mt19937 rng(5);
    std::vector<Tokens> prompts;
    for (int i = 0; i < (deep ? 2 : 8); ++i) prompts.push_back(random_tokens(20, config.vocab_size, rng));
    PagedEngine<cpu, 16> engine(ModelSource::dummy(config, 31, config.architecture), EngineOptions{});
    const auto done = run_batch(engine, prompts, greedy_params(deep ? 4 : 30));
    std::vector<GreedyOutput> outputs;
    for (std::size_t i = 0; i < done.size(); ++i) outputs.push_back({prompts[i], done[i], {}});
    const ReplayReport r = replay_greedy(src, outputs, 1);
    std::printf("%s (%lld layers): %s\n", config.architecture.c_str(), static_cast<long long>(config.num_layers),
                r.summary().c_str());
  }
}

// Not a check of its own: the time of the [cuda] engine tests' CPU reference, which is most of the
// [cuda] suite's time (run with "[.bench]"; OPENBLAS_NUM_THREADS varies the GEMMs' threads). HF's greedy
// tokens for the nine SmolLM2 prompts, replayed as an engine's outputs: they are the CPU reference's own
// choices (test_engine_reference), so every one must pass.
TEST_CASE("bench: replay_greedy of nine SmolLM2 prompts (the [cuda] tests' CPU reference)", "[.bench][noise]") {
  const auto ref = read_json("smollm2/generate_reference.json");
  const std::size_t tokens = 16;
  std::vector<GreedyOutput> outputs;
  for (const auto& c : ref["cases"]) {
    Tokens greedy = c["greedy_ids"].get<Tokens>();
    greedy.resize(std::min(greedy.size(), tokens));
    outputs.push_back({c["prompt_ids"].get<Tokens>(), greedy, {}});
  }
  const ModelSource src = ModelSource::open(default_model());
  const auto start = std::chrono::steady_clock::now();
  const ReplayReport r = replay_greedy(src, outputs, 1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("replay of %zu prompts x %zu tokens: %.2f s on %u hardware threads; %s\n  %s\n", outputs.size(), tokens,
              seconds, std::thread::hardware_concurrency(), kernels::cpu::blas_info().c_str(), r.summary().c_str());
  for (const auto& f : r.failures) UNSCOPED_INFO(f);
  CHECK(r.ok());
}

TEST_CASE("the round-mode decoder on a GGUF of mixed block types stays within the derived bound", "[model][noise]") {
  // The [cuda] test "GPU decoder on a GGUF of mixed block types" with the CPU's exact reproduction of the
  // GPU's roundings (int8 activations up to 32 rows: the GEMV and the int8 MMA) in place of the GPU, on the
  // [cuda] test's seed and three others. On 2026-12-06 the GPU failed that test at one decode step (logit 14:
  // gpu 2522.6, exact 1889.8, σ 54) and this reproduction failed it the same way (2533.0): the GPU computed
  // what the model says, and the file's random scales (weights of size 10-40) made the step discontinuous.
  // With the file's weights at a trained layer's size (support/mixed_gguf.hpp) the worst is 4.4-5.3 σ.
  const auto path = write_mixed_gguf();
  for (int k = 0; k < 4; ++k) {
    // k = 0: the seed of the [cuda] test (its tokens and perturbations), then others
    const std::uint32_t seed = test_seed(k == 0 ? std::string("mixed block types") : detail::cat("mixed block types, rounded ", k));
    const double worst = rounded_steps_within_bound(ModelSource::open(path), seed);
    std::printf("  mixed block types, seed %u: worst |rounded - exact| / sigma %.2f (bound %.0f)\n", seed, worst, kSigmas);
    CHECK(worst < kSigmas);
  }
  std::filesystem::remove(path);
}
