// RoPE and the KV-cache write fused into the batch-1 QKV GEMVs (kernels/cuda/rope_epilogue.cuh):
// bf16_gemv_rope and fp8_gemv_rope against the two kernels they replace, bf16_gemv (or fp8_gemv) followed by
// rope_write_kv, on the same random inputs. The fused kernel promises the same bits, so the check is exact:
// the projection's whole output and both caches (poisoned first, so a value written where the two-kernel
// path writes none, or missing where it writes one, fails too). Each of the two unfused kernels is checked
// against the CPU reference on its own (test_cuda_gemm.cpp, test_cuda_fp8.cpp, test_cuda_ops.cpp), so the
// fused one is held to the CPU reference through them.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "support/test_seed.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/fp8.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/ops.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

struct Heads {
  int nq, nkv, hd, style;
};

/// One random problem: x [M][K], positions and slots of M tokens (one a padding token when M > 2), caches.
struct Problem {
  Heads h;
  int M;
  std::int64_t K, cache_rows;
  std::vector<std::uint16_t> x;
  std::vector<std::int32_t> positions;
  std::vector<float> inv_freq;
  std::vector<std::int64_t> slot;

  Problem(const Heads& heads, int m, std::int64_t k, std::mt19937& rng) : h(heads), M(m), K(k) {
    x = random_bf16(static_cast<std::size_t>(M * K), rng);
    positions.resize(static_cast<std::size_t>(M));
    for (auto& p : positions) p = static_cast<std::int32_t>(rng() % 8192);
    if (M > 1) positions[1] = 0;
    inv_freq.resize(static_cast<std::size_t>(h.hd / 2));
    for (int i = 0; i < h.hd / 2; ++i)
      inv_freq[static_cast<std::size_t>(i)] = static_cast<float>(std::pow(500000.0, -2.0 * i / h.hd));
    cache_rows = 4 * M + 3;
    std::vector<std::int64_t> rows(static_cast<std::size_t>(cache_rows));
    std::iota(rows.begin(), rows.end(), std::int64_t{0});
    std::shuffle(rows.begin(), rows.end(), rng);
    slot.assign(rows.begin(), rows.begin() + M);
    if (M > 2) slot[2] = -1;
  }
  [[nodiscard]] std::int64_t N() const { return static_cast<std::int64_t>(h.nq + 2 * h.nkv) * h.hd; }
  [[nodiscard]] std::size_t cache_elems() const { return static_cast<std::size_t>(cache_rows * h.nkv * h.hd); }
};

/// Device buffers of one run: the projection's output and the two caches, poisoned; the metadata uploaded.
struct Run {
  DeviceMem y, k, v, pos, freq, slot;
  kc::RopeKvWrite rope;
  explicit Run(const Problem& p)
      : y(static_cast<std::size_t>(p.M * p.N()) * 2), k(p.cache_elems() * 2), v(p.cache_elems() * 2),
        pos(p.positions.size() * 4), freq(p.inv_freq.size() * 4), slot(p.slot.size() * 8) {
    CUDA_REQUIRE(cudaMemset(y.p, 0xff, static_cast<std::size_t>(p.M * p.N()) * 2));
    CUDA_REQUIRE(cudaMemset(k.p, 0xff, p.cache_elems() * 2));
    CUDA_REQUIRE(cudaMemset(v.p, 0xff, p.cache_elems() * 2));
    upload(pos, p.positions);
    upload(freq, p.inv_freq);
    upload(slot, p.slot);
    rope = kc::RopeKvWrite{pos.as<const std::int32_t>(), freq.as<const float>(), p.h.nq, p.h.nkv, p.h.hd, p.h.style,
                           k.as<std::uint16_t>(), v.as<std::uint16_t>(), slot.as<const std::int64_t>()};
  }
  /// The two-kernel path's second kernel on this run's output.
  void rope_write_kv(const Problem& p) {
    kc::rope_write_kv(y.as<std::uint16_t>(), rope.positions, rope.inv_freq, p.M, p.h.nq, p.h.nkv, p.h.hd, p.h.style,
                      rope.k_cache, rope.v_cache, rope.slot, nullptr);
  }
};

