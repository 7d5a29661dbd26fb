// The CUDA decoder split over 2 ranks on one GPU: the ranks are threads of this process and their collectives go
// through the host (dist::HostStaged over a test::ThreadGroup), since NCCL refuses two ranks on one device; the
// multi-GPU run over NCCL is issue 22's. Every rank's logits must be the same bits (the head's blocks are
// all-gathered), and within the derived rounding bound (support/rounding_noise.hpp) of the CPU reference of the
// whole model: the split adds the bf16 roundings of each rank's partial o and down outputs, which the bound's ten
// sigmas cover (checked here, not assumed).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "infer/dist/device_group.hpp"
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/cuda_test_support.hpp"
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
    const std::vector<float>& gpu = got[0][s];
    REQUIRE(gpu.size() == cpu.size());
    std::size_t bad = 0;
    for (std::size_t j = 0; j < cpu.size(); ++j) {
      const double diff = std::fabs(static_cast<double>(gpu[j]) - cpu[j]);
      if (diff <= noise_bound(cpu[j], sigma[j])) worst = std::max(worst, diff / sigma[j]);
      else if (++bad <= 5)
        FAIL_CHECK("row " << j / V << ", logit " << j % V << ": gpu " << gpu[j] << ", cpu " << cpu[j] << ", σ "
                          << sigma[j]);
    }
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
