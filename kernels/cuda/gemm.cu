// bf16 GEMM through cuBLASLt (y = x·Wᵀ, W row-major [N][K]) and the dequantize-then-GEMM path for GGUF
// weights at large M. The row-major ↔ column-major mapping is documented in kernels/cuda/gemm.hpp.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/quant/gguf_dot.hpp"
#include "infer/quant/dequantize.hpp"

namespace infer::kernels::cuda {
namespace {

/// y[m][n] = bf16(y[m][n] · sx[m] · sw[n]) in place; two values per thread where `pairs` (N even, y 4-byte aligned).
__global__ void scale_outer_bf16(std::uint16_t* y, const float* sx, const float* sw, std::int64_t M, std::int64_t N,
                                 bool pairs) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const auto scaled = [&](std::uint16_t v, std::int64_t m, std::int64_t n) {
    const float f = __uint_as_float(static_cast<std::uint32_t>(v) << 16) * sx[m] * sw[n];
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  };
  if (pairs) {
    auto* y2 = reinterpret_cast<std::uint32_t*>(y);
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < M * N / 2; i += stride) {
      const std::int64_t m = 2 * i / N, n = 2 * i % N;
      const std::uint32_t v = y2[i];
      y2[i] = scaled(static_cast<std::uint16_t>(v & 0xffffu), m, n) |
              (static_cast<std::uint32_t>(scaled(static_cast<std::uint16_t>(v >> 16), m, n + 1)) << 16);
    }
    return;
  }
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < M * N; i += stride)
    y[i] = scaled(y[i], i / N, i % N);
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(detail::cat("cuda::Gemm: ", what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(detail::cat("cuda::Gemm: ", what, " failed: ", cublasLtGetStatusName(s), ": ",
                                  cublasLtGetStatusString(s)));
}

/// The largest power of two (≤ 256, cuBLASLt's default assumption) dividing the address.
std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

enum class OutType : std::uint8_t { bf16, f32 };
/// The operands' type: bf16, or e4m3 codes with one f32 scale per row of x and of W (outer-vector scaling).
enum class InType : std::uint8_t { bf16, e4m3 };

struct Key {
  std::int64_t m, n, k;
  OutType out;
  std::uint32_t align_x, align_w, align_y;
  InType in = InType::bf16;
  std::int64_t ldy = 0;  ///< y's row stride in elements (0: n)
  auto tie() const { return std::tie(m, n, k, out, align_x, align_w, align_y, in, ldy); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

/// Everything one problem needs, made once.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // A = W, B = x, C = D = y
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  Plan(Plan&& o) noexcept : desc(o.desc), a(o.a), b(o.b), c(o.c), algo(o.algo) { o.desc = nullptr; o.a = o.b = o.c = nullptr; }
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

std::int64_t bucket_of(std::int64_t m) {
  std::int64_t b = 1;
  while (b < m) b *= 2;
  return b;
}

bool same_algo(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// Two events for timing candidates, destroyed on every path.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    const cudaError_t e = cudaEventCreate(&stop);
    if (e != cudaSuccess) {
      cudaEventDestroy(start);
      check_cuda(e, "cudaEventCreate");
    }
  }
  ~EventPair() {
    cudaEventDestroy(stop);
    cudaEventDestroy(start);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { check_lt(cublasLtMatmulPreferenceCreate(&p), "cublasLtMatmulPreferenceCreate"); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  GemmTuning tuning;
  bool at_cap;  ///< M above kTunedMaxRows timed (Timing::sustained)
  std::map<Key, Plan> plans;
  /// Each bucket's timed pick, keyed as plans are but with M replaced by its power-of-two bucket: every M of
  /// a bucket of one problem family shares it.
  std::map<Key, cublasLtMatmulAlgo_t> measured;
  std::size_t overrides = 0;

  Impl(std::size_t ws, GemmTuning t)
      : workspace_bytes(ws),
        tuning(t),
        at_cap(t == GemmTuning::measured_at_cap || (t == GemmTuning::measured && sustained_tuning_asked())) {
    check_lt(cublasLtCreate(&handle), "cublasLtCreate");
    if (ws > 0) {
      const cudaError_t e = cudaMalloc(&workspace, ws);
      if (e != cudaSuccess) {
        cublasLtDestroy(handle);
        check_cuda(e, "cudaMalloc of the cuBLASLt workspace");
      }
    }
  }
  ~Impl() {
    plans.clear();
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  /// The call's operands, for timing candidates on them (GemmTuning::measured).
  struct Operands {
    const void* x;
    const void* w;
    void* y;
    float beta;
    cudaStream_t stream;
  };

  Plan& plan(const Key& key, const Operands& ops) {
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    Plan p;
    const cudaDataType_t out_type = key.out == OutType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    check_lt(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t), "set TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n), "set TRANSB");
    const cudaDataType_t in_type = key.in == InType::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    // e4m3 operands carry no scales here: cuBLASLt on sm_90 refuses per-row (outer-vector) and 1×128 block
    // scales (CUBLAS_STATUS_INVALID_VALUE from the heuristic, cuBLASLt 13.1 on an H100:
    // bench/probe/fp8_lt_probe.cu), so run_e4m3 applies them after the GEMM.
    // Column-major views (see the header): W is K×N (ld K), x is K×M (ld K), y is N×M (ld N).
    check_lt(cublasLtMatrixLayoutCreate(&p.a, in_type, static_cast<std::uint64_t>(key.k),
                                        static_cast<std::uint64_t>(key.n), key.k),
             "cublasLtMatrixLayoutCreate(W)");
    check_lt(cublasLtMatrixLayoutCreate(&p.b, in_type, static_cast<std::uint64_t>(key.k),
                                        static_cast<std::uint64_t>(key.m), key.k),
             "cublasLtMatrixLayoutCreate(x)");
    check_lt(cublasLtMatrixLayoutCreate(&p.c, out_type, static_cast<std::uint64_t>(key.n),
                                        static_cast<std::uint64_t>(key.m), key.ldy > 0 ? key.ldy : key.n),
             "cublasLtMatrixLayoutCreate(y)");
    Preference pref;
    const std::uint64_t ws = workspace_bytes;
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
             "set MAX_WORKSPACE_BYTES");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_w,
                                                  sizeof key.align_w),
             "set MIN_ALIGNMENT_A_BYTES");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_x,
                                                  sizeof key.align_x),
             "set MIN_ALIGNMENT_B_BYTES");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_y,
                                                  sizeof key.align_y),
             "set MIN_ALIGNMENT_C_BYTES");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_y,
                                                  sizeof key.align_y),
             "set MIN_ALIGNMENT_D_BYTES");
    // Split-K partial sums only in f32 (the compute type): the INPLACE / OUTPUT_TYPE schemes keep them in
    // the output type, and bf16 partials cost ~2^-9 of the partial sums' size — caught by the tests on
    // weights with a nonzero mean (Q4_1's mins), where partial sums are large next to the result.
    const std::uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                  sizeof reduction),
             "set REDUCTION_SCHEME_MASK");
    std::array<cublasLtMatmulHeuristicResult_t, Gemm::kTuneCandidates> results{};
    int found = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref.p, Gemm::kTuneCandidates,
                                            results.data(), &found),
             "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw DeviceError(detail::cat("cuda::Gemm: cuBLASLt has no algorithm for M=", key.m, " N=", key.n, " K=", key.k,
                                    key.in == InType::e4m3 ? " (e4m3 in, per-row scales," : " (bf16 in,",
                                    key.out == OutType::bf16 ? " bf16 out)" : " f32 out)"));
    p.algo = results[0].algo;
    const double flops = 2.0 * static_cast<double>(key.m) * static_cast<double>(key.n) * static_cast<double>(key.k);
    const std::span candidates(results.data(), static_cast<std::size_t>(found));
    if (tuning != GemmTuning::heuristic && key.in == InType::bf16) {
      if (key.m >= Gemm::kTunedMinRows && key.m <= Gemm::kTunedMaxRows && flops >= Gemm::kTunedMinFlops)
        choose_measured(key, p, candidates, ops, Timing::brief);
      else if (key.m > Gemm::kTunedMaxRows && flops >= Gemm::kSustainedMinFlops && at_cap)
        choose_measured(key, p, candidates, ops, Timing::sustained);
    }
    return plans.emplace(key, std::move(p)).first->second;
  }

  /// How choose_measured times the candidates.
  enum class Timing : std::uint8_t {
    /// Two rounds of three calls each, each candidate's better round: a few ms in all, at whatever clock the
    /// GPU is at (mostly its full one). Mid-sized M.
    brief,
    /// At the power cap, where a long prefill holds the GPU: the heuristic's pick first runs back-to-back for
    /// kHeatMs, then three rounds over the candidates, each candidate kWindowMs of back-to-back calls a round,
    /// its mean over the rounds counting. At M ≥ 2048 the brief timing picked algorithms 5-11% slower
    /// in the prefill than the heuristic's (H200, 2026-12-05): its picks are the fastest at full clock.
    sustained,
  };

  /// INFER_GEMM_SUSTAINED_TUNE=1: GemmTuning::measured as measured_at_cap.
  static bool sustained_tuning_asked() {
    const char* e = std::getenv("INFER_GEMM_SUSTAINED_TUNE");
    return e != nullptr && std::string_view(e) == "1";
  }

  /// GemmTuning::measured: the bucket's winner if it has one and cuBLASLt takes it for this shape; else,
  /// when this call may be timed (beta = 0 so repeated runs are harmless, the stream not capturing),
  /// the fastest candidate, which becomes the bucket's winner. Otherwise the heuristic's choice stays.
  void choose_measured(const Key& key, Plan& p, std::span<const cublasLtMatmulHeuristicResult_t> candidates,
                       const Operands& ops, Timing timing) {
    Key bk = key;
    bk.m = bucket_of(key.m);
    if (auto it = measured.find(bk); it != measured.end()) {
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &it->second, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= workspace_bytes)
        p.algo = it->second;
      return;
    }
    if (ops.beta != 0.0f || candidates.size() < 2) return;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check_cuda(cudaStreamIsCapturing(ops.stream, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone) return;
    EventPair ev;
    const float alpha = 1.0f, beta = 0.0f;
    const auto once = [&](const cublasLtMatmulAlgo_t& a) {
      return cublasLtMatmul(handle, p.desc, &alpha, ops.w, p.a, ops.x, p.b, &beta, ops.y, p.c, ops.y, p.c, &a, workspace,
                            workspace_bytes, ops.stream) == CUBLAS_STATUS_SUCCESS;
    };
    // ms per call of `runs` back-to-back calls of a, or infinity when one fails to launch.
    const auto timed = [&](const cublasLtMatmulAlgo_t& a, int runs) {
      check_cuda(cudaEventRecord(ev.start, ops.stream), "cudaEventRecord");
      bool ok = true;
      for (int r = 0; r < runs && ok; ++r) ok = once(a);
      check_cuda(cudaEventRecord(ev.stop, ops.stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(ev.stop), "cudaEventSynchronize");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime");
      return ok ? ms / static_cast<float>(runs) : std::numeric_limits<float>::infinity();
    };
    const auto usable = [&](const cublasLtMatmulHeuristicResult_t& c) {
      return c.state == CUBLAS_STATUS_SUCCESS && c.workspaceSize <= workspace_bytes;
    };
    std::array<float, Gemm::kTuneCandidates> ms_best;
    ms_best.fill(std::numeric_limits<float>::infinity());
    if (timing == Timing::brief) {
      // Two rounds over the candidates, each candidate's best round counts: the GPU's clock drifts with
      // its power draw while it runs back-to-back GEMMs, and one round alone would favour whichever
      // candidate ran while it was cool.
      constexpr int kRounds = 2, kRuns = 3;
      for (int round = 0; round < kRounds; ++round)
        for (std::size_t i = 0; i < candidates.size(); ++i)
          if (usable(candidates[i]) && once(candidates[i].algo))  // warm-up; one that fails to launch is skipped
            ms_best[i] = std::min(ms_best[i], timed(candidates[i].algo, kRuns));
    } else {
      constexpr float kHeatMs = 40.0f, kWindowMs = 8.0f;
      constexpr int kRounds = 3;
      // Each candidate's first launch (which may load its module) outside the windows.
      std::array<bool, Gemm::kTuneCandidates> ok{};
      for (std::size_t i = 0; i < candidates.size(); ++i) ok[i] = usable(candidates[i]) && once(candidates[i].algo);
      if (!ok[0]) return;
      const float one = timed(p.algo, 1);
      const auto runs_for = [&](float ms) { return std::max(3, static_cast<int>(ms / std::max(one, 1e-3f)) + 1); };
      timed(p.algo, runs_for(kHeatMs));
      std::array<float, Gemm::kTuneCandidates> sum{};
      for (int round = 0; round < kRounds; ++round)
        for (std::size_t i = 0; i < candidates.size(); ++i)
          sum[i] += ok[i] ? timed(candidates[i].algo, runs_for(kWindowMs)) : std::numeric_limits<float>::infinity();
      for (std::size_t i = 0; i < candidates.size(); ++i) ms_best[i] = sum[i] / kRounds;
    }
    // The heuristic's first choice stays unless another is clearly faster (timing noise is ~1%).
    constexpr float kMargin = 0.98f;
    const cublasLtMatmulAlgo_t* best = nullptr;
    float best_ms = ms_best[0] * kMargin;
    for (std::size_t i = 0; i < candidates.size(); ++i)
      if (ms_best[i] < best_ms) {
        best_ms = ms_best[i];
        best = &candidates[i].algo;
      }
    if (best == nullptr) {
      measured.emplace(bk, p.algo);  // timed: the heuristic's pick stands for the bucket
      return;
    }
    overrides += same_algo(*best, p.algo) ? 0 : 1;
    p.algo = *best;
    measured.emplace(bk, *best);
  }

  void run(const void* x, const void* w, void* y, OutType out, std::int64_t M, std::int64_t N, std::int64_t K,
           float beta, void* stream, std::int64_t ldy = 0) {
    const char* name = out == OutType::bf16 ? "bf16" : "f32";
    if (M < 0 || N < 0 || K < 1)
      throw InvalidArgument(detail::cat("cuda::Gemm::run(", name, " out): bad shape M=", M, " N=", N, " K=", K,
                                        " (need M, N >= 0 and K >= 1)"));
    if (ldy != 0 && ldy < N)
      throw InvalidArgument(detail::cat("cuda::Gemm::run(", name, " out): row stride ", ldy, " < N=", N));
    if (M == 0 || N == 0) return;
    if (x == nullptr || w == nullptr || y == nullptr)
      throw InvalidArgument(detail::cat("cuda::Gemm::run(", name, " out): null ",
                                        x == nullptr ? "x" : (w == nullptr ? "w" : "y"), " pointer for M=", M, " N=", N,
                                        " K=", K));
    const Key key{M, N, K, out, alignment_of(x), alignment_of(w), alignment_of(y), InType::bf16, ldy == N ? 0 : ldy};
    const Plan& p = plan(key, Operands{x, w, y, beta, static_cast<cudaStream_t>(stream)});
    const float alpha = 1.0f;
    check_lt(cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace,
                            workspace_bytes, static_cast<cudaStream_t>(stream)),
             "cublasLtMatmul");
  }

  void run_e4m3(const std::uint8_t* x, const float* sx, const std::uint8_t* w, const float* sw, std::uint16_t* y,
                std::int64_t M, std::int64_t N, std::int64_t K, void* stream) {
    if (M < 0 || N < 0 || K < 1 || K % 16 != 0)
      throw InvalidArgument(detail::cat("cuda::Gemm::run_e4m3: bad shape M=", M, " N=", N, " K=", K,
                                        " (need M, N >= 0 and K a positive multiple of 16)"));
    if (M == 0 || N == 0) return;
    if (x == nullptr || sx == nullptr || w == nullptr || sw == nullptr || y == nullptr)
      throw InvalidArgument(detail::cat("cuda::Gemm::run_e4m3: null pointer for M=", M, " N=", N, " K=", K));
    if (alignment_of(x) < 16 || alignment_of(w) < 16)
      throw InvalidArgument("cuda::Gemm::run_e4m3: the e4m3 codes must be 16-byte aligned");
    const Key key{M, N, K, OutType::bf16, alignment_of(x), alignment_of(w), alignment_of(y), InType::e4m3};
    auto* s = static_cast<cudaStream_t>(stream);
    const Plan& p = plan(key, Operands{x, w, y, 0.0f, s});
    const float alpha = 1.0f, beta = 0.0f;
    check_lt(cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace,
                            workspace_bytes, s),
             "cublasLtMatmul (e4m3)");
    // The sums of code products, rounded to bf16, then scaled in place: y[m][n] · s_x[m] · s_w[n].
    const bool pairs = N % 2 == 0 && alignment_of(y) >= 4;
    const std::int64_t items = pairs ? M * N / 2 : M * N;
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((items + 255) / 256, 65535 * 4));
    scale_outer_bf16<<<blocks, 256, 0, s>>>(y, sx, sw, M, N, pairs);
    check_cuda(cudaGetLastError(), "scale_outer_bf16 launch");
  }
};

