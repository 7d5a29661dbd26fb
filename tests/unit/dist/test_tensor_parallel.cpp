// Tensor parallelism on the CPU: ModelSource::shard's split, the sharded decoder's steps against the whole
// model's, and engine files built per rank, with the ranks as threads of this process (support/thread_group.hpp).
// tests/programs/check_tensor_parallel.py runs the same over mpirun -np 2 through the programs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "infer/engine/engine_build.hpp"
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/model/model_source.hpp"
#include "infer/quant/f32.hpp"
#include "support/engine_file_support.hpp"
#include "support/fixtures.hpp"
#include "support/int4_checkpoint.hpp"
#include "support/split_llama.hpp"
#include "support/tiny_checkpoint.hpp"
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


/// Greedy tokens of `prompts`, each for `n` tokens, on the paged CPU engine from `src` through Quantizer Q.
template <class Q = F32>
std::vector<Tokens> greedy(ModelSource src, const std::vector<Tokens>& prompts, std::int32_t n) {
  EngineOptions o;
  o.kv_cache_bytes = std::size_t{4} << 20;  // a few hundred tokens of these shapes: up to five engines at once
  PagedEngine<cpu, 16, Q> engine(std::move(src), o);
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

TEST_CASE("quantized checkpoints split with their scales: INT8 TP = 2 greedy tokens equal TP = 1's",
          "[dist][tensor_parallel]") {
  const std::vector<Tokens> prompts = {{1, 17, 42, 99, 3}, {1, 200, 5}, {1, 7, 7, 7, 7, 7, 7, 7, 120, 33}};
  test::ThreadGroupState state(2);
  test::ThreadGroup g1(state, 1);
  // A scale a row ([out, 1], compressed-tensors' INT8), the head quantized too: rank 1 takes the rows of its heads,
  // its MLP share and its vocabulary block, and every row of o's and down's (their columns are what splits).
  const auto int8 = test::rewrite_tiny_llama("infer-tp-int8", test::int8_entries, /*quantized_head=*/true);
  {
    const ModelSource whole = ModelSource::open(int8), part = ModelSource::shard(ModelSource::open(int8), g1);
    const auto half = [&](const char* role) {
      const auto w = values_of(whole.get(role)), p = values_of(part.get(role));
      return p.size() * 2 == w.size() && std::equal(p.begin(), p.end(), w.begin() + static_cast<std::ptrdiff_t>(w.size() / 2));
    };
    CHECK(half("blk.0.attn_k.weight_scale"));
    CHECK(half("blk.1.ffn_up.weight_scale"));
    CHECK(values_of(part.get("blk.0.ffn_down.weight_scale")) == values_of(whole.get("blk.0.ffn_down.weight_scale")));
    const std::int64_t V = whole.config().vocab_size;
    const auto head = values_of(whole.get("output.weight_scale")), head_part = values_of(part.get("output.weight_scale"));
    REQUIRE(static_cast<std::int64_t>(head_part.size()) == TensorParallel{1, 2}.vocab_rows(V));
    CHECK(std::equal(head_part.begin(), head_part.end(), head.begin() + TensorParallel{1, 2}.vocab_first(V)));
  }
  // W8A16: the split leaves the products as they were (f32 activations), so the tokens are the unsplit model's.
  const std::vector<Tokens> one = greedy<Int8WeightOnly>(ModelSource::open(int8), prompts, 12);
  std::vector<std::vector<Tokens>> got(2);
  run_ranks(2, [&](int rank, dist::Group& g) {
    got[static_cast<std::size_t>(rank)] = greedy<Int8WeightOnly>(ModelSource::shard(ModelSource::open(int8), g), prompts, 12);
  });
  CHECK(got[0] == one);
  CHECK(got[1] == one);

  // FP8 (W8A8): per-tensor scales go whole to every rank, per-channel ones as INT8's. Its activations are scaled
  // per token over the rank's own columns of o and down (vLLM's FP8 does the same), so the split is not the unsplit
  // model's bits: both ranks must agree and complete.
  for (const bool per_tensor : {false, true}) {
    INFO((per_tensor ? "FP8, per-tensor scales" : "FP8, per-channel scales"));
    const auto fp8 = test::rewrite_tiny_llama(per_tensor ? "infer-tp-fp8-tensor" : "infer-tp-fp8-channel",
                                              [&](const std::string& n, const std::vector<float>& w, std::int64_t out,
                                                  std::int64_t in) { return test::fp8_entries(n, w, out, in, per_tensor); });
    const ModelSource whole = ModelSource::open(fp8), part = ModelSource::shard(ModelSource::open(fp8), g1);
    const auto q = values_of(whole.get("blk.0.attn_q.weight_scale")), qp = values_of(part.get("blk.0.attn_q.weight_scale"));
    CHECK(values_of(part.get("blk.0.attn_output.weight_scale")) == values_of(whole.get("blk.0.attn_output.weight_scale")));
    if (per_tensor) CHECK(qp == q);
    else CHECK((qp.size() * 2 == q.size() && std::equal(qp.begin(), qp.end(), q.begin() + static_cast<std::ptrdiff_t>(q.size() / 2))));
    std::vector<std::vector<Tokens>> fp8_got(2);
    run_ranks(2, [&](int rank, dist::Group& g) {
      fp8_got[static_cast<std::size_t>(rank)] = greedy<Fp8>(ModelSource::shard(ModelSource::open(fp8), g), prompts, 12);
    });
    CHECK(fp8_got[0] == fp8_got[1]);
    for (const auto& t : fp8_got[0]) CHECK(t.size() == 12);
  }
  // GPTQ and AWQ's packed tensors are refused by name.
  const auto gptq = test::rewrite_tiny_llama("infer-tp-gptq", [](const std::string& n, const std::vector<float>& w,
                                                                 std::int64_t out, std::int64_t in) {
    return test::packed_entries(n, w, out, in, test::Packing::gptq);
  });
  CHECK_THROWS_WITH(ModelSource::shard(ModelSource::open(gptq), g1).get("blk.0.attn_q.qweight"),
                    Contains("GPTQ or AWQ") && Contains("qweight"));
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

TEST_CASE("tensor-parallel engine files: each rank loads its own and gets its shard's tokens",
          "[dist][tensor_parallel][engine_file]") {
  CHECK(tensor_parallel_engine_path("/m/llama.engine", {1, 2}) == "/m/llama.tp2-rank1.engine");
  CHECK(tensor_parallel_engine_path("/m/llama.engine", {}) == "/m/llama.engine");
  const ModelSpec whole{.model = test::fixture("tiny_llama")};
  const ModelConfig c = whole.open().config();
  const std::vector<Tokens> prompts = {{1, 17, 42, 99, 3}, {1, 200, 5}, {1, 7, 7, 7, 7, 7, 7, 7, 120, 33}};
  for (const std::string quantizer : {"auto", "int8", "fp8"}) {
    DYNAMIC_SECTION("quantizer " << quantizer) {
      LlmOptions o;
      o.quantizer = quantizer;
      o.engine_options.kv_cache_bytes = std::size_t{4} << 20;
      o.engine_options.max_model_len = 128;
      const auto path = test::engine_temp_path("infer_tp_engine_file_test", quantizer + ".engine");
      for (int rank = 0; rank < 2; ++rank) {
        const EngineBuildReport r = build_engine_file(whole, o, tensor_parallel_engine_path(path, {rank, 2}), {rank, 2});
        CHECK(r.info.tensor_parallel == TensorParallel{rank, 2});
        CHECK(r.info.config.num_heads * 2 == c.num_heads);  // the rank's heads and MLP
        CHECK(r.info.config.intermediate_size * 2 == c.intermediate_size);
        CHECK(EngineFile::open(tensor_parallel_engine_path(path, {rank, 2})).info().tensor_parallel == r.info.tensor_parallel);
      }
      // Each rank: its shard of the model loaded directly, then its engine file; the same quantization of the
      // same shard, so the same tokens on every rank.
      std::vector<std::vector<Tokens>> direct(2), built(2);
      run_ranks(2, [&](int rank, dist::Group& g) {
        ModelSpec model = whole;
        model.tensor_parallel = &g;
        direct[static_cast<std::size_t>(rank)] = test::engine_greedy(*make_engine(model, o), prompts, 12);
        ModelSpec file{.model = tensor_parallel_engine_path(path, {rank, 2})};
        file.tensor_parallel = &g;
        LlmOptions run;  // the file says the engine and quantizer
        run.engine_options = o.engine_options;
        auto engine = make_engine(file, run);
        built[static_cast<std::size_t>(rank)] = test::engine_greedy(*engine, prompts, 12);
        const KvStats kv = engine->kv_stats();
        CHECK(kv.free_blocks == kv.total_blocks);
      });
      CHECK(direct[1] == direct[0]);
      CHECK(built[0] == direct[0]);
      CHECK(built[1] == direct[0]);
      // f32 splits exactly: the ranks' files give the whole model's tokens.
      if (quantizer == "auto") CHECK(built[0] == test::engine_greedy(*make_engine(whole, o), prompts, 12));
    }
  }
}

TEST_CASE("a tensor-parallel engine file refuses, naming both, a place it was not built for",
          "[dist][tensor_parallel][engine_file]") {
  const ModelSpec whole{.model = test::fixture("tiny_llama")};
  LlmOptions o;
  o.engine_options.kv_cache_bytes = std::size_t{4} << 20;
  const auto path = test::engine_temp_path("infer_tp_engine_file_test", "refusals.engine");
  const auto rank0 = tensor_parallel_engine_path(path, {0, 2});
  build_engine_file(whole, o, rank0, {0, 2});
  build_engine_file(whole, o, path);
  test::ThreadGroupState state(2);
  test::ThreadGroup g1(state, 1);
  // Rank 1 given rank 0's file.
  CHECK_THROWS_WITH(ModelSource::shard(ModelSource::open(rank0), g1),
                    Contains("holds rank 0 of a 2-way tensor-parallel split") &&
                        Contains("this is rank 1 of a 2-way tensor-parallel split") && Contains("each rank loads its own"));
  // A whole model's file in a split.
  CHECK_THROWS_WITH(ModelSource::shard(ModelSource::open(path), g1),
                    Contains("holds the whole model") && Contains("infer-build --tensor-parallel-size 2"));
  // A rank's file in a job of another size.
  test::ThreadGroupState state4(4);
  test::ThreadGroup g4(state4, 0);
  CHECK_THROWS_WITH(ModelSource::shard(ModelSource::open(rank0), g4), Contains("this is rank 0 of a 4-way"));
  // A rank's file alone, or a shard cut without its group: the decoder needs the group's collectives.
  CHECK_THROWS_AS(make_engine(ModelSpec{.model = rank0}, LlmOptions{}), UnsupportedError);
  CHECK_THROWS_WITH(make_engine(ModelSpec{.model = rank0}, LlmOptions{}),
                    Contains("holds rank 0 of a 2-way tensor-parallel split") && Contains("mpirun -np 2"));
  const auto cut_alone = [&] {
    using Engine = PagedEngine<cpu, 16>;
    Engine e(ModelSource::shard(ModelSource::open(test::fixture("tiny_llama")), TensorParallel{0, 2}), o.engine_options);
  };
  CHECK_THROWS_WITH(cut_alone(), Contains("has no group for its collectives"));
}
