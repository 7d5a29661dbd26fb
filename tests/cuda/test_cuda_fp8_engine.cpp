// Fp8 on the cuda backend through both engines: greedy tokens equal to the CPU Fp8 engine's on the small
// Qwen2 dummy shape. That shape repeats its input token with top-two margins of ~30 logits
// (tests/README.md), far beyond what FP8 rounding moves a logit (e4m3 keeps ~2.6% rms of each weight and
// activation), so here the GPU must choose exactly what the CPU chooses: a wrong scale, code or GEMM path
// shows as a different token. The kernels themselves are checked against the CPU Fp8 in test_cuda_fp8.cpp.
#include <catch2/catch.hpp>

#include <random>

#include "infer/engine/engine_registry.hpp"
#include "infer/engine/presets.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/cuda_test_support.hpp"
#include "support/greedy_workload.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using namespace infer::testing;

TEST_CASE("Fp8 on the GPU, paged and static: greedy tokens equal the CPU Fp8 engine's where margins are wide",
          "[cuda][engine][fp8]") {
  const ModelConfig config = small_qwen2();
  std::mt19937 rng(test_seed("fp8 engines"));
  // Prompts up to 90 tokens, up to 40 new: a mix of GEMV (decode, <= 8 rows) and GEMM (prefill) steps.
  const Workload w = mixed_workload(16, config.vocab_size, rng, 90, 40);
  std::vector<GreedyOutput> want;
  {
    PagedEngine<cpu, 16, Fp8> engine(ModelSource::dummy(config, 61), EngineOptions{});
    want = run_together(engine, w);
  }
  const auto same = [&](const std::vector<GreedyOutput>& got, const char* what) {
    std::size_t equal = 0;
    for (std::size_t i = 0; i < w.prompts.size(); ++i) {
      INFO(what << ", request " << i);
      CHECK(got[i].tokens == want[i].tokens);
      equal += got[i].tokens == want[i].tokens;
    }
    std::printf("  %s: %zu of %zu requests token for token the CPU Fp8 engine's\n", what, equal, w.prompts.size());
  };
  {
    EngineOptions o;
    o.kv_cache_bytes = std::size_t{64} << 20;
    PagedEngine<cuda, 16, Fp8> engine(ModelSource::dummy(config, 61), o);
    same(run_together(engine, w), "paged");
    check_all_blocks_free(engine);
  }
  {
    EngineOptions o;
    o.static_shape = Shape{.max_batch = 4, .max_input = 96, .max_output = 48};
    StaticEngine<cuda, kShapeAtRuntime, Fp8> engine(ModelSource::dummy(config, 61), o);
    same(run_together(engine, w), "static");
    check_all_blocks_free(engine);
  }
}