/// The number of values that differ between two runs (output and caches), bits compared.
std::size_t differences(const Problem& p, const Run& a, const Run& b) {
  std::size_t bad = 0;
  const auto cmp = [&](const DeviceMem& x, const DeviceMem& y, std::size_t n, const char* what) {
    const auto hx = download<std::uint16_t>(x.p, n), hy = download<std::uint16_t>(y.p, n);
    std::size_t here = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (hx[i] != hy[i] && here++ == 0)
        UNSCOPED_INFO(what << "[" << i << "]: two kernels " << hx[i] << ", fused " << hy[i]);
    bad += here;
  };
  cmp(a.y, b.y, static_cast<std::size_t>(p.M * p.N()), "y");
  cmp(a.k, b.k, p.cache_elems(), "k cache");
  cmp(a.v, b.v, p.cache_elems(), "v cache");
  return bad;
}

// Llama-3-8B's heads at small scale and at full size, SmolLM2's hd 64, an interleaved style, a head dim of 16.
const Heads kHeads[] = {{4, 2, 128, 0}, {32, 8, 128, 0}, {9, 3, 64, 0}, {4, 1, 64, 1}, {3, 1, 16, 0}};

}  // namespace

TEST_CASE("cuda::bf16_gemv_rope equals bf16_gemv followed by rope_write_kv, bit for bit", "[cuda][gemm][rope]") {
  std::mt19937 rng(test_seed("cuda::bf16_gemv_rope"));
  kc::set_bf16_gemv_path(kc::Bf16GemvPath::cuda_cores);  // the kernel bf16_gemv_rope extends
  for (const Heads& h : kHeads)
    for (const std::int64_t K : {64, 1000, 4096})
      for (const int M : {1, 3, 8}) {
        INFO("nq " << h.nq << " nkv " << h.nkv << " hd " << h.hd << " style " << h.style << ", M " << M << " K " << K);
        const Problem p(h, M, K, rng);
        const auto w = random_bf16(static_cast<std::size_t>(p.N() * K), rng, 0.05f);
        DeviceMem dw(w.size() * 2), dx(p.x.size() * 2);
        upload(dw, w);
        upload(dx, p.x);
        Run two(p), fused(p);
        kc::bf16_gemv(dw.as<const std::uint16_t>(), dx.as<const std::uint16_t>(), M, p.N(), K, two.y.as<std::uint16_t>(),
                      nullptr);
        two.rope_write_kv(p);
        kc::bf16_gemv_rope(dw.as<const std::uint16_t>(), dx.as<const std::uint16_t>(), M, K, fused.rope,
                           fused.y.as<std::uint16_t>(), nullptr);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        CHECK(differences(p, two, fused) == 0);
      }
  kc::set_bf16_gemv_path(kc::Bf16GemvPath::automatic);
}

