// infer::Int4 (W4A16, group-wise, asymmetric): round-to-nearest within half a step, GPTQ (v1, with and
// without act-order g_idx) and AWQ checkpoints read in their own packings, the same model as F32 over the
// dequantized weights, typed errors for a malformed packing.
//
// The packings here are written from the formats' definitions (AutoGPTQ's pack: codes along the input, eight
// to an int32, zeros stored minus one; AWQ's GEMM pack: along the output in the order 0 2 4 6 1 3 5 7), not
// from another implementation's code.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/int4.hpp"
#include "support/int4_checkpoint.hpp"
#include "support/tiny_checkpoint.hpp"

using namespace infer;
using namespace infer::test;
using Catch::Matchers::Contains;

static_assert(Quantizer<Int4, cpu>);
static_assert(RoleQuantizer<Int4, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<Int4, cuda>);  // kernels/cuda/int_linear.cu
#else
static_assert(!Quantizer<Int4, cuda>);  // a build without CUDA has no cuda linear for it
#endif

namespace {

using Int4Model = LlamaModel<cpu, Int4, PagedAttention<>>;
using F32Model = LlamaModel<cpu, F32, PagedAttention<>>;

}  // namespace

TEST_CASE("Int4::quantize: per group, zero exact, every weight within half a step", "[quant][int4]") {
  const std::int64_t out = 6, in = 256;
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.1f, 0.5f);
  std::vector<float> w(static_cast<std::size_t>(out * in));
  for (auto& v : w) v = d(rng);
  std::fill(w.begin(), w.begin() + 128, 0.0f);  // a group of zeros
  const auto l = Int4::quantize(w, out, in, Int4::group_size_for(in));
  REQUIRE(l.group_size == 128);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = 0; i < in; ++i) {
      const float s = l.scale[static_cast<std::size_t>(o * l.groups + i / 128)];
      CHECK(std::fabs(l.value(o, i) - w[static_cast<std::size_t>(o * in + i)]) <= 0.5f * s * (1 + 1e-5f) + 1e-7f);
    }
  CHECK(l.value(0, 5) == 0.0f);
  CHECK(Int4::group_size_for(160) == 32);
  CHECK(Int4::group_size_for(64) == 64);
}

TEST_CASE("Int4 reads GPTQ (with and without act-order) and AWQ checkpoints in their own packings", "[quant][int4][model]") {
  const Tokens prompt = {1, 17, 200, 5, 99, 42, 7};
  for (Packing packing : {Packing::gptq, Packing::gptq_act_order, Packing::awq}) {
    const std::string tag = packing == Packing::awq ? "awq" : packing == Packing::gptq ? "gptq" : "gptq-act-order";
    INFO(tag);
    // The head packed too: a checkpoint's packed head loads as it is (only an unquantized one is kept in f32).
    const auto packed = rewrite_tiny_llama("infer-int4-" + tag, [&](const std::string& n, const std::vector<float>& w,
                                                                    std::int64_t out, std::int64_t in) {
      return packed_entries(n, w, out, in, packing);
    }, /*quantized_head=*/true);
    const auto dequantized = rewrite_tiny_llama("infer-int4-f32-" + tag, [&](const std::string& n, const std::vector<float>& w,
                                                                            std::int64_t out, std::int64_t in) {
      return dequantized_entries(n, w, out, in, packing);
    }, /*quantized_head=*/true);
    // One layer value by value: what the packing holds, decoded.
    const ModelSource src = ModelSource::open(packed), ref = ModelSource::open(dequantized);
    const ModelConfig& c = src.config();
    const auto l = Int4::load<cpu>(LinearRequest{src, "blk.1.ffn_down", c.hidden_size, c.intermediate_size});
    const WeightTensor want = ref.get("blk.1.ffn_down");
    std::vector<float> wv(static_cast<std::size_t>(want.elements()));
    dequantize_to_f32(want, wv);
    std::size_t equal = 0;
    for (std::int64_t o = 0; o < l.out(); ++o)
      for (std::int64_t i = 0; i < l.in(); ++i) equal += l.value(o, i) == wv[static_cast<std::size_t>(o * l.in() + i)];
    CHECK(equal == wv.size());
    CHECK(l.g_idx.empty() == (packing != Packing::gptq_act_order));
    CHECK_FALSE(Int4::load<cpu>(LinearRequest{src, "output", c.vocab_size, c.hidden_size, /*lm_head=*/true}).is_dense());
    // The whole model: the same logits as F32 over the dequantized weights, up to the GEMMs' summation order.
    const std::vector<float> a = prompt_logits<Int4>(packed, prompt), b = prompt_logits<F32>(dequantized, prompt);
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::fabs(static_cast<double>(a[k]) - b[k]));
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("Int4 refuses a packing it cannot read, naming the tensor and what it expected", "[quant][int4]") {
  const auto bad = rewrite_tiny_llama("infer-int4-bad", [](const std::string& n, const std::vector<float>& w,
                                                           std::int64_t out, std::int64_t in) {
    auto e = packed_entries(n, w, out, in, Packing::gptq);
    if (n.find("layers.0.mlp.gate_proj") != std::string::npos) e[0].shape = {e[0].shape[1], e[0].shape[0]};
    if (n.find("layers.1.self_attn.q_proj") != std::string::npos) e.pop_back();  // no scales
    return e;
  });
  const ModelSource src = ModelSource::open(bad);
  const ModelConfig& c = src.config();
  CHECK_THROWS_WITH(Int4::load<cpu>(LinearRequest{src, "blk.0.ffn_gate", c.intermediate_size, c.hidden_size}),
                    Contains("gate_proj.qweight") && Contains("(GPTQ)") && Contains("(AWQ)"));
  CHECK_THROWS_AS(Int4::load<cpu>(LinearRequest{src, "blk.1.attn_q", c.q_size(), c.hidden_size}), NotFoundError);
  CHECK_THROWS_WITH(Int4Model::load(src), Contains("gate_proj.qweight"));
  // F32 finds no `weight` in a GPTQ checkpoint: NotFoundError naming it.
  CHECK_THROWS_AS(F32Model::load(src), NotFoundError);
}

TEST_CASE("Int4 follows quantization_config: the packing and group size it names are checked, and a Quantizer "
          "that reads unquantized weights says which one reads the checkpoint", "[quant][int4][model]") {
  auto with_config = [](const std::string& tag, const nlohmann::json& qc) {
    const auto dir = rewrite_tiny_llama("infer-int4-config-" + tag, [](const std::string& n, const std::vector<float>& w,
                                                                      std::int64_t out, std::int64_t in) {
      return packed_entries(n, w, out, in, Packing::gptq);
    });
    std::ifstream in(dir / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["quantization_config"] = qc;
    std::ofstream(dir / "config.json") << config.dump(1);
    return dir;
  };
  // packed_entries packs every layer in groups of 32 inputs.
  const ModelSource src = ModelSource::open(with_config("gptq32", {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}}));
  const ModelConfig& c = src.config();
  REQUIRE(c.quantization);
  const auto down = Int4::load<cpu>(LinearRequest{src, "blk.1.ffn_down", c.hidden_size, c.intermediate_size});
  CHECK(down.group_size == 32);
  CHECK_NOTHROW(Int4Model::load(src));
  const ModelSource other = ModelSource::open(with_config("gptq64", {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 64}}));
  CHECK_THROWS_WITH(Int4::load<cpu>(LinearRequest{other, "blk.0.attn_q", c.q_size(), c.hidden_size}),
                    Contains("q_proj.scales") && Contains("group_size 64 from quantization_config"));
  CHECK_THROWS_WITH(F32Model::load(src), Contains("is quantized (quantization_config: gptq, 4-bit)") &&
                                             Contains("use --quantizer int4"));

  const ModelSource awq = ModelSource::open(with_config("awq-named", {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}}));
  CHECK_THROWS_WITH(Int4::load<cpu>(LinearRequest{awq, "blk.1.ffn_down", c.hidden_size, c.intermediate_size}),
                    Contains("down_proj.qweight") && Contains("the awq packing its quantization_config names"));
}

