#pragma once
/// \file
/// Linear layers on the GPU: y[M][N] = x[M][K] · W[N][K]ᵀ, W row-major [out][in] as every linear weight
/// is stored (GGUF, safetensors). Three entry points:
///
/// - `Gemm`: bf16 × bf16 through cuBLASLt, bf16 out, or f32 out with `beta` (y = x·Wᵀ + beta·y, so an
///   output projection adds into the f32 residual stream in place). The prefill / large-batch path.
/// - `gguf_gemv`: M = 1..8 rows against GGUF weights kept in their blocks, by int8 dot products. Batch-1
///   decode is bound by reading the weights, which are 2-5× smaller in their blocks than in bf16.
/// - `gguf_gemm`: M > 8: dequantizes W into a caller-given bf16 scratch, then runs the bf16 `Gemm`.
/// - `bf16_gemv`: M = 1..8 rows against bf16 weights, streamed at close to the copy bandwidth.
///
/// Compiled in kernels/cuda/gemm.cu and kernels/cuda/gguf_gemv.cu; this header includes no CUDA header
/// (bf16 values are their `std::uint16_t` bits, streams are `void*` = cudaStream_t, nullptr = legacy
/// default stream). Every call only enqueues work: nothing here synchronizes with the host.

#if defined(INFER_HAVE_CUDA)

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "infer/core/dtype.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/quant/gguf_dot.hpp"

namespace infer::kernels::cuda {

/// How `Gemm` picks a problem's cuBLASLt algorithm.
enum class GemmTuning : std::uint8_t {
  /// cuBLASLt's heuristic's first choice (host work only).
  heuristic,
  /// For M in [kTunedMinRows, kTunedMaxRows], at least kTunedMinFlops and beta = 0: the fastest of the heuristic's first
  /// kTuneCandidates when it beats the heuristic's first by 2% or more, timed with events (two rounds,
  /// each candidate's better one) on the first call's own buffers, once per (power-of-two bucket of M,
  /// N, K, output type, alignments); other M of a bucket reuse its pick when cuBLASLt accepts it for
  /// their shape. Where the heuristic's tile choice is worst — mid-sized M, where a wave of tiles
  /// fills the GPU unevenly — the measured pick is worth its one-time cost (a few ms per bucket, and
  /// one stream synchronization). Never while the stream is being captured into a graph (the
  /// heuristic's choice is kept then); larger and smaller M always take the heuristic's: on the H200
  /// the timed picks won at M = 256..1024 on Llama-3-8B's layers (up to +7% for the LM head) but lost
  /// 5-11% at M = 2048-4096 for gate_up and down, where a pick timed over a few calls at full clock
  /// is not the one that is fastest once a long step holds the GPU at its power cap. Small problems
  /// (a few µs, where timing noise decides) keep the heuristic's deterministic pick.
  measured,
  /// As measured, and M above kTunedMaxRows (problems of at least kSustainedMinFlops) timed too, at the
  /// power cap: after ~40 ms of the heuristic's pick back-to-back, three rounds of ~8 ms per candidate, each
  /// candidate's mean counting. A model's Gemm (measured) runs this way with INFER_GEMM_SUSTAINED_TUNE=1, until
  /// a run shows whether it pays for a prefill (bench/gpu_suite.sh gemm-cap).
  measured_at_cap,
};

/// A cuBLASLt handle, its workspace, and one cached plan per problem: the matmul descriptor, the three
/// matrix layouts and the chosen algorithm (see GemmTuning), keyed by (M, N, K, output type, pointer
/// alignments). The first call of a shape asks the heuristic (and may time candidates); later calls of
/// that shape allocate nothing and make no query, so they are fit for the hot path and for CUDA graph
/// capture.
///
/// Row-major ↔ column-major: cuBLAS is column-major, and a row-major [R][C] matrix is the same bytes as
/// a column-major C×R matrix with leading dimension C. So row-major y[M][N] = x[M][K]·W[N][K]ᵀ is,
/// column-major, yᶜ(N×M, ld N) = Wᶜ(K×N, ld K)ᵀ · xᶜ(K×M, ld K): cuBLAS's A = W with op T, B = x with
/// op N, m = N, n = M, k = K ("TN", the layout Hopper's kernels prefer). No copy or transpose is made.
///
/// Not thread-safe: use one `Gemm` per host thread (or lock). Streams may differ per call, but calls that
/// share a `Gemm` share its workspace, so they must not run concurrently on different streams.
class Gemm {
 public:
  /// 32 MiB is what NVIDIA recommends for Hopper's cuBLASLt kernels.
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