Gemm::Gemm(std::size_t workspace_bytes, GemmTuning tuning) : impl_(std::make_unique<Impl>(workspace_bytes, tuning)) {}
Gemm::~Gemm() = default;
Gemm::Gemm(Gemm&&) noexcept = default;
Gemm& Gemm::operator=(Gemm&&) noexcept = default;

void Gemm::run(const std::uint16_t* x, const std::uint16_t* w, std::uint16_t* y, std::int64_t M, std::int64_t N,
               std::int64_t K, void* stream) {
  impl_->run(x, w, y, OutType::bf16, M, N, K, 0.0f, stream);
}

void Gemm::run(const std::uint16_t* x, const std::uint16_t* w, float* y, std::int64_t M, std::int64_t N,
               std::int64_t K, float beta, void* stream, std::int64_t ldy) {
  impl_->run(x, w, y, OutType::f32, M, N, K, beta, stream, ldy);
}

void Gemm::run_e4m3(const std::uint8_t* x_q, const float* x_scale, const std::uint8_t* w_q, const float* w_scale,
                    std::uint16_t* y, std::int64_t M, std::int64_t N, std::int64_t K, void* stream) {
  impl_->run_e4m3(x_q, x_scale, w_q, w_scale, y, M, N, K, stream);
}

namespace {

constexpr const char* kVersionKey = "cublaslt";

std::string key_text(const Key& k) {
  return detail::cat("bf16 m", k.m, " n", k.n, " k", k.k, k.out == OutType::bf16 ? " bf16" : " f32", " a", k.align_x, "/",
                     k.align_w, "/", k.align_y, " ldy", k.ldy);
}

std::string hex_of(const cublasLtMatmulAlgo_t& a) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* b = reinterpret_cast<const unsigned char*>(&a);
  std::string s;
  for (std::size_t i = 0; i < sizeof a; ++i) {
    s += kDigits[b[i] >> 4];
    s += kDigits[b[i] & 15];
  }
  return s;
}

