// infer::Int8WeightOnly (W8A16, per-channel): round-to-nearest within half a step of every weight, matmul
// exactly x · (q·s)ᵀ, loading by role — an INT8 checkpoint (I8 `weight` + `weight_scale`) as it is, any
// other weight quantized at build, both giving the same model — and typed errors for a malformed one.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "infer/attention/paged_attention.hpp"
#include "infer/core/error.hpp"
#include "infer/engine/engine.hpp"
#include "infer/model/llama.hpp"
#include "infer/quant/int8_weight_only.hpp"
#include "support/fixtures.hpp"
#include "support/tiny_checkpoint.hpp"
#include "unit/engine/engine_test_support.hpp"

using namespace infer;
using namespace infer::test;
using Catch::Matchers::Contains;

static_assert(Quantizer<Int8WeightOnly, cpu>);
static_assert(RoleQuantizer<Int8WeightOnly, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<Int8WeightOnly, cuda>);  // kernels/cuda/int_linear.cu
#else
static_assert(!Quantizer<Int8WeightOnly, cuda>);  // a build without CUDA has no cuda linear for it
#endif
static_assert(!RoleQuantizer<F32, cpu>);          // F32 loads one tensor

namespace {

using Int8Model = LlamaModel<cpu, Int8WeightOnly, PagedAttention<>>;
using F32Model = LlamaModel<cpu, F32, PagedAttention<>>;

std::vector<float> random_matrix(std::int64_t out, std::int64_t in, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> w(static_cast<std::size_t>(out * in));
  for (auto& v : w) v = d(rng);
  return w;
}

/// The same weight dequantized (q·s) and stored as f32: what F32 must compute the same logits from.
std::vector<SafetensorsEntry> dequantized_entries(const std::string& name, const std::vector<float>& w, std::int64_t out,
                                                  std::int64_t in) {
  const auto q = Int8WeightOnly::quantize(w, out, in);
  std::vector<float> d(w.size());
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) d[static_cast<std::size_t>(o * in + i)] = q.value(o, i);
  return {SafetensorsEntry::of<float>(name, "F32", {static_cast<std::uint64_t>(out), static_cast<std::uint64_t>(in)}, d)};
}

}  // namespace

TEST_CASE("Int8WeightOnly::quantize: one scale per row, every weight within half a step, the row's extreme at 127",
          "[quant][int8]") {
  const std::int64_t out = 37, in = 53;
  std::vector<float> w = random_matrix(out, in, 5);
  std::fill(w.begin() + 3 * in, w.begin() + 4 * in, 0.0f);  // a zero row: scale 0, values 0
  const auto q = Int8WeightOnly::quantize(w, out, in);
  REQUIRE(q.out() == out);
  REQUIRE(q.in() == in);
  for (std::int64_t o = 0; o < out; ++o) {
    const float s = q.scale[static_cast<std::size_t>(o)];
    int extreme = 0;
    for (std::int64_t i = 0; i < in; ++i) {
      const auto k = static_cast<std::size_t>(o * in + i);
      CHECK(std::fabs(q.value(o, i) - w[k]) <= 0.5f * s * (1.0f + 1e-5f));
      extreme = std::max(extreme, std::abs(static_cast<int>(q.q[k])));
    }
    if (o == 3) {
      CHECK(s == 0.0f);
      CHECK(extreme == 0);
    } else {
      CHECK(extreme == 127);
    }
  }
  std::vector<float> bad = w;
  bad[7] = std::nanf("");
  CHECK_THROWS_AS(Int8WeightOnly::quantize(bad, out, in), FormatError);
}

TEST_CASE("Int8WeightOnly::matmul is x · (q·s)ᵀ for any rows and a width that is not a multiple of its tile",
          "[quant][int8]") {
  const std::int64_t out = detail::kDecodeTileRows * 2 + 45, in = 96;
  const auto q = Int8WeightOnly::quantize(random_matrix(out, in, 9), out, in);
  std::vector<float> dense(static_cast<std::size_t>(out * in));
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) dense[static_cast<std::size_t>(o * in + i)] = q.value(o, i);
  for (std::int32_t rows : {1, 3, 17}) {
    INFO("rows " << rows);
    const std::vector<float> x = random_matrix(rows, in, 100 + static_cast<std::uint32_t>(rows));
    std::vector<float> got(static_cast<std::size_t>(rows * out)), want(got.size());
    Int8WeightOnly::matmul(cpu{}, q, x.data(), rows, got.data());
    kernels::cpu::gemm_xwt(x.data(), dense.data(), want.data(), rows, out, in);
    for (std::size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-5).margin(1e-5));
  }
}

