// infer::F32: every weight type decoded to an f32 [out][in] matrix, matmul = x · wᵀ through OpenBLAS.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/f32.hpp"

using namespace infer;

static_assert(Quantizer<F32, cpu>);
static_assert(!Quantizer<F32, cuda>);  // not implemented yet: the concept says so instead of failing hard
static_assert(F32::name == "f32");

namespace {

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("F32 loads f32, f16 and bf16 weights exactly and multiplies x by w transposed", "[quant][f32]") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-64, 64);
  const int out = 5, in = 7, rows = 3;
  std::vector<float> w(out * in);
  for (auto& v : w) v = static_cast<float>(small(rng)) / 8.0f;  // exact in f16 and bf16
  std::vector<std::uint16_t> h(w.size()), b(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    h[i] = f32_to_f16(w[i]);
    b[i] = f32_to_bf16(w[i]);
  }
  const auto wb = bytes_of(w), hb = bytes_of(h), bb = bytes_of(b);
  const std::vector<WeightTensor> tensors = {
      {"w.f32", DType::f32, {out, in}, wb, std::nullopt},
      {"w.f16", DType::f16, {out, in}, hb, std::nullopt},
      {"w.bf16", DType::bf16, {out, in}, bb, std::nullopt},
  };
  std::vector<float> x(rows * in);
  for (auto& v : x) v = static_cast<float>(small(rng)) / 4.0f;
  for (const auto& t : tensors) {
    INFO(t.name);
    const auto l = F32::load<cpu>(t);
    CHECK(l.out() == out);
    CHECK(l.in() == in);
    CHECK(l.w == w);
    std::vector<float> y(rows * out, -1.0f);
    F32::matmul(cpu{}, l, x.data(), rows, y.data());
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) {
        double s = 0;
        for (int i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w[o * in + i];
        CHECK(y[r * out + o] == Approx(s).margin(1e-5));
      }
    std::vector<float> y1(out);
    F32::matmul(cpu{}, l, x.data(), 1, y1.data());  // the one-row (gemv) path
    for (int o = 0; o < out; ++o) CHECK(y1[o] == Approx(y[o]).margin(1e-5));
  }
}

TEST_CASE("F32 decodes a GGUF block format (Q8_0)", "[quant][f32]") {
  // Two rows of one Q8_0 block each: f16 scale + 32 int8 codes; value = scale * code.
  const int out = 2, in = 32;
  std::vector<std::byte> data;
  std::vector<float> want;
  for (int r = 0; r < out; ++r) {
    const float scale = r == 0 ? 0.5f : 0.25f;
    const std::uint16_t s = f32_to_f16(scale);
    data.push_back(static_cast<std::byte>(s & 0xff));
    data.push_back(static_cast<std::byte>(s >> 8));
    for (int i = 0; i < in; ++i) {
      const auto q = static_cast<std::int8_t>(i - 16 + r);
      data.push_back(static_cast<std::byte>(q));
      want.push_back(scale * q);
    }
  }
  const WeightTensor t{"blk.0.attn_q.weight", DType::q8_0, {out, in}, data, std::nullopt};
  const auto l = F32::load<cpu>(t);
  CHECK(l.w == want);
}

TEST_CASE("F32 rejects tensors that are not a linear weight or whose bytes disagree", "[quant][f32]") {
  const std::vector<float> w(6, 1.0f);
  const auto wb = bytes_of(w);
  CHECK_THROWS_AS(F32::load<cpu>(WeightTensor{"norm", DType::f32, {6}, wb, std::nullopt}), InvalidArgument);
  CHECK_THROWS_AS(F32::load<cpu>(WeightTensor{"cube", DType::f32, {1, 2, 3}, wb, std::nullopt}), InvalidArgument);
  try {
    (void)F32::load<cpu>(WeightTensor{"short", DType::f32, {2, 4}, wb, std::nullopt});  // 8 values claimed, 6 present
    FAIL("no error");
  } catch (const FormatError& e) {
    CHECK_THAT(e.what(), Catch::Contains("short"));
  }
}
