// The whole GPU decoder against the CPU reference, with every tolerance derived from bf16's rounding
// (support/rounding_noise.hpp; tests/README.md has the derivation and the measurements):
//   - per step, every logit of the GPU decoder within B_j = 10·σ_j of the CPU decoder's, σ_j the spread that
//     the GPU's bf16 roundings cause at logit j (Monte Carlo arithmetic over the CPU decoder, 24 runs);
//   - engine runs: every greedy token the GPU engine produced is the CPU reference's choice given the same
//     prefix (teacher-forced replay), or a near-tie under that bound; every logprob within its bound;
//   - CUDA graphs: a replay computes bit for bit what the same padded step computes eagerly, and two runs of
//     one workload agree bit for bit;
//   - memory: infer's own device and pinned allocations exactly where they were after 10,000 requests.
// Random inputs come from printed seeds (support/test_seed.hpp): fixed by default, INFER_TEST_SEED=<n> for others.
//
// Greedy decisions are compared step by step, not as whole sequences: with random weights a sizeable share
// of greedy steps are near-ties under the bound (measured on the CPU: ~40% for the small Llama shape, see
// tests/README.md), where the GPU may rightly pick the other token; the replay then follows the GPU's
// token, so every later step is still checked.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/engine/presets.hpp"
#include "infer/io/gguf.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/model/dummy.hpp"
#include "infer/testing/tiny_model.hpp"
#include "support/cuda_test_support.hpp"
#include "support/mixed_gguf.hpp"
#include "support/greedy_workload.hpp"
#include "support/rounding_noise.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using namespace infer::testing;

namespace {

template <class Q = GgufInPlace>
using GpuModel = LlamaModel<cuda, Q, PagedAttention<>>;

/// Runs the same steps through the GPU decoder and the CPU reference (each its own cache, tables scrambled
/// the same way) and checks every logit of every step against the derived bound, and the GPU's argmax
/// against the CPU's up to a near-tie under the same bound: a two-chunk prefill, decode rows mixed with a
/// continued chunk, decode steps of two rows, then of one (the batch-1 kernels: bf16 GEMV, SwiGLU fused
/// into the gate/up GEMV where the quantizer has it).
template <class G>
void compare_decoders(const ModelSource& src, const char* who) {
  const ModelConfig& c = src.config();
  const auto V = static_cast<std::size_t>(c.vocab_size);
  auto gpu_model = G::load(src);
  constexpr std::int32_t bs = 16, blocks = 24;
  const std::uint32_t seed = test_seed(who);
  RoundingNoise reference(src, blocks, bs, seed);
  KvCache<cuda> gpu_cache(static_cast<std::int32_t>(c.num_layers), blocks, bs, static_cast<std::int32_t>(c.num_kv_heads),
                          static_cast<std::int32_t>(c.head_dim));
  gpu_cache.poison();  // NaN: any read of an unwritten slot shows in the logits

  std::mt19937 rng(seed);
  const Tokens table_a = {5, 17, 2, 11, 20, 0}, table_b = {9, 3, 14, 22, 7, 1};
  Tokens a = random_tokens(37, c.vocab_size, rng), b = random_tokens(50, c.vocab_size, rng);
  std::vector<float> gpu;
  double worst = 0;  // largest |gpu − cpu| / σ over all steps
  std::size_t ties = 0, rows = 0;
  auto step = [&](const std::vector<ForwardChunk>& chunks, const char* what) {
    INFO(what);
    const std::vector<double>& sigma = reference.step(chunks);
    const std::vector<float>& cpu = reference.exact();
    gpu_model.forward(chunks, gpu_cache, gpu);
    worst = std::max(worst, check_within_noise(gpu, cpu, sigma, V));
    for (std::size_t r = 0; r * V < cpu.size(); ++r, ++rows) {
      const float *cr = cpu.data() + r * V, *gr = gpu.data() + r * V;
      const double* sr = sigma.data() + r * V;
      const auto ci = static_cast<std::size_t>(std::max_element(cr, cr + V) - cr);
      const auto gi = static_cast<std::size_t>(std::max_element(gr, gr + V) - gr);
      if (ci == gi) continue;
      const double margin = static_cast<double>(cr[ci]) - cr[gi], allowed = noise_bound(cr[ci], sr[ci]) + noise_bound(cr[gi], sr[gi]);
      INFO("row " << r << ": cpu argmax " << ci << ", gpu argmax " << gi << ", margin " << margin << ", bound " << allowed);
      CHECK(margin <= allowed);
      ++ties;
    }
  };
  const Tokens b_head(b.begin(), b.begin() + 20), b_tail(b.begin() + 20, b.end());
  step({ForwardChunk{a, 0, table_a, true}, ForwardChunk{b_head, 0, table_b, false}}, "prefill: a whole, b's head");
  Tokens a1 = random_tokens(1, c.vocab_size, rng);
  step({ForwardChunk{a1, 37, table_a, true}, ForwardChunk{b_tail, 20, table_b, true}}, "a decodes, b's tail");
  for (std::int32_t i = 0; i < 4; ++i) {
    Tokens ta = random_tokens(1, c.vocab_size, rng), tb = random_tokens(1, c.vocab_size, rng);
    step({ForwardChunk{ta, 38 + i, table_a, true}, ForwardChunk{tb, 50 + i, table_b, true}}, "decode both");
  }
  for (std::int32_t i = 0; i < 2; ++i) {
    Tokens ta = random_tokens(1, c.vocab_size, rng);
    step({ForwardChunk{ta, 42 + i, table_a, true}}, "a decodes alone");
  }
  std::printf("  %s: worst |gpu - cpu| / sigma %.2f (bound %.0f); argmax differs at %zu of %zu rows, each a near-tie\n",
              who, worst, kSigmas, ties, rows);
}

}  // namespace

