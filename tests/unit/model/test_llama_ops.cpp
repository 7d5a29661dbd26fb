// The decoder's CPU kernels (kernels/cpu_ops.hpp) against their formulas in double: GEMM (x·wᵀ,
// one row and many), RMSNorm, the RoPE table and both RoPE styles — including that interleaved RoPE
// on llama.cpp-permuted q/k weights equals neox RoPE on the original weights — SwiGLU and adds.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "infer/kernels/cpu_ops.hpp"
#include "infer/model/model_config.hpp"

using namespace infer;
namespace kc = infer::kernels::cpu;

namespace {

std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// y[r] = x[r] · wᵀ in double.
std::vector<double> naive_xwt(const std::vector<float>& x, const std::vector<float>& w, int rows, int out, int in) {
  std::vector<double> y(static_cast<std::size_t>(rows) * out);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

ModelConfig rope_config(std::int64_t head_dim) {
  ModelConfig c;
  c.head_dim = head_dim;
  c.rope_theta = 10000.0f;
  return c;
}

}  // namespace

TEST_CASE("gemm_xwt equals x times w transposed", "[model][ops]") {
  std::mt19937 rng(1);
  for (int rows : {1, 2, 7}) {
    const int out = 37, in = 53;
    const auto x = random_vector(static_cast<std::size_t>(rows) * in, rng);
    const auto w = random_vector(static_cast<std::size_t>(out) * in, rng);
    std::vector<float> y(static_cast<std::size_t>(rows) * out, 123.0f);  // overwritten, not accumulated
    kc::gemm_xwt(x.data(), w.data(), y.data(), rows, out, in);
    const auto want = naive_xwt(x, w, rows, out, in);
    for (std::size_t i = 0; i < y.size(); ++i) REQUIRE(y[i] == Approx(want[i]).margin(1e-4));
  }
}

TEST_CASE("rms_norm: x / sqrt(mean(x^2) + eps) * weight, in place too", "[model][ops]") {
  std::mt19937 rng(2);
  const int rows = 3, dim = 40;
  const float eps = 1e-5f;
  auto x = random_vector(rows * dim, rng, 3.0f);
  const auto w = random_vector(dim, rng);
  std::vector<float> y(x.size());
  kc::rms_norm(x.data(), w.data(), y.data(), rows, dim, eps);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) REQUIRE(y[r * dim + i] == Approx(x[r * dim + i] * inv * w[i]).epsilon(1e-6));
  }
  kc::rms_norm(x.data(), w.data(), x.data(), rows, dim, eps);
  CHECK(x == y);
  // eps keeps an all-zero row finite.
  std::vector<float> zero(dim, 0.0f), out(dim, 1.0f);
  kc::rms_norm(zero.data(), w.data(), out.data(), 1, dim, eps);
  for (float v : out) CHECK(v == 0.0f);
}

TEST_CASE("rope_table and both RoPE styles rotate the right pairs by pos * inv_freq", "[model][ops]") {
  std::mt19937 rng(3);
  const int D = 16, half = D / 2, heads = 3, rows = 4;
  const auto inv_freq = rope_inv_freq(rope_config(D));
  const std::vector<std::int32_t> pos = {0, 1, 17, 4000};
  std::vector<float> cs(static_cast<std::size_t>(rows) * D);
  kc::rope_table(pos.data(), rows, inv_freq.data(), half, cs.data());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos[r]) * inv_freq[i];
      REQUIRE(cs[r * D + 2 * i] == Approx(std::cos(a)).margin(1e-6));
      REQUIRE(cs[r * D + 2 * i + 1] == Approx(std::sin(a)).margin(1e-6));
    }

  for (RopeStyle style : {RopeStyle::neox, RopeStyle::interleaved}) {
    INFO(to_string(style));
    const auto x0 = random_vector(static_cast<std::size_t>(rows) * heads * D, rng);
    auto x = x0;
    kc::rope(x.data(), rows, heads, D, cs.data(), style);
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < half; ++i) {
          const int a = style == RopeStyle::neox ? i : 2 * i;
          const int b = style == RopeStyle::neox ? i + half : 2 * i + 1;
          const double ang = static_cast<double>(pos[r]) * inv_freq[i];
          const float* v0 = &x0[(r * heads + h) * D];
          const float* v = &x[(r * heads + h) * D];
          REQUIRE(v[a] == Approx(v0[a] * std::cos(ang) - v0[b] * std::sin(ang)).margin(1e-5));
          REQUIRE(v[b] == Approx(v0[a] * std::sin(ang) + v0[b] * std::cos(ang)).margin(1e-5));
        }
    // Position 0 is the identity.
    for (int i = 0; i < heads * D; ++i) REQUIRE(x[i] == x0[i]);
  }
}