  /// Bounds of the M that GemmTuning::measured times, and how many candidates it times.
  static constexpr std::int64_t kTunedMinRows = 64;
  static constexpr std::int64_t kTunedMaxRows = 1024;
  static constexpr double kTunedMinFlops = 4.0e9;  ///< 2·M·N·K: ~5 µs at the H200's bf16 peak
  static constexpr int kTuneCandidates = 8;
  /// The smallest problem above kTunedMaxRows that INFER_GEMM_SUSTAINED_TUNE times: ~60 µs at ~800 TFLOP/s.
  static constexpr double kSustainedMinFlops = 5.0e10;
  /// Creates the handle and allocates the workspace on the current device. DeviceError on failure.
  explicit Gemm(std::size_t workspace_bytes = kDefaultWorkspaceBytes, GemmTuning tuning = GemmTuning::measured);
  ~Gemm();
  Gemm(Gemm&&) noexcept;
  Gemm& operator=(Gemm&&) noexcept;
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// y[M][N] (bf16) = x[M][K] (bf16) · w[N][K]ᵀ (bf16), accumulated in f32. Device pointers, any
  /// 2-byte alignment (less aligned pointers get slower algorithms). M or N of 0 does nothing;
  /// InvalidArgument for negative sizes, K < 1 or null pointers; DeviceError when cuBLASLt fails.
  void run(const std::uint16_t* x, const std::uint16_t* w, std::uint16_t* y, std::int64_t M, std::int64_t N,
           std::int64_t K, void* stream);

  /// y[M][N] (f32) = x · wᵀ + beta · y. beta = 0 overwrites y (its old contents, even NaN, are ignored);
  /// beta = 1 adds into it (the residual stream).
  /// y's rows are ldy floats apart (0: N), so column blocks of a wider output can be written one by one.
  void run(const std::uint16_t* x, const std::uint16_t* w, float* y, std::int64_t M, std::int64_t N, std::int64_t K,
           float beta, void* stream, std::int64_t ldy = 0);

  /// FP8: y[M][N] (bf16) = s_x[m] · s_w[n] · Σ_k e4m3(x_q[m][k]) · e4m3(w_q[n][k]), accumulated in f32, with
  /// one f32 scale per row of x (s_x, M values) and per row of w (s_w, N values), the codes and scales as
  /// quantize_rows_e4m3 (kernels/cuda/fp8.hpp) writes them. cuBLASLt's FP8 GEMM writes the unscaled sums as
  /// bf16 into y, then one pass scales y in place: cuBLASLt on sm_90 takes no per-row scales (outer-vector
  /// scaling is refused there), so y is rounded to bf16 twice (≤ 2^-9 relative each). K a multiple of 16,
  /// the code arrays 16-byte aligned (InvalidArgument otherwise); always cuBLASLt's heuristic pick (not timed).
  void run_e4m3(const std::uint8_t* x_q, const float* x_scale, const std::uint8_t* w_q, const float* w_scale,
                std::uint16_t* y, std::int64_t M, std::int64_t N, std::int64_t K, void* stream);