TEST_CASE("GPU decoder logits equal the CPU decoder's within the derived bound on dummy Llama and Qwen2 shapes",
          "[cuda][model]") {
  SECTION("Llama shape (GQA 2:1, head_dim 64), bf16 weights") {
    compare_decoders<GpuModel<Bf16>>(ModelSource::dummy(small_llama(), 11, "small llama"), "small llama, bf16");
  }
  SECTION("Qwen2 shape (q/k/v biases, tied embeddings, head_dim 128), in-place quantizer") {
    compare_decoders<GpuModel<GgufInPlace>>(ModelSource::dummy(small_qwen2(), 12, "small qwen2"), "small qwen2, in place");
  }
  SECTION("the smollm2-135m preset (30 layers) built from one seed on both backends") {
    compare_decoders<GpuModel<>>(ModelSource::dummy(dummy_preset("smollm2-135m"), 13, "smollm2-135m"), "smollm2-135m preset");
  }
}

TEST_CASE("GPU decoder logits equal the CPU decoder's within the derived bound on SmolLM2 Q4_1 (GGUF blocks in place)",
          "[cuda][model]") {
  // Prefill of 37 and 20 + 30 tokens takes dequantize + GEMM, the decode steps the fused GEMV.
  compare_decoders<GpuModel<GgufInPlace>>(ModelSource::open(default_model()), "SmolLM2 Q4_1");
}

TEST_CASE("the tiny HF fixtures (head_dim 16) are refused on the GPU with a message", "[cuda][model]") {
  const ModelSource src = ModelSource::open(fixture("tiny_llama"));
  try {
    (void)GpuModel<>::load(src);
    FAIL("loading a head_dim 16 model on the GPU did not throw");
  } catch (const UnsupportedError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("head_dim 16") != std::string::npos);
  }
}