/// Parses what key_text / hex_of wrote; FormatError naming the entry otherwise.
std::pair<Key, cublasLtMatmulAlgo_t> parse_pick(const std::string& key, const std::string& value) {
  const auto bad = [&](const char* what) {
    return FormatError(detail::cat("cuda::Gemm: GEMM algorithm entry '", key, "' = '", value.substr(0, 24),
                                   value.size() > 24 ? "...'" : "'", ": ", what));
  };
  Key k{};
  long long m = 0, n = 0, kk = 0, ldy = 0;
  unsigned ax = 0, aw = 0, ay = 0;
  char out[8] = {};
  int used = 0;
  if (std::sscanf(key.c_str(), "bf16 m%lld n%lld k%lld %7s a%u/%u/%u ldy%lld%n", &m, &n, &kk, out, &ax, &aw, &ay, &ldy,
                  &used) != 8 ||
      used != static_cast<int>(key.size()))
    throw bad("the key is not 'bf16 m<M> n<N> k<K> <bf16|f32> a<x>/<w>/<y> ldy<ldy>'");
  if (std::string_view(out) != "bf16" && std::string_view(out) != "f32") throw bad("the output type is not bf16 or f32");
  if (m < 1 || n < 1 || kk < 1 || ldy < 0) throw bad("a size is out of range");
  k.m = m;
  k.n = n;
  k.k = kk;
  k.out = std::string_view(out) == "bf16" ? OutType::bf16 : OutType::f32;
  k.align_x = ax;
  k.align_w = aw;
  k.align_y = ay;
  k.ldy = ldy;
  cublasLtMatmulAlgo_t a{};
  if (value.size() != 2 * sizeof a) throw bad(detail::cat("the value is not ", 2 * sizeof a, " hex digits").c_str());
  auto* b = reinterpret_cast<unsigned char*>(&a);
  for (std::size_t i = 0; i < sizeof a; ++i) {
    int byte = 0;
    for (int h = 0; h < 2; ++h) {
      const char c = value[2 * i + static_cast<std::size_t>(h)];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) throw bad("the value is not hex digits");
      byte = byte * 16 + d;
    }
    b[i] = static_cast<unsigned char>(byte);
  }
  return {k, a};
}

}  // namespace

