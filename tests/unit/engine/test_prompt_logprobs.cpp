// Prompt logprobs (SamplingParams::prompt_logprobs, vLLM's) and the perplexity computed from them: every
// prompt token's log-probability equals the log-softmax of the decoder's teacher-forced logits (one decode
// step per position, the path the HF references check), through chunked prefill, a prefix-cache hit and
// both engines; the sliding windows score every token once with the context they promise.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "infer/engine/engine_registry.hpp"
#include "infer/engine/llm.hpp"
#include "infer/engine/perplexity.hpp"
#include "support/fixtures.hpp"
#include "support/test_seed.hpp"
#include "support/tiny_checkpoint.hpp"

using namespace infer;
using Tokens = std::vector<std::int32_t>;

namespace {

/// log p(prompt[j] | prompt[:j]) for j >= 1 from the teacher-forced logits (index 0 unused).
std::vector<double> reference_logprobs(const Tokens& prompt) {
  const std::vector<float> logits = infer::test::prompt_logits<F32>(infer::test::fixture("tiny_llama"), prompt);
  const std::size_t V = logits.size() / prompt.size();
  std::vector<double> out(prompt.size(), 0.0);
  for (std::size_t j = 1; j < prompt.size(); ++j) {
    const float* row = &logits[(j - 1) * V];
    double top = row[0], sum = 0;
    for (std::size_t v = 0; v < V; ++v) top = std::max(top, static_cast<double>(row[v]));
    for (std::size_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
    out[j] = static_cast<double>(row[static_cast<std::size_t>(prompt[j])]) - top - std::log(sum);
  }
  return out;
}

RequestOutput run_one(EngineHandle& engine, const Tokens& prompt, bool with_prompt_logprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 3;
  p.ignore_eos = true;
  if (with_prompt_logprobs) p.prompt_logprobs = 0;
  const RequestId id = engine.add_request(prompt, p);
  RequestOutput last;
  while (engine.has_unfinished())
    for (auto& r : engine.step())
      if (r.id == id) last = std::move(r);
  REQUIRE(last.finished);
  return last;
}

void check_against(const RequestOutput& out, const Tokens& prompt, const std::vector<double>& ref) {
  REQUIRE(out.prompt_logprobs.size() == prompt.size());
  CHECK_FALSE(out.prompt_logprobs[0].has_value());
  for (std::size_t j = 1; j < prompt.size(); ++j) {
    REQUIRE(out.prompt_logprobs[j].has_value());
    CHECK(out.prompt_logprobs[j]->token == prompt[j]);
    CHECK(out.prompt_logprobs[j]->logprob <= 0.0f);
    CHECK(std::abs(out.prompt_logprobs[j]->logprob - ref[j]) < 2e-4);
  }
}

}  // namespace

TEST_CASE("prompt logprobs equal the teacher-forced log-softmax, chunked, after a prefix-cache hit, on both engines",
          "[engine][prompt_logprobs]") {
  std::mt19937 rng(infer::test::test_seed("prompt logprobs"));
  std::uniform_int_distribution<std::int32_t> token(0, 255);
  Tokens prompt(45);
  for (auto& t : prompt) t = token(rng);
  const auto ref = reference_logprobs(prompt);
  const ModelSpec spec{.model = infer::test::fixture("tiny_llama")};

  for (const std::string engine : {"paged", "static"})
    for (const std::int32_t budget : {2048, 16}) {  // 16: the prompt is prefilled in three chunks
      DYNAMIC_SECTION(engine << " engine, " << budget << " tokens per step") {
        LlmOptions o;
        o.engine = engine;
        o.engine_options.kv_cache_bytes = std::size_t{4} << 20;
        o.engine_options.max_model_len = 128;
        o.engine_options.scheduler.max_num_seqs = 4;
        o.engine_options.scheduler.max_num_batched_tokens = budget;
        o.engine_options.static_shape = Shape{.max_batch = 2, .max_input = 64, .max_output = 8};
        auto e = make_engine(spec, o);
        const RequestOutput plain = run_one(*e, prompt, false);
        CHECK(plain.prompt_logprobs.empty());
        // The paged engine now holds the prompt's blocks in its prefix cache; a request asking for prompt
        // logprobs computes the prompt anyway, and gets every token's.
        const RequestOutput first = run_one(*e, prompt, true);
        check_against(first, prompt, ref);
        CHECK(first.outputs[0].token_ids == plain.outputs[0].token_ids);
        CHECK(first.metrics.cached_prompt_tokens == 0);
        const KvStats kv = e->kv_stats();
        CHECK(kv.free_blocks == kv.total_blocks);
      }
    }
}

TEST_CASE("prompt_logprobs other than 0 are refused, naming the value", "[engine][prompt_logprobs]") {
  SamplingParams p;
  p.prompt_logprobs = 5;
  CHECK_THROWS_WITH(p.validate(256), Catch::Contains("prompt_logprobs = 5") && Catch::Contains("use 0"));
}

TEST_CASE("perplexity windows score every token once, each with the context they promise", "[engine][perplexity]") {
  for (const std::int64_t n : {2, 3, 17, 100, 1000})
    for (const std::int64_t context : {2, 8, 64, 512})
      for (const std::int64_t stride : {std::int64_t{1}, context / 2, context - 1}) {
        if (stride < 1) continue;
        const auto windows = perplexity_windows(n, context, stride);
        std::vector<int> scored(static_cast<std::size_t>(n), 0);
        for (const auto& w : windows) {
          REQUIRE(w.end - w.begin <= context);
          REQUIRE(w.score_from > w.begin);
          for (std::int64_t t = w.score_from; t < w.end; ++t) {
            ++scored[static_cast<std::size_t>(t)];
            CHECK(t - w.begin >= std::min(t, context - stride));
          }
        }
        CHECK(scored[0] == 0);
        for (std::int64_t t = 1; t < n; ++t) CHECK(scored[static_cast<std::size_t>(t)] == 1);
      }
  CHECK_THROWS_AS(perplexity_windows(100, 8, 8), InvalidArgument);  // no overlap: window starts go unscored
  CHECK_THROWS_AS(perplexity_windows(1, 8, 4), InvalidArgument);
}

TEST_CASE("perplexity through the engine is exp of the mean teacher-forced NLL", "[engine][perplexity]") {
  std::mt19937 rng(infer::test::test_seed("perplexity"));
  std::uniform_int_distribution<std::int32_t> token(0, 255);
  Tokens text(60);
  for (auto& t : text) t = token(rng);
  LlmOptions o;
  o.progress = o.summary = false;
  o.engine_options.kv_cache_bytes = std::size_t{4} << 20;
  o.engine_options.max_model_len = 128;
  LLM llm(ModelSpec{.model = infer::test::fixture("tiny_llama")}, o);
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 1;
  sp.prompt_logprobs = 0;

  // One window over the whole text: the reference is the teacher-forced NLL of every token after the first.
  const auto whole = perplexity_windows(static_cast<std::int64_t>(text.size()), 64, 32);
  REQUIRE(whole.size() == 1);
  const auto ref = reference_logprobs(text);
  double nll = 0;
  for (std::size_t j = 1; j < text.size(); ++j) nll -= ref[j];
  const std::vector<Tokens> one = {text};
  const PerplexityResult r = perplexity_of(whole, llm.generate_ids(one, sp));
  CHECK(r.scored == static_cast<std::int64_t>(text.size()) - 1);
  CHECK(std::abs(r.nll - nll) < 1e-3 * static_cast<double>(r.scored) * 0.1);
  CHECK(std::abs(r.perplexity() - std::exp(nll / static_cast<double>(r.scored))) < 1e-3 * r.perplexity());

  // Sliding windows: every token scored once, with no less context than the windows promise.
  const auto windows = perplexity_windows(static_cast<std::int64_t>(text.size()), 16, 8);
  std::vector<Tokens> prompts;
  for (const auto& w : windows) prompts.emplace_back(text.begin() + w.begin, text.begin() + w.end);
  const PerplexityResult slid = perplexity_of(windows, llm.generate_ids(prompts, sp));
  CHECK(slid.scored == r.scored);
  CHECK(std::isfinite(slid.perplexity()));
  CHECK(slid.perplexity() > 1.0);
}