  /// The buckets' timed picks (GemmTuning::measured) as text an engine file keeps: per bucket, the key
  /// "bf16 m<bucket> n<N> k<K> <bf16|f32> a<x>/<w>/<y> ldy<ldy>" (operand alignments in bytes, ldy 0 for
  /// dense rows) and the algorithm's bytes in hex; and "cublaslt", the cuBLASLt version that chose them
  /// (an algorithm's bytes mean something only to the version that made them).
  [[nodiscard]] std::map<std::string, std::string> measured_algorithms() const;
  /// Takes picks measured_algorithms() wrote, as this Gemm's own: a bucket they hold is never timed here, and
  /// each shape of it runs their pick where cuBLASLt accepts it for that shape (cublasLtMatmulAlgoCheck),
  /// else the heuristic's. Picks from another cuBLASLt version are ignored (returns 0); buckets already timed
  /// here keep their pick. FormatError naming an entry that does not parse. Returns the buckets taken.
  std::size_t adopt_measured_algorithms(const std::map<std::string, std::string>& picks);
  /// Times the picks for weights of these (N, K) at every power-of-two M that GemmTuning::measured times
  /// (bf16 in and out, dense rows, 256-byte aligned operands: the keys a model's GEMMs have), on buffers of
  /// its own; what infer-build runs before it writes the picks into an engine file. No-op for heuristic.
  void tune(std::span<const std::pair<std::int64_t, std::int64_t>> shapes, void* stream);

