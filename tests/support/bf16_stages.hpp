#pragma once
/// \file
/// The CUDA decoder's bf16 rounding, put into the CPU reference decoder through its Quantizer seam, so
/// that the tests can *derive* how far GPU logits may lie from the f32 CPU logits instead of guessing.
///
/// The CUDA decoder (model/llama_cuda.hpp) keeps the residual stream and every accumulation in f32 and
/// rounds to bf16 (8 significant bits, unit roundoff u = 2^-8) at these points of each layer:
///   - the input of every projection (the RMSNorm output, the attention output, the SwiGLU output);
///   - the output of every projection (q, k, v, o, gate, up, down) — and q and k once more after RoPE
///     (rotated in place / into the bf16 cache); v goes into the cache as the projection wrote it;
///   - for GGUF block weights, the weight itself in a GEMM of more than 8 rows (dequantized to bf16 for
///     cuBLASLt); the GEMV of up to 8 rows reads the blocks exactly but quantizes its (bf16) input to int8
///     per 32 values (quant/gguf_dot.hpp): modelled here as that quantization (round) or as an absolute
///     error of each value, uniform in ±0.7·d with d its block's step (perturb: the rms of rounding's
///     ±d/2, times 1.4 as for bf16 below);
///   - the final norm's output, the LM head's input (its output, the logits, is f32).
/// `Bf16Stages` is an F32 Quantizer that applies, at each projection's input and output, as many of
/// these roundings as the GPU applies there (read off the tensor's role and type at load):
///   - Mode::round: rounds to bf16, as the GPU does (one rounding per side: rounding twice is rounding once);
///   - Mode::perturb: Monte Carlo arithmetic (Parker, 1997): each rounding becomes an independent random
///     relative error, uniform in [-u, u]. Rerun R times, the spread of the logits estimates, per logit,
///     the standard deviation σ of the error bf16 rounding causes there, for this model and these inputs.
///     Round-to-nearest's relative error is at most u and rms ~0.42u; uniform in [-u, u] has rms 0.58u,
///     so σ is overestimated by ~1.4x: the bounds built on it err on the safe side.
/// Not reachable from this seam (counted as a small slack in the bounds that use σ, see noise_bound):
/// the embedding rows (bf16 on the GPU unless GgufInPlace keeps them in their blocks; exact for dummy
/// weights) and the Qwen2 bias add (a second rounding of q/k/v). A tied LM head is reachable: the decoder
/// loads it through the Quantizer (llama_weights.hpp).
/// Other GPU differences are f32-level (summation order, fast exp/rsqrt): ~1e-6 relative, far below σ.

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/gguf_dot.hpp"
#include "support/parallel_for.hpp"

namespace infer::test {

struct Bf16Stages {
  static constexpr std::string_view name = "bf16-stages";
  static constexpr double kUnitRoundoff = 0.00390625;  ///< 2^-8: bf16 keeps 8 significant bits
  /// Rows up to which GgufInPlace multiplies blocks by int8 dot products (the GEMV, then the int8 MMA), above
  /// them by a bf16 GEMM.
  static constexpr std::int32_t kIntDotMaxRows = quant::kGgufDotMaxRows;

  enum class Mode { exact, round, perturb };

  /// What matmul does now, per thread. `Scope` sets it for a block and restores the previous state.
  struct State {
    Mode mode = Mode::exact;
    std::uint64_t rng = 0;  ///< advanced once per perturbed pass; the pass hashes it with each value's index
  };
  static State& state() {
    thread_local State s;
    return s;
  }

  class Scope {
   public:
    explicit Scope(Mode mode, std::uint64_t seed = 0) : saved_(state()) {
      state().mode = mode;
      state().rng = seed;
    }
    ~Scope() { state() = saved_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    State saved_;
  };

  /// An f32 weight and the bf16 roundings the GPU applies around its GEMM.
  struct Linear {
    F32::linear<cpu> w;
    int out_roundings = 1;        ///< 0 for the LM head (f32 logits), 2 for q and k (again after RoPE)
    bool weight_rounded = false;  ///< GGUF blocks: dequantized to bf16 for GEMMs of more than 8 rows
    bool gemv_reads_blocks = false;

    [[nodiscard]] std::int64_t out() const noexcept { return w.out(); }
    [[nodiscard]] std::int64_t in() const noexcept { return w.in(); }
  };

  template <class B>
  using linear = Linear;

  template <class B>
  static Linear load(const WeightTensor& t, cpu = {}) {
    Linear l{F32::load<cpu>(t)};
    const std::string_view n = t.name;
    const auto ends = [&](std::string_view s) { return n.size() >= s.size() && n.substr(n.size() - s.size()) == s; };
    // The LM head: untied ("output"), or tied (the embedding's tensor, loaded a second time as the head
    // because Bf16Stages cannot serve embedding rows). Its logits are f32; GgufInPlace keeps it in its
    // blocks like any other linear (bf16 when the file has it so).
    const bool head = ends("output.weight") || ends("lm_head.weight") || ends("token_embd.weight") ||
                      ends("embed_tokens.weight");
    if (head) l.out_roundings = 0;
    else if (ends("attn_q.weight") || ends("q_proj.weight") || ends("attn_k.weight") || ends("k_proj.weight"))
      l.out_roundings = 2;
    const bool exact_bf16 = t.dummy.has_value() || t.type == DType::bf16;
    l.weight_rounded = !exact_bf16;
    // GgufInPlace's GEMV and int8 MMA (kernels/cuda/gguf_gemv.cu, gguf_mmq.cu) read every GGUF block type
    // exactly, with int8 inputs.
    l.gemv_reads_blocks = !t.dummy.has_value() && quant::dot_supports(t.type);
    return l;
  }