TEST_CASE("interleaved RoPE on permuted q/k weights equals neox RoPE on the original weights", "[model][ops]") {
  // llama.cpp's converter writes a llama q (or k) projection with each head's rows reordered so that
  // HF's pair (i, i + D/2) becomes (2i, 2i+1): new row 2i + j = old row j * D/2 + i. Rotating the
  // permuted projection's output in interleaved style must give the permuted neox result, and so the
  // same attention scores.
  std::mt19937 rng(4);
  const int D = 8, half = D / 2, heads = 2, hidden = 12, rows = 3;
  const int out = heads * D;
  const auto w = random_vector(static_cast<std::size_t>(out) * hidden, rng);
  std::vector<float> w_perm(w.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j)
        for (int c = 0; c < hidden; ++c)
          w_perm[(h * D + 2 * i + j) * hidden + c] = w[(h * D + j * half + i) * hidden + c];
  const auto x = random_vector(static_cast<std::size_t>(rows) * hidden, rng);
  const std::vector<std::int32_t> pos = {3, 11, 250};
  const auto inv_freq = rope_inv_freq(rope_config(D));
  std::vector<float> cs(static_cast<std::size_t>(rows) * D);
  kc::rope_table(pos.data(), rows, inv_freq.data(), half, cs.data());

  std::vector<float> q_hf(static_cast<std::size_t>(rows) * out), q_gguf(q_hf.size());
  kc::gemm_xwt(x.data(), w.data(), q_hf.data(), rows, out, hidden);
  kc::gemm_xwt(x.data(), w_perm.data(), q_gguf.data(), rows, out, hidden);
  kc::rope(q_hf.data(), rows, heads, D, cs.data(), RopeStyle::neox);
  kc::rope(q_gguf.data(), rows, heads, D, cs.data(), RopeStyle::interleaved);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) {
      double dot_hf = 0, dot_gguf = 0;  // q(r) · q(0): a score the permutation must not change
      for (int i = 0; i < half; ++i)
        for (int j = 0; j < 2; ++j) {
          const float a = q_gguf[(r * heads + h) * D + 2 * i + j];
          const float b = q_hf[(r * heads + h) * D + j * half + i];
          REQUIRE(a == Approx(b).margin(1e-5));
        }
      for (int d = 0; d < D; ++d) {
        dot_hf += static_cast<double>(q_hf[(r * heads + h) * D + d]) * q_hf[h * D + d];
        dot_gguf += static_cast<double>(q_gguf[(r * heads + h) * D + d]) * q_gguf[h * D + d];
      }
      CHECK(dot_gguf == Approx(dot_hf).epsilon(1e-5));
    }
  // And the styles really differ: neox on the permuted weights is not the same model.
  std::vector<float> wrong(q_hf.size());
  kc::gemm_xwt(x.data(), w_perm.data(), wrong.data(), rows, out, hidden);
  kc::rope(wrong.data(), rows, heads, D, cs.data(), RopeStyle::neox);
  double diff = 0;
  for (std::size_t i = 0; i < wrong.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(wrong[i] - q_gguf[i])));
  CHECK(diff > 1e-2);
}

TEST_CASE("swiglu, add and add_bias", "[model][ops]") {
  std::mt19937 rng(5);
  auto g = random_vector(50, rng, 4.0f);
  const auto g0 = g;
  const auto u = random_vector(50, rng);
  kc::swiglu(g.data(), u.data(), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double s = g0[i] / (1.0 + std::exp(-static_cast<double>(g0[i])));
    REQUIRE(g[i] == Approx(s * u[i]).margin(1e-6));
  }
  // Large negative gates give 0, not NaN (exp overflow to inf is handled by the division).
  std::vector<float> big = {-200.0f, 200.0f}, one = {1.0f, 1.0f};
  kc::swiglu(big.data(), one.data(), 2);
  CHECK(big[0] == 0.0f);
  CHECK(big[1] == 200.0f);

  std::vector<float> y = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {10, 20, 30};
  kc::add_bias(y.data(), b.data(), 2, 3);
  CHECK(y == std::vector<float>{11, 22, 33, 14, 25, 36});
  kc::add(y.data(), b.data(), 3);
  CHECK(y == std::vector<float>{21, 42, 63, 14, 25, 36});
}
