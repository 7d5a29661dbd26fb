// The engine against HF transformers: greedy tokens on SmolLM2 (GGUF Q4_1, dequantized) and on the tiny
// random Llama / Qwen2 safetensors fixtures, with both presets; first-step logits of the fixtures.
// References: scripts/make_model_references.py (tests/fixtures/*/reference.json, generate_reference.json).
#include "engine_test_support.hpp"

#include <cmath>

using namespace infer;
using namespace infer::test;

namespace {

using TinyStatic = StaticEngine<cpu, Shape{.max_batch = 4, .max_input = 64, .max_output = 64}>;

struct Reference {
  std::vector<Tokens> prompts, greedy;
  std::vector<std::vector<float>> first_logits;
};

Reference tiny_reference(const std::string& name) {
  Reference r;
  const auto doc = read_json(name + "/reference.json");
  for (const auto& c : doc["cases"]) {
    r.prompts.push_back(c["prompt_ids"].get<Tokens>());
    r.greedy.push_back(c["greedy_ids"].get<Tokens>());
    r.first_logits.push_back(c["first_logits"].get<std::vector<float>>());
  }
  return r;
}

/// A static engine whose shape is given when it is built (what the registry and the programs' flags make).
using RuntimeStatic = StaticEngine<cpu, kShapeAtRuntime>;
EngineOptions tiny_static_options() {
  EngineOptions o;
  o.static_shape = Shape{.max_batch = 2, .max_input = 40, .max_output = 30};  // 3 prompts, 2 slots: a refill
  return o;
}

template <class E>
void check_tiny_engine(const std::string& name, const EngineOptions& options = {}) {
  const Reference ref = tiny_reference(name);
  E engine(fixture(name), options);
  const auto got = run_batch(engine, ref.prompts, greedy_params(static_cast<std::int32_t>(ref.greedy[0].size())));
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(name << " prompt " << i);
    CHECK(got[i] == ref.greedy[i]);
  }
  check_all_blocks_free(engine);
}

/// Runs one prompt through the decoder directly and compares its last position's logits with HF's.
void check_tiny_logits(const std::string& name) {
  const Reference ref = tiny_reference(name);
  const ModelSource source = ModelSource::open(fixture(name));
  auto model = LlamaModel<cpu, F32, PagedAttention<>>::load(source);
  for (std::size_t i = 0; i < ref.prompts.size(); ++i) {
    INFO(name << " prompt " << i);
    KvCache<cpu> cache(static_cast<std::int32_t>(source.config().num_layers), 16, 16,
                       static_cast<std::int32_t>(source.config().num_kv_heads),
                       static_cast<std::int32_t>(source.config().head_dim));
    cache.poison();
    const Tokens table = {3, 0, 7, 1};  // scrambled on purpose
    const ForwardChunk chunk{ref.prompts[i], 0, table, true};
    std::vector<float> logits;
    model.forward(std::span(&chunk, 1), cache, logits);
    REQUIRE(logits.size() == ref.first_logits[i].size());
    double max_err = 0, max_ref = 0;
    for (std::size_t v = 0; v < logits.size(); ++v) {
      max_err = std::max(max_err, std::abs(double(logits[v]) - ref.first_logits[i][v]));
      max_ref = std::max(max_ref, std::abs(double(ref.first_logits[i][v])));
    }
    CHECK(max_err <= 1e-4 * std::max(1.0, max_ref));
  }
}

}  // namespace

TEST_CASE("tiny Llama (GQA, Llama-3 RoPE scaling) logits and greedy tokens equal HF's", "[engine][reference]") {
  check_tiny_logits("tiny_llama");
  check_tiny_engine<PagedEngine<cpu, 16>>("tiny_llama");
  check_tiny_engine<PagedEngine<cpu, 8>>("tiny_llama");
  check_tiny_engine<TinyStatic>("tiny_llama");
  check_tiny_engine<RuntimeStatic>("tiny_llama", tiny_static_options());
}

TEST_CASE("tiny Qwen2 (q/k/v biases, tied embeddings) logits and greedy tokens equal HF's", "[engine][reference]") {
  check_tiny_logits("tiny_qwen2");
  check_tiny_engine<PagedEngine<cpu, 32>>("tiny_qwen2");
  check_tiny_engine<TinyStatic>("tiny_qwen2");
  check_tiny_engine<RuntimeStatic>("tiny_qwen2", tiny_static_options());
}

TEST_CASE("SmolLM2 Q4_1 greedy tokens equal HF transformers' on both presets", "[engine][reference][model]") {
  const auto ref = read_json("smollm2/generate_reference.json");
  std::vector<Tokens> prompts, expected;
  for (const auto& c : ref["cases"]) {
    prompts.push_back(c["prompt_ids"].get<Tokens>());
    expected.push_back(c["greedy_ids"].get<Tokens>());
  }
  const auto n = ref["new_tokens"].get<std::int32_t>();
  REQUIRE(prompts.size() >= 8);
  REQUIRE(n >= 64);

  PagedEngine<cpu, 16> paged(default_model(), EngineOptions{});
  const auto got_paged = run_batch(paged, prompts, greedy_params(n));
  StaticEngine<cpu> fixed(default_model(), EngineOptions{});
  const auto got_static = run_batch(fixed, prompts, greedy_params(n));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i << ": " << ref["cases"][i]["text"].get<std::string>() << "\n  first difference at token "
                   << first_difference(got_paged[i], expected[i]));
    CHECK(got_paged[i] == expected[i]);
    CHECK(got_static[i] == got_paged[i]);
  }
  check_all_blocks_free(paged);
  check_all_blocks_free(fixed);
}
