// The CUDA decoder split over 2 ranks on one GPU: the ranks are threads of this process and their collectives go
// through the host (dist::HostStaged over a test::ThreadGroup), since NCCL refuses two ranks on one device; the
// multi-GPU run over NCCL is issue 22's. Every rank's logits must be the same bits (the head's blocks are
// all-gathered), and within the derived rounding bound (support/rounding_noise.hpp) of the CPU reference of the
// whole model: the split adds the bf16 roundings of each rank's partial o and down outputs, which the bound's ten
// sigmas cover (checked here, not assumed).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "infer/dist/device_group.hpp"
#include "infer/engine/engine_build.hpp"
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/cuda_test_support.hpp"
#include "support/engine_file_support.hpp"
#include "support/greedy_workload.hpp"
#include "support/rounding_noise.hpp"
#include "support/thread_group.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using namespace infer::testing;
using Catch::Contains;

namespace {

using TpModel = LlamaModel<cuda, Bf16, PagedAttention<>>;

/// Runs body(rank, host group, device group) on `size` threads: the device group copies through the host one.
void run_ranks(int size, const std::function<void(int, dist::Group&, dist::DeviceGroup&)>& body) {
  test::run_ranks(size, [&](int rank, dist::Group& g) {
    dist::HostStaged d(g);
    body(rank, g, d);
  });
}

}  // namespace

TEST_CASE("GPU decoder over 2 tensor-parallel ranks: each rank's logits the same bits, within the bound of the whole's",
          "[cuda][model][dist]") {
  const ModelConfig cfg = small_llama();
  constexpr std::int32_t bs = 16, blocks = 24;
  const std::uint32_t seed = test_seed("GPU tensor parallel");
  std::mt19937 rng(seed);
  const Tokens table_a = {5, 17, 2, 11, 20, 0}, table_b = {9, 3, 14, 22, 7, 1};
  const Tokens a = random_tokens(37, cfg.vocab_size, rng), b = random_tokens(50, cfg.vocab_size, rng);
  const Tokens b_head(b.begin(), b.begin() + 20), b_tail(b.begin() + 20, b.end());
  // The steps of compare_decoders (test_cuda_model.cpp): a two-chunk prefill, a decode row beside a continued
  // chunk, decode steps of two rows, then of one.
  std::vector<std::vector<ForwardChunk>> steps;
  std::vector<Tokens> held;  // the decode tokens the chunks point at
  held.reserve(16);
  steps.push_back({ForwardChunk{a, 0, table_a, true}, ForwardChunk{b_head, 0, table_b, false}});
  held.push_back(random_tokens(1, cfg.vocab_size, rng));
  steps.push_back({ForwardChunk{held.back(), 37, table_a, true}, ForwardChunk{b_tail, 20, table_b, true}});
  for (std::int32_t i = 0; i < 4; ++i) {
    held.push_back(random_tokens(1, cfg.vocab_size, rng));
    const Tokens& ta = held.back();
    held.push_back(random_tokens(1, cfg.vocab_size, rng));
    steps.push_back({ForwardChunk{ta, 38 + i, table_a, true}, ForwardChunk{held.back(), 50 + i, table_b, true}});
  }
  held.push_back(random_tokens(1, cfg.vocab_size, rng));
  steps.push_back({ForwardChunk{held.back(), 42, table_a, true}});

  std::vector<std::vector<std::vector<float>>> got(2);  // [rank][step] logits
  run_ranks(2, [&](int rank, dist::Group& g, dist::DeviceGroup& d) {
    const ModelSource src = ModelSource::shard(ModelSource::dummy(cfg, 11, "small llama"), g, &d);
    auto model = TpModel::load(src);
    KvCache<cuda> cache(static_cast<std::int32_t>(cfg.num_layers), blocks, bs,
                        static_cast<std::int32_t>(src.config().num_kv_heads), static_cast<std::int32_t>(cfg.head_dim));
    cache.poison();
    for (const auto& chunks : steps) {
      std::vector<float> logits;
      model.forward(chunks, cache, logits);
      got[static_cast<std::size_t>(rank)].push_back(std::move(logits));
    }
  });
  REQUIRE(got[0].size() == steps.size());
  CHECK(got[0] == got[1]);  // bit for bit: every rank samples from the same logits

  // The whole model's CPU reference, with the bound its bf16 roundings give.
  const ModelSource whole = ModelSource::dummy(cfg, 11, "small llama");
  RoundingNoise reference(whole, blocks, bs, seed);
  const auto V = static_cast<std::size_t>(cfg.vocab_size);
  double worst = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    INFO("step " << s);
    const std::vector<double>& sigma = reference.step(steps[s]);
    const std::vector<float>& cpu = reference.exact();
    worst = std::max(worst, check_within_noise(got[0][s], cpu, sigma, V));
  }
  std::printf("  small llama over 2 ranks: worst |gpu - cpu| / sigma %.2f (bound %.0f)\n", worst, kSigmas);
}