TEST_CASE("PagedEngine<cuda> on SmolLM2: every greedy token is the CPU reference's (HF's) choice or a derived near-tie",
          "[cuda][engine]") {
  const auto ref = read_json("smollm2/generate_reference.json");
  Workload w;
  std::vector<Tokens> hf;
  for (const auto& c : ref["cases"]) {
    w.prompts.push_back(c["prompt_ids"].get<Tokens>());
    w.max_tokens.push_back(ref["new_tokens"].get<std::int32_t>());
    hf.push_back(c["greedy_ids"].get<Tokens>());
  }
  PagedEngine<cuda, 16> engine(default_model(), EngineOptions{});
  // The device argmax (plain greedy), the device sampler (logprobs 0) and the host sampler (top 5) see the
  // same logits for the same batch, so the three kinds of the same prompts pick the same tokens.
  std::vector<std::vector<GreedyOutput>> kinds;
  for (std::size_t kind = 0; kind < 3; ++kind) {
    for (std::size_t i = 0; i < w.prompts.size(); ++i) engine.add_request(w.prompts[i], greedy_kind(kind, w.max_tokens[i]));
    const auto done = engine.run_to_completion();
    REQUIRE(done.size() == w.prompts.size());
    kinds.emplace_back();
    for (std::size_t i = 0; i < done.size(); ++i)
      kinds.back().push_back({w.prompts[i], done[i].outputs.at(0).token_ids, done[i].outputs.at(0).logprobs});
    check_all_blocks_free(engine);
  }
  for (std::size_t i = 0; i < w.prompts.size(); ++i) {
    CHECK(kinds[0][i].tokens == kinds[1][i].tokens);
    CHECK(kinds[0][i].tokens == kinds[2][i].tokens);
  }
  // The CPU reference is HF's (test_engine_reference: equal token for token), so this checks the GPU
  // against HF at every step, not only until the first near-tie.
  check_replay(ModelSource::open(default_model()), kinds[2], "SmolLM2");
  std::size_t identical = 0;
  for (std::size_t i = 0; i < hf.size(); ++i) identical += kinds[0][i].tokens == hf[i];
  std::printf("  SmolLM2 on the GPU: %zu of %zu prompts identical to HF over %d tokens\n", identical, hf.size(),
              w.max_tokens[0]);
  CHECK(engine.model().graph_steps() > 0);
}

TEST_CASE("PagedEngine<cuda> on dummy models: every greedy token is the CPU reference's choice or a derived near-tie",
          "[cuda][engine]") {
  std::mt19937 rng(test_seed("engine on dummy models"));
  // Batches that grow and shrink share one attention workspace.
  for (const ModelConfig& config : {small_llama(), small_qwen2()}) {
    INFO(config.architecture);
    const Workload w = mixed_workload(24, config.vocab_size, rng);
    PagedEngine<cuda, 16> engine(ModelSource::dummy(config, 21), EngineOptions{});
    const auto gpu = run_together(engine, w);
    check_replay(ModelSource::dummy(config, 21), gpu, config.architecture.c_str());
    check_all_blocks_free(engine);
    if (config.tie_word_embeddings) {
      // The peaked case: with tied embeddings the current token's own logit leads by far (measured on the
      // CPU: no near-tie in 240 greedy steps, margins at least 6 bounds in 99% of them), so here the GPU
      // engine's tokens must equal the CPU engine's outright, whole sequences.
      PagedEngine<cpu, 16> cpu_engine(ModelSource::dummy(config, 21), EngineOptions{});
      const auto want = run_together(cpu_engine, w);
      for (std::size_t i = 0; i < w.prompts.size(); ++i) {
        INFO("request " << i);
        CHECK(gpu[i].tokens == want[i].tokens);
      }
    }
  }
}

