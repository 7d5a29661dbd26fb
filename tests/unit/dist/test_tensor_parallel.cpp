// Tensor parallelism on the CPU: ModelSource::shard's split, and the sharded decoder's steps against the whole
// model's, with the ranks as threads of this process (support/thread_group.hpp). tests/dist runs the same model
// over mpirun -np 2 through infer-generate.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/model_source.hpp"
#include "infer/quant/f32.hpp"
#include "support/fixtures.hpp"
#include "support/split_llama.hpp"
#include "support/thread_group.hpp"

using namespace infer;
using Tokens = std::vector<std::int32_t>;
using test::run_ranks;
using test::split_llama;
using Catch::Contains;

namespace {


std::vector<float> values_of(const WeightTensor& t) {
  std::vector<float> v(t.elements());
  dequantize_to_f32(t, v);
  return v;
}


/// Greedy tokens of `prompts`, each for `n` tokens, on the paged CPU engine from `src`.
std::vector<Tokens> greedy(ModelSource src, const std::vector<Tokens>& prompts, std::int32_t n) {
  EngineOptions o;
  o.kv_cache_bytes = std::size_t{4} << 20;  // a few hundred tokens of these shapes: up to five engines at once
  PagedEngine<cpu, 16> engine(std::move(src), o);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  for (const auto& t : prompts) engine.add_request(t, p);
  std::vector<Tokens> out;
  for (const auto& r : engine.run_to_completion()) out.push_back(r.outputs.at(0).token_ids);
  return out;
}

}  // namespace

TEST_CASE("ModelSource::shard splits a Llama model as Megatron-LM does", "[dist][tensor_parallel]") {
  const ModelConfig c = split_llama();
  const ModelSource whole = ModelSource::dummy(c, 7);
  test::ThreadGroupState state(2);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    test::ThreadGroup g(state, rank);
    const ModelSource part = ModelSource::shard(ModelSource::dummy(c, 7), g);
    CHECK(part.tensor_parallel().rank == rank);
    CHECK(part.tensor_parallel().size == 2);
    CHECK(part.group() == &g);
    CHECK(part.config().num_heads == 2);
    CHECK(part.config().num_kv_heads == 2);
    CHECK(part.config().intermediate_size == 48);
    CHECK(part.config().vocab_size == 101);
    CHECK(part.config().hidden_size == 64);
    CHECK_THAT(part.describe(), Contains("rank " + std::to_string(rank) + " of 2"));
    // Rows: q (this rank's two heads), gate; columns: o, down; the vocabulary in blocks of 51; norms whole.
    struct Split {
      const char* role;
      bool rows;
      std::uint64_t part, whole_n;
    };
    const Split splits[] = {{"blk.1.attn_q", true, 32, 64},     {"blk.1.attn_k", true, 32, 64},
                            {"blk.0.ffn_gate", true, 48, 96},   {"blk.0.attn_output", false, 32, 64},
                            {"blk.0.ffn_down", false, 48, 96},  {"token_embd", true, rank == 0 ? 51u : 50u, 101},
                            {"output", true, rank == 0 ? 51u : 50u, 101}};
    for (const Split& s : splits) {
      INFO(s.role);
      const WeightTensor w = whole.get(s.role), p = part.get(s.role);
      const auto wv = values_of(w), pv = values_of(p);
      const std::uint64_t first = s.role == std::string("token_embd") || s.role == std::string("output")
                                      ? static_cast<std::uint64_t>(rank) * 51
                                      : static_cast<std::uint64_t>(rank) * s.part;
      if (s.rows) {
        REQUIRE(p.shape == std::vector<std::uint64_t>{s.part, w.shape[1]});
        const auto cols = w.shape[1];
        CHECK(std::equal(pv.begin(), pv.end(), wv.begin() + static_cast<std::ptrdiff_t>(first * cols)));
      } else {
        REQUIRE(p.shape == std::vector<std::uint64_t>{w.shape[0], s.part});
        for (std::uint64_t r = 0; r < w.shape[0]; ++r)
          for (std::uint64_t k = 0; k < s.part; ++k)
            REQUIRE(pv[r * s.part + k] == wv[r * s.whole_n + first + k]);
      }
    }
    CHECK(values_of(part.get("blk.0.attn_norm")) == values_of(whole.get("blk.0.attn_norm")));
  }
}