TEST_CASE("cuda::fp8_gemv_rope equals fp8_gemv followed by rope_write_kv, bit for bit", "[cuda][fp8][rope]") {
  std::mt19937 rng(test_seed("cuda::fp8_gemv_rope"));
  for (const Heads& h : kHeads)
    for (const std::int64_t K : {64, 1008, 4096})
      for (const int M : {1, 3, 8}) {
        INFO("nq " << h.nq << " nkv " << h.nkv << " hd " << h.hd << " style " << h.style << ", M " << M << " K " << K);
        const Problem p(h, M, K, rng);
        // Codes and scales from the device quantizer (its own test holds it to Fp8::quantize_row bit for bit).
        const auto w = random_bf16(static_cast<std::size_t>(p.N() * K), rng, 0.05f);
        DeviceMem dw(w.size() * 2), dx(p.x.size() * 2), wq(w.size()), ws(static_cast<std::size_t>(p.N()) * 4),
            xq(p.x.size()), xs(static_cast<std::size_t>(M) * 4);
        upload(dw, w);
        upload(dx, p.x);
        kc::quantize_rows_e4m3(dw.as<const std::uint16_t>(), p.N(), K, wq.as<std::uint8_t>(), ws.as<float>(), nullptr);
        kc::quantize_rows_e4m3(dx.as<const std::uint16_t>(), M, K, xq.as<std::uint8_t>(), xs.as<float>(), nullptr);
        Run two(p), fused(p);
        kc::set_fp8_gemv_path(kc::Fp8GemvPath::cuda_cores);  // the kernel fp8_gemv_rope extends
        kc::fp8_gemv(wq.as<const std::uint8_t>(), ws.as<const float>(), xq.as<const std::uint8_t>(), xs.as<const float>(), M,
                     p.N(), K, two.y.as<std::uint16_t>(), nullptr);
        kc::set_fp8_gemv_path(kc::Fp8GemvPath::automatic);
        two.rope_write_kv(p);
        kc::fp8_gemv_rope(wq.as<const std::uint8_t>(), ws.as<const float>(), xq.as<const std::uint8_t>(),
                          xs.as<const float>(), M, K, fused.rope, fused.y.as<std::uint16_t>(), nullptr);
        CUDA_REQUIRE(cudaDeviceSynchronize());
        CHECK(differences(p, two, fused) == 0);
      }
}

TEST_CASE("the fused RoPE GEMVs reject what rope_write_kv and the GEMVs reject", "[cuda][gemm][rope]") {
  DeviceMem w(1 << 16), x(1 << 12), y(1 << 16), meta(1 << 10), cache(1 << 16);
  // Metadata of all-ones bytes: position -1, inv_freq NaN, slot -1 (a padding token: no cache write).
  CUDA_REQUIRE(cudaMemset(meta.p, 0xff, 1 << 10));
  const kc::RopeKvWrite good{meta.as<const std::int32_t>(), meta.as<const float>(256), 2, 1, 64, 0,
                             cache.as<std::uint16_t>(), cache.as<std::uint16_t>(1 << 15), meta.as<const std::int64_t>(512)};
  const auto* wp = w.as<const std::uint16_t>();
  const auto* xp = x.as<const std::uint16_t>();
  auto* yp = y.as<std::uint16_t>();
  CHECK_NOTHROW(kc::bf16_gemv_rope(wp, xp, 1, 64, good, yp, nullptr));
  auto bad = good;
  bad.hd = 63;
  CHECK_THROWS_WITH(kc::bf16_gemv_rope(wp, xp, 1, 64, bad, yp, nullptr), Catch::Contains("head_dim 63"));
  bad = good;
  bad.rope_style = 2;
  CHECK_THROWS_WITH(kc::fp8_gemv_rope(w.as<const std::uint8_t>(), meta.as<const float>(), x.as<const std::uint8_t>(),
                                      meta.as<const float>(), 1, 64, bad, yp, nullptr),
                    Catch::Contains("rope_style 2"));
  bad = good;
  bad.slot = nullptr;
  CHECK_THROWS_WITH(kc::bf16_gemv_rope(wp, xp, 1, 64, bad, yp, nullptr), Catch::Contains("null slot"));
  bad = good;
  bad.v_cache = nullptr;
  CHECK_THROWS_WITH(kc::bf16_gemv_rope(wp, xp, 1, 64, bad, yp, nullptr), Catch::Contains("null v_cache"));
  CHECK_THROWS_AS(kc::bf16_gemv_rope(wp, xp, 9, 64, good, yp, nullptr), InvalidArgument);  // M past kGemvMaxRows
  CHECK_THROWS_AS(kc::bf16_gemv_rope(wp, xp, 1, 60, good, yp, nullptr), InvalidArgument);  // K not a multiple of 8
  CUDA_REQUIRE(cudaDeviceSynchronize());
}