std::map<std::string, std::string> Gemm::measured_algorithms() const {
  std::map<std::string, std::string> picks;
  if (!impl_ || impl_->measured.empty()) return picks;
  picks[kVersionKey] = std::to_string(cublasLtGetVersion());
  for (const auto& [key, algo] : impl_->measured)
    if (key.in == InType::bf16) picks[key_text(key)] = hex_of(algo);
  return picks;
}

std::size_t Gemm::adopt_measured_algorithms(const std::map<std::string, std::string>& picks) {
  if (picks.empty()) return 0;
  const auto version = picks.find(kVersionKey);
  if (version == picks.end())
    throw FormatError("cuda::Gemm: GEMM algorithm picks without the 'cublaslt' version that made them");
  if (version->second != std::to_string(cublasLtGetVersion())) return 0;  // another version's bytes: time anew
  std::vector<std::pair<Key, cublasLtMatmulAlgo_t>> parsed;  // all entries checked before any is taken
  for (const auto& [key, value] : picks)
    if (key != kVersionKey) parsed.push_back(parse_pick(key, value));
  std::size_t taken = 0;
  for (const auto& [key, algo] : parsed) taken += impl_->measured.emplace(key, algo).second ? 1 : 0;
  return taken;
}

void Gemm::tune(std::span<const std::pair<std::int64_t, std::int64_t>> shapes, void* stream) {
  if (impl_->tuning == GemmTuning::heuristic || shapes.empty()) return;
  std::int64_t max_n = 0, max_k = 0, max_nk = 0;
  for (const auto& [n, k] : shapes) {
    if (n < 1 || k < 1) throw InvalidArgument(detail::cat("cuda::Gemm::tune: bad weight shape N=", n, " K=", k));
    max_n = std::max(max_n, n);
    max_k = std::max(max_k, k);
    max_nk = std::max(max_nk, n * k);
  }
  struct Buffer {  // cudaMalloc'd: 256-byte aligned, as the model's buffers and weight arena are
    void* p = nullptr;
    explicit Buffer(std::size_t bytes) { check_cuda(cudaMalloc(&p, bytes), "cudaMalloc (Gemm::tune)"); }
    ~Buffer() { cudaFree(p); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
  };
  const auto rows = kTunedMaxRows;
  Buffer w(static_cast<std::size_t>(max_nk) * 2), x(static_cast<std::size_t>(rows * max_k) * 2),
      y(static_cast<std::size_t>(rows * max_n) * 2);
  auto* s = static_cast<cudaStream_t>(stream);
  // Small finite values (bf16 0x3c3c ≈ 0.0115): the timing does not depend on them.
  check_cuda(cudaMemsetAsync(w.p, 0x3c, static_cast<std::size_t>(max_nk) * 2, s), "cudaMemsetAsync (Gemm::tune)");
  check_cuda(cudaMemsetAsync(x.p, 0x3c, static_cast<std::size_t>(rows * max_k) * 2, s), "cudaMemsetAsync (Gemm::tune)");
  for (const auto& [n, k] : shapes)
    for (std::int64_t m = kTunedMinRows; m <= kTunedMaxRows; m *= 2)
      impl_->run(x.p, w.p, y.p, OutType::bf16, m, n, k, 0.0f, stream);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize (Gemm::tune)");
}

std::size_t Gemm::cached_plans() const noexcept { return impl_ ? impl_->plans.size() : 0; }
std::size_t Gemm::tuned_buckets() const noexcept { return impl_ ? impl_->measured.size() : 0; }
std::size_t Gemm::tuned_overrides() const noexcept { return impl_ ? impl_->overrides : 0; }

void gguf_gemm(Gemm& gemm, DType type, const void* w_blocks, const std::uint16_t* x_bf16, std::int64_t M,
               std::int64_t N, std::int64_t K, std::uint16_t* w_scratch_bf16, std::uint16_t* y_bf16, void* stream) {
  const DTypeInfo ti = info(type);
  if (M < 0 || N < 0 || K < 1 || K % ti.block_elems != 0)
    throw InvalidArgument(detail::cat("cuda::gguf_gemm(", ti.name, "): bad shape M=", M, " N=", N, " K=", K,
                                      " (K must be a positive multiple of the block size ", ti.block_elems, ")"));
  if (M == 0 || N == 0) return;
  if (w_scratch_bf16 == nullptr)
    throw InvalidArgument(detail::cat("cuda::gguf_gemm(", ti.name, "): null bf16 scratch for N=", N, " K=", K));
  dequantize(type, w_blocks, w_scratch_bf16, static_cast<std::size_t>(N) * static_cast<std::size_t>(K), stream);
  gemm.run(x_bf16, w_scratch_bf16, y_bf16, M, N, K, stream);
}

static_assert(quant::kGgufDotMaxRows == kMmqPreferredRows, "the rounding model's integer-dot rows are the decoder's");

std::size_t gguf_scratch_elems(DType type, std::int64_t N, std::int64_t K) {
  const std::size_t dequantized = static_cast<std::size_t>(std::max<std::int64_t>(N, 0) * std::max<std::int64_t>(K, 0));
  return std::max(dequantized, (gguf_mmq_workspace_bytes(type, N, K, kMmqPreferredRows) + 1) / 2);
}

void gguf_linear(Gemm& gemm, DType type, const void* w_blocks, const std::uint16_t* x_bf16, std::int64_t M,
                 std::int64_t N, std::int64_t K, std::uint16_t* w_scratch_bf16, std::uint16_t* y_bf16, void* stream,
                 std::int64_t ldy) {
  if (M >= 1 && M <= kGemvMaxRows && gemv_supports(type)) {
    gguf_gemv(type, w_blocks, x_bf16, static_cast<int>(M), N, K, y_bf16, stream, ldy);
  } else if (M >= 1 && M <= kMmqPreferredRows && gemv_supports(type)) {
    gguf_mmq(type, w_blocks, x_bf16, static_cast<int>(M), N, K, y_bf16, w_scratch_bf16,
             gguf_scratch_elems(type, N, K) * sizeof(std::uint16_t), stream, ldy);
  } else {
    if (ldy != 0 && ldy != N)
      throw InvalidArgument(detail::cat("cuda::gguf_linear(", name(type), "): row stride ", ldy, " at M=", M,
                                        " rows; the GEMM path writes rows of N=", N));
    gguf_gemm(gemm, type, w_blocks, x_bf16, M, N, K, w_scratch_bf16, y_bf16, stream);
  }
}

void bf16_logits(Gemm& gemm, const std::uint16_t* w, const std::uint16_t* x_bf16, std::int64_t M, std::int64_t N,
                 std::int64_t K, float* y_f32, void* stream) {
  if (M >= 1 && M <= bf16_gemv_preferred_rows() && bf16_gemv_supports(w, x_bf16, K))
    bf16_gemv(w, x_bf16, static_cast<int>(M), N, K, y_f32, stream);
  else
    gemm.run(x_bf16, w, y_f32, M, N, K, 0.0f, stream);
}

void gguf_logits(Gemm& gemm, DType type, const void* w_blocks, const std::uint16_t* x_bf16, std::int64_t M,
                 std::int64_t N, std::int64_t K, std::uint16_t* w_scratch_bf16, std::size_t scratch_elems, float* y_f32,
                 void* stream) {
  if (M >= 1 && M <= kGemvMaxRows && gemv_supports(type)) {
    gguf_gemv(type, w_blocks, x_bf16, static_cast<int>(M), N, K, y_f32, stream);
    return;
  }
  if (M >= 1 && M <= kMmqPreferredRows && gemv_supports(type)) {
    const std::size_t need = gguf_mmq_workspace_bytes(type, N, K, static_cast<int>(M));
    if (w_scratch_bf16 != nullptr && need > 0 && need <= scratch_elems * sizeof(std::uint16_t)) {
      gguf_mmq(type, w_blocks, x_bf16, static_cast<int>(M), N, K, y_f32, w_scratch_bf16,
               scratch_elems * sizeof(std::uint16_t), stream);
      return;
    }
  }
  const DTypeInfo ti = info(type);
  if (M < 0 || N < 0 || K < 1 || K % ti.block_elems != 0)
    throw InvalidArgument(detail::cat("cuda::gguf_logits(", ti.name, "): bad shape M=", M, " N=", N, " K=", K));
  if (M == 0 || N == 0) return;
  const auto chunk = static_cast<std::int64_t>(scratch_elems / static_cast<std::size_t>(K));
  if (w_scratch_bf16 == nullptr || chunk < 1)
    throw InvalidArgument(detail::cat("cuda::gguf_logits(", ti.name, "): ", scratch_elems,
                                      " bf16 values of scratch cannot hold one row of K=", K));
  // Rows of blocks are independent: each chunk of rows is dequantized alone and multiplied into its columns.
  const std::size_t row_bytes = *infer::row_bytes(type, static_cast<std::uint64_t>(K));
  for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
    const std::int64_t n = std::min(chunk, N - n0);
    dequantize(type, static_cast<const std::byte*>(w_blocks) + static_cast<std::size_t>(n0) * row_bytes, w_scratch_bf16,
               static_cast<std::size_t>(n) * static_cast<std::size_t>(K), stream);
    gemm.run(x_bf16, w_scratch_bf16, y_f32 + n0, M, n, K, 0.0f, stream, N);
  }
}

}  // namespace infer::kernels::cuda