// Batch invariance is not bit for bit: a request alone runs every decode step at one row (the bf16 GEMV,
// decode attention split for one sequence, the LM head GEMV), together at many (cuBLASLt, whose algorithm
// and so summation order depends on M; attention splits chosen from the batch size; the LM head GEMM), and
// a prefill chunk's tokens take the prefill attention kernel where a lone request's would take the decode
// kernel. So each run is checked step by step against the CPU reference, and the spread between them printed.
TEST_CASE("PagedEngine<cuda>: 64 requests alone and together each match the CPU reference step by step, every block returns",
          "[cuda][engine][batching]") {
  std::mt19937 rng(test_seed("gpu batching"));
  const ModelConfig config = small_llama();
  const auto source = [&] { return ModelSource::dummy(config, 31); };
  const Workload w = mixed_workload(64, config.vocab_size, rng);
  std::vector<GreedyOutput> alone;
  {
    PagedEngine<cuda, 16> engine(source(), EngineOptions{});
    for (std::size_t i = 0; i < w.prompts.size(); ++i) {
      engine.add_request(w.prompts[i], greedy_kind(i, w.max_tokens[i]));
      const auto done = engine.run_to_completion();
      REQUIRE(done.size() == 1);
      alone.push_back({w.prompts[i], done[0].outputs.at(0).token_ids, done[0].outputs.at(0).logprobs});
      REQUIRE(alone.back().tokens.size() == static_cast<std::size_t>(w.max_tokens[i]));
    }
    check_all_blocks_free(engine);
  }
  check_replay(source(), alone, "alone");

  SECTION("a roomy cache: one big continuous batch (decode steps replay graphs)") {
    PagedEngine<cuda, 16> engine(source(), EngineOptions{});
    const auto together = run_together(engine, w);
    check_replay(source(), together, "together");
    std::printf("  alone vs together: %s\n", spread(alone, together).c_str());
    CHECK(engine.stats().preemptions == 0);
    CHECK(engine.model().graph_steps() > 0);
    check_all_blocks_free(engine);
  }
  SECTION("a small cache and token budget: chunked prefill and preemption by recompute, block size 8") {
    EngineOptions o;
    o.max_model_len = 160;
    o.kv_cache_bytes = 48 * 8 * KvCache<cuda>::bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim);
    o.scheduler.max_num_batched_tokens = 48;
    o.scheduler.max_num_seqs = 16;
    PagedEngine<cuda, 8> engine(source(), o);
    REQUIRE(engine.kv_stats().total_blocks == 48);
    const auto together = run_together(engine, w);
    check_replay(source(), together, "chunked, preempted");
    std::printf("  alone vs chunked and preempted: %s\n", spread(alone, together).c_str());
    CHECK(engine.stats().preemptions > 0);
    check_all_blocks_free(engine);
  }
  SECTION("block size 32, eager (no graphs)") {
    EngineOptions o;
    o.enforce_eager = true;
    PagedEngine<cuda, 32> engine(source(), o);
    const auto together = run_together(engine, w);
    check_replay(source(), together, "block size 32, eager");
    std::printf("  alone vs block size 32 eager: %s\n", spread(alone, together).c_str());
    CHECK(engine.model().graph_steps() == 0);
    check_all_blocks_free(engine);
  }
}

