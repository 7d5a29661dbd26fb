// Both engines on the GPU with an FP8 KV cache (KvCacheDtype::fp8_e4m3): the kernels that write and read the
// codes are tested alone in test_cuda_ops.cpp (rope_write_kv) and test_cuda_attention.cpp (decode, prefill);
// here the engines: twice the blocks of a bf16 cache in the same bytes, every block back in the pool, CUDA
// graphs captured and replayed over the codes, and the tokens.
//
// Which tokens: on a dummy model with tied embeddings the current token's own logit leads by far (the peaked
// case of test_cuda_model.cpp: the GPU engine's tokens equal the CPU engine's outright in bf16). The CPU
// engine with an FP8 cache rounds the f32 K and V to e4m3, the GPU engine the bf16-rounded ones, so a code
// may differ by one step between the two; the margins of the peaked case are wide enough for that, and the
// GPU engines must give the CPU FP8 engine's tokens, whole sequences.
#include <catch2/catch.hpp>

#include <random>

#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/cuda_test_support.hpp"
#include "support/greedy_workload.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using namespace infer::testing;

TEST_CASE("both engines on the GPU with an FP8 KV cache: 2x the blocks, the CPU FP8 engine's tokens, blocks returned",
          "[cuda][engine][fp8]") {
  std::mt19937 rng(test_seed("engines with an FP8 KV cache"));
  const ModelConfig config = small_qwen2();  // tied embeddings: the peaked case
  REQUIRE(config.tie_word_embeddings);
  constexpr Shape kShape{.max_batch = 4, .max_input = 96, .max_output = 48};
  const Workload w = mixed_workload(16, config.vocab_size, rng, kShape.max_input, kShape.max_output);

  EngineOptions fp8;
  fp8.kv_cache_dtype = KvCacheDtype::fp8_e4m3;
  fp8.kv_cache_bytes = std::size_t{64} << 20;
  EngineOptions bf16 = fp8;
  bf16.kv_cache_dtype = KvCacheDtype::automatic;

  PagedEngine<cpu, 16> cpu_engine(ModelSource::dummy(config, 71), fp8);
  const auto want = run_together(cpu_engine, w);

  PagedEngine<cuda, 16> paged(ModelSource::dummy(config, 71), fp8);
  PagedEngine<cuda, 16> paged_bf16(ModelSource::dummy(config, 71), bf16);
  CHECK(paged.kv_cache().dtype() == KvCacheDtype::fp8_e4m3);
  const std::int32_t blocks = paged.kv_stats().total_blocks, blocks_bf16 = paged_bf16.kv_stats().total_blocks;
  CHECK(blocks >= 2 * blocks_bf16);
  CHECK(blocks <= 2 * blocks_bf16 + 1);
  REQUIRE(paged.model().graph_steps() == 0);
  const auto got_paged = run_together(paged, w);
  CHECK(paged.model().graph_steps() > 0);  // decode steps replayed from graphs over the codes

  StaticEngine<cuda, kShape> fixed(ModelSource::dummy(config, 71), fp8);
  const auto got_static = run_together(fixed, w);

  for (std::size_t i = 0; i < w.prompts.size(); ++i) {
    INFO("request " << i);
    CHECK(got_paged[i].tokens == want[i].tokens);
    CHECK(got_static[i].tokens == want[i].tokens);
  }
  check_all_blocks_free(paged);
  check_all_blocks_free(fixed);
}