TEST_CASE("GPU tensor-parallel engine: greedy requests complete on both ranks alike, every block returns",
          "[cuda][model][dist]") {
  const ModelConfig cfg = small_llama();
  std::vector<std::vector<Tokens>> out(2);
  std::vector<KvStats> kv(2);
  run_ranks(2, [&](int rank, dist::Group& g, dist::DeviceGroup& d) {
    EngineOptions o;
    o.kv_cache_bytes = std::size_t{16} << 20;
    o.enforce_eager = true;  // a host-staged group cannot be captured (the model would not capture it anyway)
    PagedEngine<cuda, 16, Bf16> engine(ModelSource::shard(ModelSource::dummy(cfg, 5, "small llama"), g, &d), o);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 12;
    p.ignore_eos = true;
    std::mt19937 rng(7);  // the same prompts on both ranks
    for (int i = 0; i < 3; ++i) engine.add_request(random_tokens(9 + 5 * i, cfg.vocab_size, rng), p);
    for (const auto& r : engine.run_to_completion()) {
      CHECK(r.error.empty());
      out[static_cast<std::size_t>(rank)].push_back(r.outputs.at(0).token_ids);
    }
    kv[static_cast<std::size_t>(rank)] = engine.kv_stats();
  });
  CHECK(out[0].size() == 3);
  CHECK(out[0] == out[1]);
  for (const auto& t : out[0]) CHECK(t.size() == 12);
  for (const auto& k : kv) CHECK(k.used_blocks == 0);
}

TEST_CASE("GPU decoder refuses a shard without device collectives, naming what it needs", "[cuda][model][dist]") {
  std::string error;
  run_ranks(2, [&](int rank, dist::Group& g, dist::DeviceGroup&) {
    try {
      (void)TpModel::load(ModelSource::shard(ModelSource::dummy(small_llama(), 3), g));
    } catch (const UnsupportedError& e) {
      if (rank == 0) error = e.what();
    }
  });
  CHECK_THAT(error, Contains("needs the group's device collectives"));
}

TEST_CASE("GPU tensor-parallel engine files: each rank loads its own and gets its shard's tokens, each cuda quantizer",
          "[cuda][engine_file][dist]") {
  // A Llama shape that splits in two (4 heads, 2 KV heads, an MLP of 512; INT4's groups of 128 stay whole in the
  // split columns), as the config.json ModelSpec reads.
  const auto config = test::engine_temp_path("infer_cuda_tp_engine_file_test", "config.json");
  std::ofstream(config) << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2})";
  const ModelSpec whole{.dummy = config.string(), .dummy_seed = 5, .backend = "cuda"};
  const std::vector<Tokens> prompts = {{1, 17, 42, 99, 3}, {1, 200, 5}, {1, 7, 7, 7, 7, 7, 7, 7, 120, 33, 506, 12}};
  for (const std::string quantizer : {"bf16", "fp8", "int8", "int4"}) {
    DYNAMIC_SECTION("quantizer " << quantizer) {
      LlmOptions o;
      o.quantizer = quantizer;
      o.engine_options.kv_cache_bytes = std::size_t{16} << 20;
      o.engine_options.max_model_len = 256;
      o.engine_options.enforce_eager = true;  // a host-staged group cannot be captured
      const auto path = test::engine_temp_path("infer_cuda_tp_engine_file_test", quantizer + ".engine");
      for (int rank = 0; rank < 2; ++rank) {
        const EngineBuildReport r = build_engine_file(whole, o, tensor_parallel_engine_path(path, {rank, 2}), {rank, 2});
        CHECK(r.info.tensor_parallel == TensorParallel{rank, 2});
        CHECK(r.info.config.num_kv_heads == 1);
      }
      std::vector<std::vector<Tokens>> direct(2), built(2);
      run_ranks(2, [&](int rank, dist::Group& g, dist::DeviceGroup& d) {
        ModelSpec model = whole;
        model.tensor_parallel = &g;
        model.tensor_parallel_device = &d;
        direct[static_cast<std::size_t>(rank)] = test::engine_greedy(*make_engine(model, o), prompts, 16);
        ModelSpec file{.model = tensor_parallel_engine_path(path, {rank, 2}), .backend = "cuda"};
        file.tensor_parallel = &g;
        file.tensor_parallel_device = &d;
        LlmOptions run;  // the file says the engine and quantizer
        run.engine_options = o.engine_options;
        auto engine = make_engine(file, run);
        built[static_cast<std::size_t>(rank)] = test::engine_greedy(*engine, prompts, 16);
        CHECK(engine->kv_stats().used_blocks == 0);
      });
      CHECK(direct[1] == direct[0]);
      CHECK(built[0] == direct[0]);  // the same bytes to the same kernels
      CHECK(built[1] == direct[0]);
      for (const auto& t : built[0]) CHECK(t.size() == 16);
    }
  }
}