// A graph replay launches the kernels its capture recorded on the captured buffers; the eager engine with
// eager padding runs the same kernels at the same padded shapes (batch padded to the bucket, tables at full
// width), so everything must agree bit for bit: tokens and every logprob. So must two runs of one workload.
TEST_CASE("PagedEngine<cuda>: CUDA graph replays compute bit for bit what eager steps of the same shape compute",
          "[cuda][engine][graphs]") {
  const std::vector<std::string> texts = {"The capital of France is", "def fibonacci(n):", "Once upon a time",
                                          "List three colors:", "2 + 2 =", "The sea is", "Hello", "Why is the sky blue?",
                                          "A haiku about autumn:"};
  // Two engines in one process: each gets a fixed pool (the default would give the first 90% of the device).
  EngineOptions options;
  options.kv_cache_bytes = std::size_t{1} << 30;
  options.enable_prefix_caching = false;  // a hit would change a prefill's shape between the runs compared
  EngineOptions eager_options = options;
  eager_options.enforce_eager = true;
  PagedEngine<cuda, 16> eager(default_model(), eager_options);
  PagedEngine<cuda, 16> graphed(default_model(), options);
  eager.model().set_eager_padding(true);
  REQUIRE(eager.model().num_graphs() == 0);
  REQUIRE(graphed.model().num_graphs() > 0);
  auto run = [](auto& engine, const std::vector<Tokens>& prompts) {
    for (std::size_t i = 0; i < prompts.size(); ++i) engine.add_request(prompts[i], greedy_kind(i, 48));
    return engine.run_to_completion();
  };
  for (std::size_t batch : {1u, 3u, 9u}) {  // 3 and 9 replay the graphs of buckets 4 and 12, padded
    INFO("batch " << batch);
    std::vector<Tokens> prompts;
    for (std::size_t i = 0; i < batch; ++i) prompts.push_back(eager.tokenizer()->encode(texts[i]));
    const auto before = graphed.model().graph_steps();
    const auto want = run(eager, prompts);
    const auto got = run(graphed, prompts);
    CHECK(graphed.model().graph_steps() - before >= 40);
    const auto again = run(graphed, prompts);
    REQUIRE(got.size() == want.size());
    REQUIRE(again.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO("request " << i);
      const CompletionOutput &g = got[i].outputs.at(0), &e = want[i].outputs.at(0), &a = again[i].outputs.at(0);
      CHECK(g.token_ids == e.token_ids);
      CHECK(a.token_ids == g.token_ids);
      REQUIRE(g.logprobs.size() == e.logprobs.size());
      REQUIRE(a.logprobs.size() == g.logprobs.size());
      for (std::size_t t = 0; t < e.logprobs.size(); ++t) {
        CHECK(g.logprobs[t].logprob == e.logprobs[t].logprob);  // exact: the same bits
        CHECK(g.logprobs[t].top == e.logprobs[t].top);
        CHECK(a.logprobs[t].logprob == g.logprobs[t].logprob);
        CHECK(a.logprobs[t].top == g.logprobs[t].top);
      }
    }
  }
  CHECK(eager.model().graph_steps() == 0);
  check_all_blocks_free(eager);
  check_all_blocks_free(graphed);
}

/// Sampling parameters that exercise every stage of the sampler: seeded draws with top-p, top-k and
/// min-p, penalties on greedy and drawn rows, min_tokens bans, the sampled token's logprob. With
/// `host_only_kinds`, also the two kinds that need a whole row on the host (n = 2, top logprobs).
SamplingParams sampling_mix(std::size_t i, std::int32_t max_tokens, bool host_only_kinds) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.seed = 1000 + i;
  switch (i % (host_only_kinds ? 8 : 6)) {
    case 0: p.temperature = 0.8f; p.top_p = 0.9f; break;
    case 1: p.temperature = 1.0f; p.top_k = 20; p.logprobs = 0; break;
    case 2: p.temperature = 0.7f; p.min_p = 0.05f; p.repetition_penalty = 1.3f; break;
    case 3: p.temperature = 0.0f; p.frequency_penalty = 0.5f; p.presence_penalty = 0.3f; break;
    case 4: p.temperature = 0.9f; p.min_tokens = std::min(5, max_tokens); p.ignore_eos = false; p.stop_token_ids = {7}; break;
    case 5: p.temperature = 0.0f; break;
    // The host-only kinds end within a few tokens, so the steps after them sample on the device again.
    case 6: p.temperature = 0.8f; p.n = 2; p.max_tokens = std::min(max_tokens, 3); break;
    default: p.temperature = 1.2f; p.logprobs = 3; p.max_tokens = std::min(max_tokens, 3); break;
  }
  return p;
}

