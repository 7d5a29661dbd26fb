// The decoder on the default model (SmolLM2-135M-Instruct, GGUF Q4_1, Q8_0 embedding): it loads,
// greedy decoding after "The capital of France is" says " Paris" and its first 33 tokens equal HF
// transformers' (f32, tests/fixtures/smollm2/generate_reference.json), chunked prefill and contiguous
// attention agree with the paged one-chunk result, and single-sequence decode speed is printed.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <vector>

#include "infer/attention/contiguous_attention.hpp"
#include "infer/attention/paged_attention.hpp"
#include "infer/model/llama.hpp"
#include "infer/quant/f32.hpp"
#include "support/fixtures.hpp"

using namespace infer;

namespace {

using PagedModel = LlamaModel<cpu, F32, PagedAttention<>>;

const ModelSource& source() {
  static const ModelSource s = ModelSource::open(test::default_model());
  return s;
}

PagedModel& model() {
  static PagedModel m = PagedModel::load(source());
  return m;
}

std::int32_t argmax(const float* v, std::size_t n) {
  return static_cast<std::int32_t>(std::max_element(v, v + n) - v);
}

KvCache<cpu> cache_for(const ModelConfig& c, std::int32_t blocks, std::int32_t block_size) {
  KvCache<cpu> k(static_cast<std::int32_t>(c.num_layers), blocks, block_size, static_cast<std::int32_t>(c.num_kv_heads),
                 static_cast<std::int32_t>(c.head_dim));
  k.poison();
  return k;
}

}  // namespace

TEST_CASE("SmolLM2: loads with its config and tokenizer", "[model][smollm2]") {
  const auto& c = model().config();
  CHECK(c.num_layers == 30);
  CHECK(c.hidden_size == 576);
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.vocab_size == 49152);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rope_style == RopeStyle::interleaved);
  CHECK(model().kv_bytes_per_token() == 30u * 2 * 192 * sizeof(float));
  REQUIRE(source().tokenizer() != nullptr);
  CHECK(source().find("token_embd")->type == DType::q8_0);
}

TEST_CASE("SmolLM2: greedy next token after 'The capital of France is' is ' Paris'", "[model][smollm2]") {
  const Tokenizer& tok = *source().tokenizer();
  const auto prompt = tok.encode("The capital of France is");
  const auto& cfg = model().config();
  const auto V = static_cast<std::size_t>(cfg.vocab_size);
  const std::int32_t bs = 16;
  std::vector<std::int32_t> table = {3, 0, 7, 5, 1, 2, 4, 6};  // scrambled: 128 positions
  auto cache = cache_for(cfg, 8, bs);
  std::vector<float> logits;
  const ForwardChunk prefill{prompt, 0, table, true};
  model().forward(std::span(&prefill, 1), cache, logits);
  REQUIRE(logits.size() == V);
  for (float x : logits) REQUIRE(std::isfinite(x));
  const std::int32_t next = argmax(logits.data(), V);
  CHECK(tok.decode(std::vector<std::int32_t>{next}) == " Paris");

  SECTION("chunked prefill and contiguous attention pick the same token") {
    auto c2 = cache_for(cfg, 8, bs);
    std::vector<float> l2;
    for (std::size_t s = 0; s < prompt.size(); s += 2) {
      const auto n = std::min<std::size_t>(2, prompt.size() - s);
      const ForwardChunk c{std::span(prompt).subspan(s, n), static_cast<std::int32_t>(s), table,
                           s + n == prompt.size()};
      model().forward(std::span(&c, 1), c2, l2);
    }
    REQUIRE(l2.size() == V);
    double worst = 0;
    for (std::size_t i = 0; i < V; ++i) worst = std::max(worst, static_cast<double>(std::abs(l2[i] - logits[i])));
    CHECK(worst < 1e-3);
    CHECK(argmax(l2.data(), V) == next);

    auto contig = LlamaModel<cpu, F32, FusedContiguousAttention<>>::load(source());
    auto c3 = cache_for(cfg, 2, 64);
    const std::vector<std::int32_t> slot = {1};
    std::vector<float> l3;
    const ForwardChunk c{prompt, 0, slot, true};
    contig.forward(std::span(&c, 1), c3, l3);
    REQUIRE(l3.size() == V);
    worst = 0;
    for (std::size_t i = 0; i < V; ++i) worst = std::max(worst, static_cast<double>(std::abs(l3[i] - logits[i])));
    CHECK(worst < 1e-4);
  }

  SECTION("greedy decode: HF's tokens, and tokens/s") {
    std::vector<std::int32_t> generated = {next};
    const int steps = 32;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      const std::vector<std::int32_t> one = {generated.back()};
      const ForwardChunk d{one, static_cast<std::int32_t>(prompt.size() + generated.size() - 1), table, true};
      model().forward(std::span(&d, 1), cache, logits);
      generated.push_back(argmax(logits.data(), V));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string text = tok.decode(generated);
    std::cout << "SmolLM2-135M Q4_1 (f32 weights, CPU): greedy '" << text << "'\n"
              << "single-sequence decode: " << steps / secs << " tokens/s (" << 1000.0 * secs / steps
              << " ms/token)\n";
    // The CPU engine equals these exactly (test_engine_reference.cpp); the decoder alone must too.
    std::ifstream in(test::fixture("smollm2/generate_reference.json"));
    REQUIRE(in);
    const auto ref = nlohmann::json::parse(in);
    const auto& c = ref["cases"][0];
    REQUIRE(c["text"] == "The capital of France is");
    REQUIRE(c["prompt_ids"].get<std::vector<std::int32_t>>() == prompt);
    auto hf = c["greedy_ids"].get<std::vector<std::int32_t>>();
    REQUIRE(hf.size() >= generated.size());
    hf.resize(generated.size());
    CHECK(generated == hf);
  }
}