TEST_CASE("ModelSource::shard slices file tensors: rows as views, columns copied", "[dist][tensor_parallel]") {
  const auto path = test::fixture("tiny_qwen2");  // f32 safetensors, q/k/v biases, tied embeddings
  const ModelSource whole = ModelSource::open(path);
  test::ThreadGroupState state(2);
  test::ThreadGroup g(state, 1);
  const ModelSource part = ModelSource::shard(ModelSource::open(path), g);
  const auto q = values_of(whole.get("blk.0.attn_q")), qp = values_of(part.get("blk.0.attn_q"));
  REQUIRE(qp.size() * 2 == q.size());
  CHECK(std::equal(qp.begin(), qp.end(), q.begin() + static_cast<std::ptrdiff_t>(q.size() / 2)));
  const auto qb = values_of(whole.get("blk.0.attn_q.bias")), qbp = values_of(part.get("blk.0.attn_q.bias"));
  CHECK(std::equal(qbp.begin(), qbp.end(), qb.begin() + static_cast<std::ptrdiff_t>(qb.size() / 2)));
  const WeightTensor o = whole.get("blk.0.attn_output"), op = part.get("blk.0.attn_output");
  const auto ov = values_of(o), opv = values_of(op);
  const std::uint64_t half = o.shape[1] / 2;
  for (std::uint64_t r = 0; r < o.shape[0]; ++r)
    for (std::uint64_t k = 0; k < half; ++k) REQUIRE(opv[r * half + k] == ov[r * o.shape[1] + half + k]);
  CHECK_FALSE(part.find("output"));  // tied: the head is token_embd's rows
  CHECK(part.get("token_embd").shape[0] == 128);
}

TEST_CASE("tensor parallelism refuses, with the numbers, a size that does not divide the heads",
          "[dist][tensor_parallel]") {
  test::ThreadGroupState state(2);
  test::ThreadGroup g(state, 0);
  // SmolLM2-135M: 9 attention heads, 3 KV heads.
  CHECK_THROWS_WITH(ModelSource::shard(ModelSource::dummy(dummy_preset("smollm2-135m")), g),
                    Contains("tensor parallelism over 2 ranks") && Contains("9 attention heads") &&
                        Contains("3 KV heads"));
  CHECK_THROWS_AS(ModelSource::shard(ModelSource::dummy(dummy_preset("smollm2-135m")), g), UnsupportedError);
}

TEST_CASE("TP = 2 and 4 greedy tokens equal TP = 1 on a dummy model and the tiny fixtures", "[dist][tensor_parallel]") {
  const std::vector<Tokens> prompts = {{5, 9, 2, 44, 17, 3}, {1, 2, 3}, {80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90}};
  const std::int32_t n = 12;
  struct Case {
    const char* name;
    std::function<ModelSource()> open;
    int max_size;
  };
  const Case cases[] = {{"dummy", [] { return ModelSource::dummy(split_llama(), 3); }, 4},
                        {"tiny_llama", [] { return ModelSource::open(test::fixture("tiny_llama")); }, 2},
                        {"tiny_qwen2", [] { return ModelSource::open(test::fixture("tiny_qwen2")); }, 2}};
  for (const Case& c : cases) {
    const std::vector<Tokens> one = greedy(c.open(), prompts, n);
    for (int size = 2; size <= c.max_size; size *= 2) {
      INFO(c.name << ", TP = " << size);
      std::vector<std::vector<Tokens>> got(static_cast<std::size_t>(size));
      run_ranks(size, [&](int rank, dist::Group& g) {
        got[static_cast<std::size_t>(rank)] = greedy(ModelSource::shard(c.open(), g), prompts, n);
      });
      for (int r = 0; r < size; ++r) CHECK(got[static_cast<std::size_t>(r)] == one);
    }
  }
}

TEST_CASE("tensor-parallel ranks given different steps fail that step together, naming it", "[dist][tensor_parallel]") {
  // Rank 1 is given another prompt: the step's check fails on both ranks (none is left in a collective), and the
  // engine fails the step's request with the message, as it does with any error of the model.
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank, dist::Group& g) {
    EngineOptions o;
    o.kv_cache_bytes = std::size_t{4} << 20;
    PagedEngine<cpu, 16> engine(ModelSource::shard(ModelSource::dummy(split_llama(), 3), g), o);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 4;
    engine.add_request(Tokens{5, 9, 2, static_cast<std::int32_t>(10 + rank)}, p);
    const auto out = engine.run_to_completion();
    REQUIRE(out.size() == 1);
    CHECK(out[0].outputs.at(0).finish_reason == FinishReason::error);
    errors[static_cast<std::size_t>(rank)] = out[0].error;
  });
  for (const auto& m : errors) CHECK_THAT(m, Contains("another step than rank 0"));
}