// The same engine twice, one drawing on the device and one copying logits to the CPU Sampler: both
// run identical steps, so their logits are bitwise equal and the tokens must be too (the GPU sampler
// may differ only within float rounding of a draw's boundary, about 1e-6 per draw: not in ~2,000 draws).
TEST_CASE("PagedEngine<cuda>: tokens drawn on the device equal the CPU Sampler's on the same logits",
          "[cuda][engine][sampling]") {
  std::mt19937 rng(test_seed("device sampling"));
  const ModelConfig config = small_llama();
  EngineOptions device_options;
  device_options.kv_cache_bytes = std::size_t{64} << 20;  // two engines in one process
  EngineOptions host_options = device_options;
  host_options.device_sampling = false;
  for (bool host_only_kinds : {false, true}) {
    INFO((host_only_kinds ? "with n = 2 and top-logprobs requests (their steps sample on the host)"
                          : "every step samples on the device"));
    PagedEngine<cuda, 16> on_device(ModelSource::dummy(config, 51), device_options);
    PagedEngine<cuda, 16> on_host(ModelSource::dummy(config, 51), host_options);
    const Workload w = mixed_workload(48, config.vocab_size, rng);
    for (std::size_t i = 0; i < w.prompts.size(); ++i) {
      const SamplingParams p = sampling_mix(i, w.max_tokens[i], host_only_kinds);
      on_device.add_request(w.prompts[i], p);
      on_host.add_request(w.prompts[i], p);
    }
    const auto got = on_device.run_to_completion();
    const auto want = on_host.run_to_completion();
    REQUIRE(got.size() == want.size());
    for (std::size_t r = 0; r < want.size(); ++r) {
      REQUIRE(got[r].outputs.size() == want[r].outputs.size());
      for (std::size_t k = 0; k < want[r].outputs.size(); ++k) {
        const CompletionOutput &g = got[r].outputs[k], &e = want[r].outputs[k];
        INFO("request " << r << " sample " << k);
        CHECK(g.token_ids == e.token_ids);
        CHECK(g.finish_reason == e.finish_reason);
        REQUIRE(g.logprobs.size() == e.logprobs.size());
        for (std::size_t t = 0; t < e.logprobs.size(); ++t) {
          CHECK(g.logprobs[t].token == e.logprobs[t].token);
          CHECK(std::abs(g.logprobs[t].logprob - e.logprobs[t].logprob) < 1e-4f);
        }
      }
    }
    CHECK(on_host.model().device_sampled_rows() == 0);
    CHECK(on_device.model().device_sampled_rows() > 0);
    if (!host_only_kinds) CHECK(on_device.model().device_sampled_rows() >= on_device.stats().generated_tokens / 2);
    check_all_blocks_free(on_device);
    check_all_blocks_free(on_host);
  }
}

