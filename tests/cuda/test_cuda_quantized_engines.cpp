// The low-precision quantizers on the cuda backend (Fp8, Int8WeightOnly, Int4) through both engines: greedy
// tokens equal to the CPU engine's with the same quantizer on the small Qwen2 dummy shape. That shape repeats
// its input token with top-two margins of ~30 logits (tests/README.md), far beyond what the GPU's bf16
// activations move a logit (the weights are the same codes on both sides: quantized at load by kernels that
// give the CPU's codes bit for bit, for FP8 e4m3 keeps ~2.6% rms of each activation too), so here the GPU must
// choose exactly what the CPU chooses: a wrong scale, code or GEMM path shows as a different token. The
// kernels themselves are checked against the CPU in test_cuda_fp8.cpp and test_cuda_int_linear.cpp.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "infer/engine/engine_registry.hpp"
#include "infer/engine/presets.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/cuda_test_support.hpp"
#include "support/greedy_workload.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using namespace infer::testing;

TEMPLATE_TEST_CASE("Low-precision quantizers on the GPU, paged and static: greedy tokens equal the CPU engine's "
                   "with the same quantizer where margins are wide",
                   "[cuda][engine][fp8][int8][int4]", Fp8, Int8WeightOnly, Int4) {
  using Q = TestType;
  const ModelConfig config = small_qwen2();
  std::mt19937 rng(test_seed(std::string(Q::name) + " engines"));
  // Prompts up to 90 tokens, up to 40 new: a mix of GEMV (decode, <= 8 rows) and GEMM (prefill) steps.
  const Workload w = mixed_workload(16, config.vocab_size, rng, 90, 40);
  std::vector<GreedyOutput> want;
  {
    PagedEngine<cpu, 16, Q> engine(ModelSource::dummy(config, 61), EngineOptions{});
    want = run_together(engine, w);
  }
  const auto same = [&](const std::vector<GreedyOutput>& got, const char* what) {
    std::size_t equal = 0;
    for (std::size_t i = 0; i < w.prompts.size(); ++i) {
      INFO(Q::name << " " << what << ", request " << i);
      CHECK(got[i].tokens == want[i].tokens);
      equal += got[i].tokens == want[i].tokens;
    }
    std::printf("  %s %s: %zu of %zu requests token for token the CPU engine's\n", std::string(Q::name).c_str(), what,
                equal, w.prompts.size());
  };
  {
    EngineOptions o;
    o.kv_cache_bytes = std::size_t{64} << 20;
    PagedEngine<cuda, 16, Q> engine(ModelSource::dummy(config, 61), o);
    same(run_together(engine, w), "paged");
    check_all_blocks_free(engine);
  }
  {
    EngineOptions o;
    o.static_shape = Shape{.max_batch = 4, .max_input = 96, .max_output = 48};
    StaticEngine<cuda, kShapeAtRuntime, Q> engine(ModelSource::dummy(config, 61), o);
    same(run_together(engine, w), "static");
    check_all_blocks_free(engine);
  }
}