  /// Number of cached plans (one per distinct problem seen).
  [[nodiscard]] std::size_t cached_plans() const noexcept;
  /// Buckets whose algorithm was chosen by timing, and how many of those chose another algorithm than
  /// the heuristic's first (for benchmarks and tests).
  [[nodiscard]] std::size_t tuned_buckets() const noexcept;
  [[nodiscard]] std::size_t tuned_overrides() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The largest M `gguf_gemv` accepts; above it the weights are better dequantized once (`gguf_gemm`).
inline constexpr int kGemvMaxRows = 8;

/// y[M][N] = x[M][K] (bf16) · W[N][K]ᵀ with W in GGUF blocks: `w_blocks` holds N rows of K / block_elems
/// blocks each (the tensor exactly as in the file); any type gemv_supports takes. x is quantized to int8 per
/// 32 values inside the kernel and each weight segment meets it in integer dot products (quant/gguf_dot.hpp);
/// one warp per output row (rows strided over a grid sized to the GPU), weight blocks streamed through shared
/// memory with 16-byte asynchronous copies, f32 sums. y is bf16 or f32 (logits), row m at y + m·ldy (ldy 0:
/// N), so stacked weights of different types can write their columns of one output.
/// Requirements: 1 ≤ M ≤ 8, K > 0 a multiple of the block size (and ≤ ~140,000: one row of x's codes must
/// fit in shared memory), ldy ≥ N, x 16-byte aligned, w 2-byte aligned (its f16 fields), y aligned to its
/// element. InvalidArgument otherwise (UnsupportedError for other types); DeviceError if the launch fails.
/// N of 0 does nothing.
void gguf_gemv(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y_bf16, void* stream, std::int64_t ldy = 0);
void gguf_gemv(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
               float* y_f32, void* stream, std::int64_t ldy = 0);
/// SwiGLU fused into the gate/up GEMV on GGUF blocks: w_gate_up is the stacked [2I][K] weight (gate rows
/// 0..I-1, up rows I..2I-1, one type) and y[m][i] = bf16(silu(g) * u) with g = x[m]·gate_i and u = x[m]·up_i
/// as gguf_gemv computes them, silu(g) = g / (1 + e^-g), all in f32: gguf_gemv into [M][2I] followed by
/// `swiglu`, less the rounding of g and u to bf16 and a kernel. Same requirements and errors as gguf_gemv
/// (with N = 2I; y has I columns).
void gguf_gemv_swiglu(DType type, const void* w_gate_up, const std::uint16_t* x_bf16, int M, std::int64_t I,
                      std::int64_t K, std::uint16_t* y_bf16, void* stream);

/// gguf_gemv and gguf_gemv_swiglu with x given as the decoder's pre-norm (ops.hpp's ResidualNorm over M rows of
/// K) instead of bf16 values: the kernel computes x = bf16(r · rsqrt(mean(r²) + eps) · weight), r = residual +
/// delta, in its prologue (the same rounding as add_bf16_rmsnorm; the sum of squares in another order, so x may
/// differ from that kernel's by an ulp where the norm's inverse rounds differently), multiplies it as gguf_gemv
/// does, and writes r to x.residual_out and x to x.normed_out where they are given (for the residual stream and for
/// other projections of the same x). The decode step's norm kernel disappears. residual_out must not be
/// x.residual (InvalidArgument: the CTAs read one while others write the other); every pointer of x 16-byte
/// aligned. Otherwise as gguf_gemv.
void gguf_gemv(DType type, const void* w_blocks, const ResidualNorm& x, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y_bf16, void* stream, std::int64_t ldy = 0);
void gguf_gemv(DType type, const void* w_blocks, const ResidualNorm& x, int M, std::int64_t N, std::int64_t K,
               float* y_f32, void* stream, std::int64_t ldy = 0);
void gguf_gemv_swiglu(DType type, const void* w_gate_up, const ResidualNorm& x, int M, std::int64_t I, std::int64_t K,
                      std::uint16_t* y_bf16, void* stream);
/// Whether the decoder folds the pre-norm of M rows of K into the GGUF GEMV (the ResidualNorm overloads above).
/// Each of the GEMV's CTAs reads the residual and delta twice and the norm's weight once (~12·M·K + 4·K bytes from
/// L2, against 2·M·K for bf16 x), which the ~2 us a norm kernel costs in a graph pays for where M·K is small:
/// by default where M·K ≤ kGemvNormMaxValues, one row of Llama-3-8B's K = 4,096 (SmolLM2's K = 576 up to 7 rows).
/// Measured at batch 1 on an H100 (cf3cfb0, 2026-12-07, bench/results/gpu-2026-12-07): SmolLM2 Q4_1 +8.9%, 8B
/// Q4_K_M +2.8%, 8B Q8_0 +1.7% decode tokens/s against the norm kernel; batches of the 8B (M·K ≥ 8,192) keep
/// the norm kernel until measured. INFER_GGUF_GEMV_NORM=0 never, =1 always (read once; for A/B runs in one build).
inline constexpr std::int64_t kGemvNormMaxValues = 4096;
[[nodiscard]] bool gguf_gemv_fuses_norm(int M, std::int64_t K);

/// The largest M `gguf_mmq` accepts.
inline constexpr int kMmqMaxRows = 64;
/// The rows up to which the decoder multiplies GGUF blocks by `gguf_mmq` (above kGemvMaxRows), dequantize + bf16
/// GEMM above. Measured on the H100 (bench/results/gpu-2026-12-06e/gguf-matmul-paths-a12616a-h100.log, Llama-3-8B's
/// layers): up to 32 rows the MMQ is faster on every layer and type (Q4_K gate_up 164 against 234 µs at 32, 106
/// against 235 at 16); at 48 it loses on Q6_K and Q8_0 (gate_up 299 against 255 µs), at 64 on all (309 against
/// 233 on Q4_K): its per-segment f32 scaling is compute-bound there, and the GEMM's decode is paid once.
inline constexpr int kMmqPreferredRows = 32;

/// y[M][N] = x[M][K] (bf16) · W[N][K]ᵀ with W in GGUF blocks (any type gemv_supports takes), for batched decode:
/// x quantized to int8 per 32 values into `workspace`, each weight block read once and decoded once into int8
/// codes for all M rows, multiplied on the int8 tensor cores (mma.sync m16n8k32), f32 sums scaled per 32-value
/// segment (kernels/cuda/gguf_mmq.cu). y is bf16 or f32 (logits), row m at y + m·ldy (ldy 0: N).
/// Requirements: 1 ≤ M ≤ kMmqMaxRows, K > 0 a multiple of the block size, ldy ≥ N, x and the workspace 16-byte
/// aligned, w 2-byte aligned, y aligned to its element, `workspace_bytes` ≥ gguf_mmq_workspace_bytes(type, N, K,
/// M). InvalidArgument otherwise (UnsupportedError for other types); DeviceError if a launch fails. N of 0
/// does nothing.
void gguf_mmq(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
              std::uint16_t* y_bf16, void* workspace, std::size_t workspace_bytes, void* stream, std::int64_t ldy = 0);
void gguf_mmq(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
              float* y_f32, void* workspace, std::size_t workspace_bytes, void* stream, std::int64_t ldy = 0);
/// Device bytes of workspace gguf_mmq needs for any 1..max_rows rows of this weight on the current GPU (x's
/// codes and scales, and partial sums where K is split); 0 for a type or shape it does not take.
[[nodiscard]] std::size_t gguf_mmq_workspace_bytes(DType type, std::int64_t N, std::int64_t K,
                                                   int max_rows = kMmqMaxRows);
/// bf16 values of scratch `gguf_linear` needs for this weight at any M: the weight dequantized (above
/// kMmqPreferredRows rows), or gguf_mmq's workspace.
[[nodiscard]] std::size_t gguf_scratch_elems(DType type, std::int64_t N, std::int64_t K);

/// y[M][N] (bf16) = x · Wᵀ for any M: dequantizes `w_blocks` (any type `dequantize` takes) into
/// `w_scratch_bf16` (N * K values, device memory the caller owns and may reuse once the stream has
/// passed this call) and runs `gemm`. Meant for M > kGemvMaxRows (prefill), where the bf16 GEMM's
/// tensor cores win over decoding blocks per row.
void gguf_gemm(Gemm& gemm, DType type, const void* w_blocks, const std::uint16_t* x_bf16, std::int64_t M,
               std::int64_t N, std::int64_t K, std::uint16_t* w_scratch_bf16, std::uint16_t* y_bf16, void* stream);

/// `gguf_gemv` for M ≤ kGemvMaxRows, `gguf_mmq` up to kMmqPreferredRows (for a type they take), `gguf_gemm` above.
/// `w_scratch_bf16` holds gguf_scratch_elems(type, N, K) values (it may be null when M ≤ kGemvMaxRows). Row m of
/// y is at y + m·ldy (ldy 0: N) up to kMmqPreferredRows rows; above, ldy must be 0 or N (the GEMM writes rows of N).
void gguf_linear(Gemm& gemm, DType type, const void* w_blocks, const std::uint16_t* x_bf16, std::int64_t M,
                 std::int64_t N, std::int64_t K, std::uint16_t* w_scratch_bf16, std::uint16_t* y_bf16, void* stream,
                 std::int64_t ldy = 0);

/// Logits: y[M][N] (f32) = x · Wᵀ for a bf16 LM head: `bf16_gemv` up to bf16_gemv_preferred_rows() rows (where
/// it takes the operands), cuBLASLt with f32 output above.
void bf16_logits(Gemm& gemm, const std::uint16_t* w, const std::uint16_t* x_bf16, std::int64_t M, std::int64_t N,
                 std::int64_t K, float* y_f32, void* stream);

/// Logits: y[M][N] (f32) = x · Wᵀ for an LM head in GGUF blocks: `gguf_gemv` for M ≤ kGemvMaxRows, `gguf_mmq`
/// up to kMmqPreferredRows where the scratch holds its workspace, else the head dequantized to bf16 a chunk of rows at a time into `w_scratch_bf16` (scratch_elems values, at least K)
/// and multiplied by `gemm` into those columns of y, so the head never needs a bf16 copy of its own.
void gguf_logits(Gemm& gemm, DType type, const void* w_blocks, const std::uint16_t* x_bf16, std::int64_t M,
                 std::int64_t N, std::int64_t K, std::uint16_t* w_scratch_bf16, std::size_t scratch_elems, float* y_f32,
                 void* stream);

/// The rows up to which the decoder prefers the CUDA-core `bf16_gemv` to cuBLASLt for bf16 weights. Measured on the
/// H200 (bench/results/gpu-2026-12-03/kernels.log): at M = 1 the GEMV is 2-13% faster on Llama-3-8B's
/// layers; at M = 8 it is 35-55% slower (each lane re-reads x's chunks, and the f32 sums grow with M).
inline constexpr int kBf16GemvPreferredRows = 1;

/// The rows up to which the decoder prefers `bf16_gemv` to cuBLASLt now: kBf16GemvPreferredRows with the
/// CUDA-core kernel, kGemvMaxRows with the tensor-core one (Bf16GemvPath below), which reads the same bytes at
/// any M <= 8 and keeps the M columns in its mma accumulators.
[[nodiscard]] int bf16_gemv_preferred_rows() noexcept;

/// Whether `bf16_gemv` takes these operands: K a multiple of 8 and w, x 16-byte aligned (its loads).
[[nodiscard]] inline bool bf16_gemv_supports(const void* w, const void* x, std::int64_t K) noexcept {
  return K % 8 == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
}

/// y[M][N] = x[M][K] (bf16) · W[N][K]ᵀ (bf16) for 1 ≤ M ≤ kGemvMaxRows, f32 accumulation, y bf16 or f32
/// (overwritten). The decode path of bf16 weights: bound by reading W once, which this kernel does at a
/// higher fraction of the bandwidth than cuBLASLt's tiles at such M (kernels/cuda/bf16_gemv.cu).
/// InvalidArgument for sizes out of range or operands bf16_gemv_supports refuses; DeviceError if the
/// launch fails. N of 0 does nothing.
void bf16_gemv(const std::uint16_t* w, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y_bf16, void* stream);
void bf16_gemv(const std::uint16_t* w, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K, float* y_f32,
               void* stream);

/// Which kernel bf16_gemv runs, process-wide: `automatic` (the default) takes the environment variable
/// INFER_BF16_GEMV, read once — `cuda_cores`, else the tensor cores (mma.sync, the weights streamed through
/// shared memory; as fast at one row, 6% faster than cuBLASLt at 4 and 8). Returns the previous choice; takes effect at the next call (a captured CUDA graph keeps the
/// kernel it captured). For tests and A/B runs. The fused variants below always run on the CUDA cores.
enum class Bf16GemvPath : int { automatic = 0, cuda_cores = 1, tensor_cores = 2 };
Bf16GemvPath set_bf16_gemv_path(Bf16GemvPath path);

/// Whether the tensor-core GEMVs (bf16_gemv's and fp8_gemv's ring kernels) copy their first weights before
/// waiting for the previous kernel, process-wide: 1 on, 0 off, -1 (the default) from INFER_TC_GEMV_EARLY=1,
/// read once (off otherwise). Returns the previous setting; takes effect at the next launch. For tests and
/// A/B runs until it is measured.
int set_tensor_core_gemv_early_copies(int on);

/// SwiGLU fused into the gate/up GEMV: w_gate_up is the stacked [2I][K] weight (gate rows 0..I-1, up rows
/// I..2I-1) and y[m][i] = bf16(silu(g) * u) with g = x[m]·gate_i, u = x[m]·up_i and silu(g) = g / (1 + e^-g),
/// all in f32: what bf16_gemv into [M][2I] followed by `swiglu` computes, less the rounding of g and u to
/// bf16 and a kernel. Same requirements and errors as bf16_gemv (with N = I).
void bf16_gemv_swiglu(const std::uint16_t* w_gate_up, const std::uint16_t* x_bf16, int M, std::int64_t I,
                      std::int64_t K, std::uint16_t* y_bf16, void* stream);

/// Whether `gguf_gemv` takes this weight type: every type its integer dot product decodes (all the GGUF block
/// types the library reads).
[[nodiscard]] constexpr bool gemv_supports(DType type) noexcept { return quant::dot_supports(type); }

}  // namespace infer::kernels::cuda

#endif