// Two measures of memory over 10,000 mixed requests (100 waves of 100; some sampled, some n = 2, some
// aborted while waiting or running), both compared with their value after the first wave:
//   - infer's own allocations (every DeviceBuffer and PinnedBuffer: count and bytes) must be exactly where
//     they were: the engine makes all its buffers at construction, so any allocation a request leaves
//     behind shows here, to the byte;
//   - the device's free memory, which also sees allocations made outside infer's buffers (cuBLASLt, the
//     driver) but moves in 2 MiB granules. The H200 showed one 2 MiB step down at a varying wave (wave 15
//     of 100 in the run that logged it), then flat: a one-time reservation of the driver's. So it may step
//     down once; a second step fails. A leak of L bytes per request, over the 9,900 requests after the
//     first wave, crosses at least two granule boundaries once 9,900·L >= 4 MiB (the first crossing may
//     need a whole granule): this half of the test catches more than ~424 bytes per request. The one step
//     allowed may be up to two granules, as the test allowed before the exact counts existed.
TEST_CASE("PagedEngine<cuda>: device memory after 10,000 mixed requests is what it was after the first 100",
          "[cuda][engine][leak]") {
  std::mt19937 rng(test_seed("gpu leak"));
  const ModelConfig config = small_llama();
  EngineOptions o;
  o.max_model_len = 256;
  PagedEngine<cuda, 16> engine(ModelSource::dummy(config, 41), o);
  std::size_t free_after_100 = 0, free_before = 0;
  backend::cuda::LiveAllocations live_after_100;
  int steps_down = 0;
  std::ostringstream changes;
  std::int64_t done = 0;
  for (int wave = 0; wave < 100; ++wave) {
    std::vector<RequestId> ids;
    for (int i = 0; i < 100; ++i) {
      SamplingParams p = greedy_params(std::uniform_int_distribution<std::int32_t>(1, 12)(rng));
      if (i % 3 == 0) {
        p.temperature = 0.8f;
        p.top_p = 0.9f;
      }
      if (i % 10 == 0) p.n = 2;
      if (i % 5 == 1) p.logprobs = 2;
      ids.push_back(engine.add_request(random_tokens(std::uniform_int_distribution<std::size_t>(1, 120)(rng),
                                                     config.vocab_size, rng), p));
    }
    (void)engine.step();
    for (int i = 0; i < 100; i += 7) engine.abort(ids[static_cast<std::size_t>(i)]);
    done += static_cast<std::int64_t>(engine.run_to_completion().size());
    check_all_blocks_free(engine);
    const std::size_t free_now = backend::cuda::memory_info().free;
    const backend::cuda::LiveAllocations live = backend::cuda::live_allocations();
    if (wave == 0) {
      free_after_100 = free_now;
      live_after_100 = live;
    } else {
      INFO("wave " << wave << ": " << live.device_buffers << " device buffers of " << live.device_bytes << " bytes, "
                   << live.pinned_buffers << " pinned of " << live.pinned_bytes << "; after the first wave "
                   << live_after_100.device_buffers << " of " << live_after_100.device_bytes << ", "
                   << live_after_100.pinned_buffers << " of " << live_after_100.pinned_bytes);
      REQUIRE(live == live_after_100);
      if (free_now != free_before) {
        steps_down += free_now < free_before;
        changes << "wave " << wave << ": free memory " << free_before << " -> " << free_now << "; ";
      }
    }
    free_before = free_now;
  }
  INFO(changes.str());
  CHECK(done > 9000);  // the step before the aborts may have finished some (their outputs came then)
  CHECK(steps_down <= 1);
  CHECK(backend::cuda::memory_info().free + (std::size_t{4} << 20) >= free_after_100);
}

TEST_CASE("GgufInPlace holds a GGUF file's tensors in the file's bytes on the GPU", "[cuda][model]") {
  // Every tensor stays in its blocks (the embedding and tied head too), so the weight arena is the file's
  // tensor bytes, up to the arena's alignment of each allocation; widening any tensor to bf16 (SmolLM2's
  // Q4_1 embedding alone: 28 MB as blocks, 57 MB as bf16) breaks the 1% bound.
  const auto path = default_model();
  const auto file = gguf::File::open(path);
  std::uint64_t file_bytes = 0;
  for (const auto& t : file.tensors()) file_bytes += t.bytes;
  const auto model = GpuModel<GgufInPlace>::load(ModelSource::open(path));
  const double ratio = static_cast<double>(model.weight_bytes()) / static_cast<double>(file_bytes);
  std::printf("  SmolLM2 Q4_1: %llu bytes of tensors in the file, %zu on the GPU (%.4f)\n",
              static_cast<unsigned long long>(file_bytes), model.weight_bytes(), ratio);
  CHECK(ratio >= 1.0);
  CHECK(ratio <= 1.01);
}


TEST_CASE("GPU decoder on a GGUF of mixed block types (parts of different types, head and embedding in blocks)",
          "[cuda][model]") {
  const auto path = test::write_mixed_gguf();
  struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } remove{path};
  compare_decoders<GpuModel<GgufInPlace>>(ModelSource::open(path), "mixed block types");
  const auto file = gguf::File::open(path);
  std::uint64_t file_bytes = 0;
  for (const auto& t : file.tensors()) file_bytes += t.bytes;
  const auto model = GpuModel<GgufInPlace>::load(ModelSource::open(path));
  INFO(file_bytes << " bytes of tensors in the file, " << model.weight_bytes() << " on the GPU");
  CHECK(static_cast<double>(model.weight_bytes()) <= 1.01 * static_cast<double>(file_bytes) + 64 * 1024);
}