TEST_CASE("Int4 keeps GGUF Q4_0 and Q4_1 blocks as they are: groups of 32, the blocks' own scales",
          "[quant][int4][gguf]") {
  std::mt19937 rng(20261205);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> real(-0.05f, 0.05f);
  const std::int64_t out = 5, in = 96;  // 3 blocks a row
  for (const DType type : {DType::q4_0, DType::q4_1}) {
    INFO(name(type));
    const bool q4_1 = type == DType::q4_1;
    const std::size_t block_bytes = q4_1 ? 20 : 18;
    std::vector<std::byte> bytes(static_cast<std::size_t>(out * in / 32) * block_bytes);
    for (std::size_t b = 0; b < bytes.size() / block_bytes; ++b) {
      std::byte* blk = bytes.data() + b * block_bytes;
      const std::uint16_t d = b == 4 ? 0 : f32_to_f16(std::fabs(real(rng)) + 1e-3f);  // block 4: d = 0
      const std::uint16_t m = f32_to_f16(real(rng));
      std::memcpy(blk, &d, 2);
      if (q4_1) std::memcpy(blk + 2, &m, 2);
      for (std::size_t j = q4_1 ? 4 : 2; j < block_bytes; ++j) blk[j] = static_cast<std::byte>(byte(rng));
    }
    const WeightTensor t{"w", type, {static_cast<std::uint64_t>(out), static_cast<std::uint64_t>(in)}, bytes, std::nullopt};
    std::vector<float> want(static_cast<std::size_t>(out * in));
    dequantize_to_f32(t, want);
    const auto l = Int4::from_gguf_q4(t, out, in);
    CHECK(l.group_size == 32);
    CHECK(l.consistent());
    double worst = 0;
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) {
        const float w = want[static_cast<std::size_t>(o * in + i)];
        worst = std::max(worst, std::fabs(static_cast<double>(l.value(o, i)) - w));
      }
    // Q4_0 is exact; Q4_1's d·(q + m/d) differs from d·q + m by f32 rounding only (values below 1: a few
    // units of 2^-24).
    CHECK(worst <= (q4_1 ? 2e-7 : 0.0));
  }
  const WeightTensor short_t{"w", DType::q4_1, {2, 64}, std::span<const std::byte>(), std::nullopt};
  CHECK_THROWS_WITH(Int4::from_gguf_q4(short_t, 2, 64), Contains("not [2, 64] in blocks of 32"));
}
