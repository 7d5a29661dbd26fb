// FP8 E4M3: the host's codec (every code, round to nearest even, saturation) and infer::Fp8 (W8A8, the CPU
// reference): per-channel weights within e4m3's rounding, activations scaled per token, an FP8 checkpoint
// (F8_E4M3 `weight` + per-channel or per-tensor `weight_scale`) loaded as it is, typed errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/quant/fp8.hpp"
#include "support/tiny_checkpoint.hpp"

using namespace infer;
using namespace infer::test;
using Catch::Matchers::Contains;

static_assert(Quantizer<Fp8, cpu>);
static_assert(RoleQuantizer<Fp8, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<Fp8, cuda>);  // the FP8 GEMV and cuBLASLt GEMM (kernels/cuda/fp8_linear.cu, gemm.cu)
#else
static_assert(!Quantizer<Fp8, cuda>);  // a build without CUDA has no device linear: the concept says so
#endif

namespace {

using Fp8Model = LlamaModel<cpu, Fp8, PagedAttention<>>;
using F32Model = LlamaModel<cpu, F32, PagedAttention<>>;

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float sd = 0.5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// The e4m3 values, ascending: codes 0..126.
std::vector<float> positive_values() {
  std::vector<float> v;
  for (int c = 0; c < 127; ++c) v.push_back(e4m3_to_f32(static_cast<std::uint8_t>(c)));
  return v;
}

}  // namespace

TEST_CASE("e4m3: every code decodes and encodes back, a value goes to the nearer code, a midpoint to the even one",
          "[quant][fp8]") {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float v = e4m3_to_f32(code);
    if ((c & 0x7f) == 0x7f) {
      CHECK(std::isnan(v));
      continue;
    }
    INFO("code " << c << " = " << v);
    CHECK(f32_to_e4m3(v) == (c == 0x80 ? 0x80 : code));  // -0 keeps its sign
  }
  CHECK(e4m3_to_f32(0x7e) == 448.0f);
  CHECK(e4m3_to_f32(0x01) == 0x1p-9f);   // the smallest subnormal
  CHECK(e4m3_to_f32(0x08) == 0x1p-6f);   // the smallest normal
  CHECK(e4m3_to_f32(0x38) == 1.0f);
  const std::vector<float> pos = positive_values();
  for (std::size_t c = 0; c + 1 < pos.size(); ++c) {
    const float lo = pos[c], hi = pos[c + 1], mid = 0.5f * (lo + hi);
    INFO("between codes " << c << " and " << c + 1);
    CHECK(f32_to_e4m3(std::nextafter(mid, lo)) == c);
    CHECK(f32_to_e4m3(std::nextafter(mid, hi)) == c + 1);
    CHECK(f32_to_e4m3(mid) == (c % 2 == 0 ? c : c + 1));
    CHECK(f32_to_e4m3(-mid) == (0x80 | (c % 2 == 0 ? c : c + 1)));
  }
  // Saturation at ±448 (satfinite), NaN to NaN.
  for (float big : {449.0f, 464.0f, 1e6f, INFINITY}) {
    CHECK(f32_to_e4m3(big) == 0x7e);
    CHECK(f32_to_e4m3(-big) == 0xfe);
  }
  CHECK(std::isnan(e4m3_to_f32(f32_to_e4m3(NAN))));
}

TEST_CASE("Fp8::quantize: per-channel scale max|w|/448, every weight within e4m3's rounding of it", "[quant][fp8]") {
  const std::int64_t out = 29, in = 71;
  const std::vector<float> w = random_values(static_cast<std::size_t>(out * in), 3);
  const auto q = Fp8::quantize(w, out, in);
  for (std::int64_t o = 0; o < out; ++o) {
    const float s = q.scale[static_cast<std::size_t>(o)];
    for (std::int64_t i = 0; i < in; ++i) {
      const float x = w[static_cast<std::size_t>(o * in + i)];
      // Normal e4m3 values round within 2^-4 relative; subnormal ones within half their step, 2^-10 · s.
      CHECK(std::fabs(q.value(o, i) - x) <= std::max(std::fabs(x) * 0x1p-4f, s * 0x1p-10f) * (1 + 1e-6f));
    }
  }
  std::vector<float> bad = w;
  bad[5] = INFINITY;
  CHECK_THROWS_AS(Fp8::quantize(bad, out, in), FormatError);
}