  /// y = x · wᵀ with the GPU's roundings around it (none in Mode::exact: F32's matmul).
  static void matmul(cpu, const Linear& l, const float* x, std::int32_t rows, float* y) {
    if (state().mode == Mode::exact) {
      F32::matmul(cpu{}, l.w, x, rows, y);
      return;
    }
    const auto in_n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(l.in());
    const auto out_n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(l.out());
    thread_local std::vector<float> xr;
    xr.assign(x, x + in_n);
    // The weight's rounding perturbs each product w·x by a relative error, as rounding x does: modelled
    // as one more rounding of x (same variance of the sum; round mode keeps the weights exact).
    const bool gemv = l.gemv_reads_blocks && rows <= kIntDotMaxRows;
    const bool weight = l.weight_rounded && !gemv;
    apply(xr, 1 + (weight ? 1 : 0));
    if (gemv) quantize_int8(xr);
    kernels::cpu::gemm_xwt(xr.data(), l.w.data(), y, rows, l.out(), l.in());
    apply(std::span(y, out_n), l.out_roundings);
  }

 private:
  /// The GEMV's int8 input (gguf_gemv.cu): Mode::round quantizes each 32 values as the GPU does (the same
  /// function); Mode::perturb adds to each value an error uniform in ±0.7·d, d = max|x| / 127 of its block.
  static void quantize_int8(std::span<float> v) {
    const std::size_t blocks = v.size() / quant::kQ8Block;  // rows are whole blocks: K % 32 == 0
    if (state().mode == Mode::round) {
      for (std::size_t b = 0; b < blocks; ++b) {
        float* x = v.data() + b * quant::kQ8Block;
        std::int8_t q[quant::kQ8Block];
        const quant::Q8Scale s = quant::quantize_q8_block(x, q);
        for (int i = 0; i < quant::kQ8Block; ++i) x[i] = s.d * static_cast<float>(q[i]);
      }
      return;
    }
    const std::uint64_t stream = mix(state().rng += kGolden);
    for (std::size_t b = 0; b < blocks; ++b) {
      float* x = v.data() + b * quant::kQ8Block;
      float amax = 0.0f;
      for (int i = 0; i < quant::kQ8Block; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;
      for (int i = 0; i < quant::kQ8Block; i += 4) {
        std::uint64_t h = mix(stream + (b * quant::kQ8Block + static_cast<std::size_t>(i) + 1) * kGolden);
        for (int k = 0; k < 4; ++k, h >>= 16) x[i + k] += 0.7f * d * uniform_pm1(static_cast<std::uint16_t>(h));
      }
    }
  }

  /// Mode::round rounds every value to bf16; Mode::perturb multiplies value i by Π_k (1 + u·e_ik), e_ik
  /// uniform in [-1, 1), drawn from a counter-based generator: the call's stream (one draw of the thread's
  /// state) hashed with i's group of values. So the values do not depend on how the pass is split over
  /// threads, and a seed reproduces a run. Spread over the WorkerPool: on the GPU machine this pass, single-threaded, cost more
  /// than the reference's (threaded) GEMMs.
  static void apply(std::span<float> v, int roundings) {
    if (roundings == 0) return;
    constexpr std::size_t kChunk = std::size_t{1} << 14;
    if (state().mode == Mode::round) {
      parallel_for(v.size(), kChunk, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
      });
      return;
    }
    // One 64-bit hash gives four 16-bit uniforms: four values' worth with one rounding, two with two (at
    // most two are applied at one point). 2^-15·u steps are far finer than anything σ resolves.
    const std::size_t per_hash = 4 / static_cast<std::size_t>(roundings);
    const std::uint64_t stream = mix(state().rng += kGolden);
    parallel_for(v.size(), kChunk, [&](std::size_t b, std::size_t e) {  // kChunk: a multiple of both
      for (std::size_t g = b / per_hash; g * per_hash < e; ++g) {
        std::uint64_t h = mix(stream + (g + 1) * kGolden);
        for (std::size_t i = g * per_hash; i < std::min(e, (g + 1) * per_hash); ++i) {
          float scale = 1.0f;
          for (int k = 0; k < roundings; ++k, h >>= 16) scale *= 1.0f + kU * uniform_pm1(static_cast<std::uint16_t>(h));
          v[i] *= scale;
        }
      }
    });
  }

  static constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  static constexpr float kU = static_cast<float>(kUnitRoundoff);

  /// splitmix64's finalizer: a well-mixed 64-bit hash of a counter.
  static constexpr std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1) from 16 random bits.
  static constexpr float uniform_pm1(std::uint16_t bits) noexcept {
    return static_cast<float>(static_cast<std::int16_t>(bits)) * 0x1p-15f;
  }
};

static_assert(Quantizer<Bf16Stages, cpu>);

}  // namespace infer::test