TEST_CASE("Int8WeightOnly loads an INT8 checkpoint as it is, and quantizes any other weight at build to the same model",
          "[quant][int8][model]") {
  const auto int8_dir = rewrite_tiny_llama("infer-int8-checkpoint", int8_entries);
  const auto dequantized_dir = rewrite_tiny_llama("infer-int8-dequantized", dequantized_entries);
  const Tokens prompt = {1, 17, 200, 5, 99, 42, 7};
  const std::vector<float> from_int8 = prompt_logits<Int8WeightOnly>(int8_dir, prompt);
  const std::vector<float> at_build = prompt_logits<Int8WeightOnly>(fixture("tiny_llama"), prompt);
  const std::vector<float> f32 = prompt_logits<F32>(dequantized_dir, prompt);
  REQUIRE(from_int8.size() == f32.size());
  // Quantized at build, the original f32 weights give the checkpoint's int8 values and scales: same bits.
  CHECK(at_build == from_int8);
  // F32 over the dequantized weights is the same product, up to the GEMMs' summation order.
  double worst = 0;
  for (std::size_t k = 0; k < f32.size(); ++k) worst = std::max(worst, std::fabs(static_cast<double>(from_int8[k]) - f32[k]));
  INFO("worst |int8 - f32(q·s)| " << worst);
  CHECK(worst < 1e-4);
  // A checkpoint that quantized its head too: the head loads as it is, in INT8.
  const auto head_too = rewrite_tiny_llama("infer-int8-head", int8_entries, /*quantized_head=*/true);
  const ModelSource hs = ModelSource::open(head_too);
  const auto head = Int8WeightOnly::load<cpu>(LinearRequest{hs, "output", hs.config().vocab_size, hs.config().hidden_size, true});
  CHECK((!head.is_dense() && head.consistent()));

  SECTION("composed into an engine, it generates what F32 over the dequantized weights generates") {
    using Int8Engine = Engine<cpu, llama, PagedBlockAllocator<16>, ContinuousBatchScheduler<>, PagedAttention<>, Int8WeightOnly>;
    Int8Engine int8(ModelSource::open(int8_dir), EngineOptions{});
    PagedEngine<cpu, 16> reference(ModelSource::open(dequantized_dir), EngineOptions{});
    const std::vector<Tokens> prompts = {prompt, {3, 4, 5}, {250, 1, 1, 9, 60}};
    CHECK(run_batch(int8, prompts, greedy_params(12)) == run_batch(reference, prompts, greedy_params(12)));
  }
}

TEST_CASE("Int8WeightOnly refuses an INT8 weight without its scale, or with a scale of the wrong shape, by name",
          "[quant][int8]") {
  const auto no_scale = rewrite_tiny_llama("infer-int8-no-scale", [](const std::string& name, const std::vector<float>& w,
                                                                     std::int64_t out, std::int64_t in) {
    auto e = int8_entries(name, w, out, in);
    if (name.find("layers.1.mlp.up_proj") != std::string::npos) e.pop_back();
    return e;
  });
  CHECK_THROWS_AS(Int8Model::load(ModelSource::open(no_scale)), NotFoundError);
  CHECK_THROWS_WITH(Int8Model::load(ModelSource::open(no_scale)),
                    Contains("blk.1.ffn_up") && Contains("model.layers.1.mlp.up_proj.weight_scale"));
  // F32 cannot decode int8 without its scale: a FormatError naming the tensor, not a crash.
  CHECK_THROWS_WITH(F32Model::load(ModelSource::open(no_scale)), Contains("int8"));

  const auto wrong = rewrite_tiny_llama("infer-int8-wrong-scale", [](const std::string& name, const std::vector<float>& w,
                                                                    std::int64_t out, std::int64_t in) {
    auto e = int8_entries(name, w, out, in);
    if (name.find("layers.0.self_attn.k_proj") != std::string::npos) {
      e.back().shape = {1, static_cast<std::uint64_t>(out)};  // [1, out]: a row, not a column
    }
    return e;
  });
  CHECK_THROWS_AS(Int8Model::load(ModelSource::open(wrong)), FormatError);
  CHECK_THROWS_WITH(Int8Model::load(ModelSource::open(wrong)),
                    Contains("k_proj.weight_scale") && Contains("one scale per output row"));
}

TEST_CASE("ModelSource names a matrix's companion tensors in the file's own convention", "[quant][model]") {
  const ModelSource hf = ModelSource::open(fixture("tiny_llama"));
  CHECK(hf.file_name("blk.0.attn_q.weight_scale") == "model.layers.0.self_attn.q_proj.weight_scale");
  CHECK(hf.file_name("blk.3.ffn_down.qzeros") == "model.layers.3.mlp.down_proj.qzeros");
  CHECK(hf.file_name("output.g_idx") == "lm_head.g_idx");
  CHECK_FALSE(hf.find("blk.0.attn_q.weight_scale").has_value());  // an f32 checkpoint has none
  CHECK_THROWS_AS(hf.find("blk.0.attn_norm.weight_scale"), InvalidArgument);  // a norm has no companions
  CHECK_THROWS_AS(hf.find("blk.0.attn_q.scale"), InvalidArgument);
  const ModelSource dummy = ModelSource::dummy(hf.config(), 3);
  CHECK_FALSE(dummy.find("blk.0.attn_q.weight_scale").has_value());
}