TEST_CASE("Fp8::matmul scales each input row to e4m3 (per token) and multiplies by the e4m3 weight in f32",
          "[quant][fp8]") {
  const std::int64_t out = detail::kDecodeTileRows + 19, in = 40;
  const auto q = Fp8::quantize(random_values(static_cast<std::size_t>(out * in), 8), out, in);
  for (std::int32_t rows : {1, 5}) {
    INFO("rows " << rows);
    std::vector<float> x = random_values(static_cast<std::size_t>(rows * in), 20 + static_cast<std::uint32_t>(rows), 3.0f);
    x[3] = 0.0f;
    std::vector<float> got(static_cast<std::size_t>(rows * out));
    Fp8::matmul(cpu{}, q, x.data(), rows, got.data());
    for (std::int32_t r = 0; r < rows; ++r) {
      float amax = 0;
      for (std::int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(r * in + i)]));
      const float sx = amax / 448.0f;
      for (std::int64_t o = 0; o < out; ++o) {
        double want = 0;
        for (std::int64_t i = 0; i < in; ++i)
          want += static_cast<double>(e4m3_to_f32(f32_to_e4m3(x[static_cast<std::size_t>(r * in + i)] / sx)) * sx) *
                  q.value(o, i);
        CHECK(got[static_cast<std::size_t>(r * out + o)] == Approx(want).epsilon(1e-5).margin(1e-5));
      }
    }
  }
}

TEST_CASE("Fp8 loads an FP8 checkpoint as it is (per-channel or per-tensor scales), and quantizes others at load",
          "[quant][fp8][model]") {
  const auto channel = rewrite_tiny_llama("infer-fp8-channel", [](const std::string& n, const std::vector<float>& w,
                                                                  std::int64_t out, std::int64_t in) {
    return fp8_entries(n, w, out, in, false);
  });
  const Tokens prompt = {1, 17, 200, 5, 99, 42, 7};
  // Quantized at load, the f32 original gives the checkpoint's codes and scales: the same logits, bit for bit
  // (the head in f32 in both: the checkpoint ships it unquantized, and load keeps it so).
  CHECK(prompt_logits<Fp8>(channel, prompt) == prompt_logits<Fp8>(fixture("tiny_llama"), prompt));
  // A checkpoint that quantized its head too: the head loads as it is, in FP8.
  const auto head_too = rewrite_tiny_llama("infer-fp8-head", [](const std::string& n, const std::vector<float>& w,
                                                                std::int64_t out, std::int64_t in) {
    return fp8_entries(n, w, out, in, false);
  }, /*quantized_head=*/true);
  const ModelSource hs = ModelSource::open(head_too);
  const auto head = Fp8::load<cpu>(LinearRequest{hs, "output", hs.config().vocab_size, hs.config().hidden_size, true});
  CHECK((!head.is_dense() && head.consistent()));

  const auto tensor = rewrite_tiny_llama("infer-fp8-tensor", [](const std::string& n, const std::vector<float>& w,
                                                                std::int64_t out, std::int64_t in) {
    return fp8_entries(n, w, out, in, true);
  });
  const ModelSource src = ModelSource::open(tensor);
  const auto l = Fp8::load<cpu>(LinearRequest{src, "blk.1.ffn_down", src.config().hidden_size,
                                              src.config().intermediate_size});
  const WeightTensor codes = src.get("blk.1.ffn_down");
  const WeightTensor scale = src.get("blk.1.ffn_down.weight_scale");
  float s = 0;
  std::memcpy(&s, scale.data.data(), sizeof s);
  REQUIRE(scale.shape.empty());
  for (std::int64_t o = 0; o < l.out(); ++o) {
    CHECK(l.scale[static_cast<std::size_t>(o)] == s);  // the tensor's scale for every row
    for (std::int64_t i = 0; i < l.in(); i += 7)
      CHECK(l.value(o, i) == e4m3_to_f32(static_cast<std::uint8_t>(codes.data[static_cast<std::size_t>(o * l.in() + i)])) * s);
  }
  CHECK(prompt_logits<Fp8>(tensor, prompt).size() == prompt.size() * static_cast<std::size_t>(src.config().vocab_size));
}

TEST_CASE("Fp8 refuses an FP8 weight without its scale, or with one of the wrong shape, by name", "[quant][fp8]") {
  const auto wrong = rewrite_tiny_llama("infer-fp8-wrong-scale", [](const std::string& n, const std::vector<float>& w,
                                                                    std::int64_t out, std::int64_t in) {
    auto e = fp8_entries(n, w, out, in, false);
    if (n.find("layers.0.self_attn.o_proj") != std::string::npos) e.back().shape = {static_cast<std::uint64_t>(out) / 2, 2};
    if (n.find("layers.1.self_attn.v_proj") != std::string::npos) e.pop_back();
    return e;
  });
  CHECK_THROWS_WITH(Fp8Model::load(ModelSource::open(wrong)), Contains("o_proj.weight_scale") && Contains("per output row"));
  const ModelSource src = ModelSource::open(wrong);
  CHECK_THROWS_AS(Fp8::load<cpu>(LinearRequest{src, "blk.1.attn_v", src.config().kv_size(), src.config().hidden_size}),
                  NotFoundError);
  // F32 cannot decode e4m3 without its scale: an error naming the tensor, not a crash.
  CHECK_THROWS_WITH(F32Model::load(src), Contains("fp8_e4m3"));
}
