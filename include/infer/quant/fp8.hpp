#pragma once
/// \file
/// `infer::Fp8`: W8A8 in FP8 E4M3 — weights and activations both e4m3, scaled, multiplied with f32
/// accumulation. This is its CPU implementation: the reference a GPU FP8 GEMM (cuBLASLt, per-row and
/// per-column scales) is checked against.
///
/// Weights: e4m3 values q with one f32 scale s per output row, w ≈ q · s. It loads by role
/// (RoleQuantizer), so an FP8 checkpoint as vLLM and ModelOpt publish it loads as it is: `weight` F8_E4M3
/// [out, in] with `weight_scale` either one value (per-tensor: every row gets it) or [out] / [out, 1]
/// (per-channel). Any other weight is quantized at load, per channel: s = max|w_row| / 448, q = e4m3(w / s).
/// Activations: dynamic, per token: each input row x is scaled by s_x = max|x| / 448 and rounded to e4m3
/// before the product (a checkpoint's static `input_scale` is therefore not needed, and not read).
/// matmul computes y[r][o] = Σ_i (q_x[r][i] · s_x[r]) · (q[o][i] · s[o]) in f32.
/// The LM head is kept out of FP8, weights and activations (quant/kept_head.hpp), unless the checkpoint holds
/// it in FP8.
///
/// On the cuda backend the same arithmetic runs on the device (kernels/cuda/fp8.hpp): the weights' codes and
/// row scales live in the weight arena (a weight that is not FP8 is decoded to f32 on the device and
/// quantized there, bit for bit as the CPU would), each matmul quantizes its bf16 activation rows into the
/// step's workspace (`workspace_bytes`), then runs the FP8 GEMV (up to kGemvMaxRows rows) or cuBLASLt's FP8
/// GEMM with per-row scales. The GPU's activations are bf16 before they are quantized (the CPU's are f32),
/// and the LM head is the decoder's bf16 head, as for every quantizer on the GPU. K must be a multiple of 16.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/linear_request.hpp"
#include "infer/quant/per_row_linear.hpp"
#include "infer/quant/tiled_gemm.hpp"

#if defined(INFER_HAVE_CUDA)
#include "infer/backend/weight_store.hpp"
#include "infer/kernels/cuda/fp8.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#endif

namespace infer {

namespace detail {

/// Left undefined for backends not implemented yet, so `Quantizer<Fp8, cuda>` is false.
template <class B>
struct Fp8Linear;

/// e4m3 codes [out][in] row-major, and one scale per output row (detail::PerRowLinear).
template <>
struct Fp8Linear<cpu> : PerRowLinear<std::uint8_t> {
  /// w[o][i] as the matmul uses it: e4m3(q) · s, in f32.
  [[nodiscard]] float value(std::int64_t o, std::int64_t i) const noexcept {
    if (is_dense()) return dense[static_cast<std::size_t>(o * in_features + i)];
    return e4m3_to_f32(q[static_cast<std::size_t>(o * in_features + i)]) * scale[static_cast<std::size_t>(o)];
  }
};

#if defined(INFER_HAVE_CUDA)
/// e4m3 codes [out][in] and one f32 scale per output row, in the CUDA weight arena (detail::CudaPerRowLinear).
template <>
struct Fp8Linear<cuda> : CudaPerRowLinear<std::uint8_t> {
  /// Where a matmul of `rows` rows puts its activation's scales: after the codes, 16-byte aligned.
  [[nodiscard]] std::size_t scales_offset(std::int64_t rows) const noexcept {
    return (static_cast<std::size_t>(rows * in_features) + 15) / 16 * 16;
  }
  /// Device bytes a matmul of `rows` rows needs (the model's step workspace): the activation's codes and scales.
  [[nodiscard]] std::size_t workspace_bytes(std::int64_t rows) const noexcept {
    return scales_offset(rows) + static_cast<std::size_t>(rows) * sizeof(float);
  }
};
#endif

}  // namespace detail

struct Fp8 {
  static constexpr std::string_view name = "fp8";

  template <class B>
  using linear = detail::Fp8Linear<B>;

  /// One row (or token) to e4m3 with its scale max|v| / 448 (0 for a row of zeros): codes into `q`,
  /// the scale returned. FormatError for a value that is not finite.
  static float quantize_row(std::span<const float> v, std::uint8_t* q) {
    float amax = 0.0f;
    bool finite = true;
    for (float x : v) {
      finite = finite && std::isfinite(x);
      amax = std::max(amax, std::fabs(x));
    }
    require<FormatError>(finite, "Fp8: a value that is not finite cannot be scaled to e4m3");
    const float s = amax / kE4m3Max;
    for (std::size_t i = 0; i < v.size(); ++i) q[i] = s > 0.0f ? f32_to_e4m3(v[i] / s) : 0;
    return s;
  }

  /// Per-channel quantization of an f32 [out][in] matrix (what load does for a weight that is not FP8).
  static linear<cpu> quantize(std::span<const float> w, std::int64_t out, std::int64_t in) {
    require<InvalidArgument>(w.size() == static_cast<std::size_t>(out * in), "Fp8::quantize: ", w.size(),
                             " values for [", out, ", ", in, "]");
    linear<cpu> l;
    l.out_features = out;
    l.in_features = in;
    l.q.resize(w.size());
    l.scale.resize(static_cast<std::size_t>(out));
    for (std::int64_t o = 0; o < out; ++o)
      l.scale[static_cast<std::size_t>(o)] =
          quantize_row(w.subspan(static_cast<std::size_t>(o * in), static_cast<std::size_t>(in)), l.q.data() + o * in);
    return l;
  }

  /// The weight of `r`: kept as it is when the file holds F8_E4M3 with its `weight_scale`, else quantized.
  /// FormatError for a weight or scale of the wrong shape, NotFoundError for FP8 without its scale.
  template <class B>
  static linear<B> load(const LinearRequest& r, cpu = {}) {
    static_assert(std::is_same_v<B, cpu>, "infer::Fp8::load: this overload loads for the cpu backend");
    const WeightTensor t = r.checked_weight();
    const auto n = static_cast<std::size_t>(r.out * r.in);
    if (t.type != DType::fp8_e4m3 && r.lm_head) return detail::KeptHead::keep<linear<B>>(r);
    if (t.type != DType::fp8_e4m3) {
      std::vector<float> w(n);
      dequantize_to_f32(t, w);
      return quantize(w, r.out, r.in);
    }
    linear<B> l;
    l.out_features = r.out;
    l.in_features = r.in;
    l.q.resize(n);
    std::memcpy(l.q.data(), t.data.data(), n);
    l.scale = checkpoint_scales(r);
    return l;
  }

  /// An FP8 checkpoint's `weight_scale` for `r`, one value per output row (a per-tensor scale repeated).
  /// FormatError for a scale of the wrong shape, NotFoundError when it is missing.
  static std::vector<float> checkpoint_scales(const LinearRequest& r) {
    const WeightTensor s = r.require_companion("weight_scale", name);
    const std::uint64_t count = s.elements();
    const bool per_tensor = count == 1 && s.shape.size() <= 2;
    const bool per_channel = (s.shape.size() == 1 || (s.shape.size() == 2 && s.shape[1] == 1)) &&
                             s.shape[0] == static_cast<std::uint64_t>(r.out);
    if (!per_tensor && !per_channel)
      r.wrong_shape(s, detail::cat("one value (per tensor), or [", r.out, "] or [", r.out, ", 1] (per output row)"));
    std::vector<float> scales(static_cast<std::size_t>(count));
    dequantize_to_f32(s, scales);
    return per_channel ? scales : std::vector<float>(static_cast<std::size_t>(r.out), scales[0]);
  }

#if defined(INFER_HAVE_CUDA)
  /// The weight of `r` in the arena: an FP8 checkpoint's codes and scales as they are; any other weight
  /// decoded to f32 on the device and quantized per row there. Errors as the CPU load, and InvalidArgument
  /// for an input width that is not a multiple of 16 (the FP8 kernels' unit).
  template <class B>
  static linear<B> load(const LinearRequest& r, CudaWeightStore& store) {
    return load_stacked<B>(std::span<const LinearRequest>(&r, 1), store);
  }

  /// Several weights of one input stacked into one (q, k, v → qkv; gate, up → gate_up), each loaded as
  /// load() loads it: rows and their scales are independent, so stacking is placing them one after another.
  /// One matmul then quantizes the shared input once and reads every weight in one GEMV or GEMM.
  /// InvalidArgument for weights of different input widths.
  template <class B>
  static linear<B> load_stacked(std::span<const LinearRequest> parts, CudaWeightStore& store) {
    static_assert(std::is_same_v<B, cuda>);
    return linear<B>::template load_stacked<linear<B>>(parts, store, name, load_rows);
  }

  /// r's rows into `q` (codes) and `scale` (one per row); both null in the measuring pass, which still
  /// checks what can be checked without the device.
  static void load_rows(const LinearRequest& r, CudaWeightStore& store, std::uint8_t* q, float* scale) {
    const WeightTensor t = r.checked_weight();
    if (t.type == DType::fp8_e4m3) {
      const std::vector<float> s = checkpoint_scales(r);  // checked even while measuring
      if (q == nullptr) return;
      store.copy_bytes(q, t);
      store.copy_host(scale, s.data(), s.size() * sizeof(float));
      return;
    }
    if (q == nullptr) return;
    float* values = store.f32_scratch(static_cast<std::size_t>(r.out * r.in));
    store.store_f32(values, t);
    kernels::cuda::quantize_rows_e4m3(values, r.out, r.in, q, scale, store.stream_handle());
  }

  /// y[rows][w.out()] (bf16) = e4m3(x)·s_x · (e4m3(w)·s_w)ᵀ: x's rows quantized into ctx's workspace, then
  /// the FP8 GEMV (rows <= kGemvMaxRows) or cuBLASLt's FP8 GEMM.
  static void matmul(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                     std::uint16_t* y) {
    namespace kc = kernels::cuda;
    require<InvalidArgument>(ctx.scratch != nullptr && ctx.scratch_elems * 2 >= w.workspace_bytes(rows),
                             "Fp8 matmul of ", rows, " rows of [", w.out(), ", ", w.in(), "] needs ",
                             w.workspace_bytes(rows), " bytes of workspace; the context has ", ctx.scratch_elems * 2);
    auto* codes = reinterpret_cast<std::uint8_t*>(ctx.scratch);
    auto* scales = reinterpret_cast<float*>(codes + w.scales_offset(rows));
    kc::quantize_rows_e4m3(x, rows, w.in(), codes, scales, ctx.stream);
    if (rows <= kc::kGemvMaxRows && kc::fp8_gemv_supports(w.q, codes, w.in()))
      kc::fp8_gemv(w.q, w.scale, codes, scales, rows, w.out(), w.in(), y, ctx.stream);
    else
      ctx.gemm->run_e4m3(codes, scales, w.q, w.scale, y, rows, w.out(), w.in(), ctx.stream);
  }

#endif

  /// y[rows][w.out()] = e4m3(x)·s_x · (e4m3(w)·s_w)ᵀ, each row of x quantized with its own scale.
  static void matmul(cpu, const linear<cpu>& w, const float* x, std::int32_t rows, float* y) {
    if (w.dense_matmul(w.out(), w.in(), x, rows, y)) return;
    const std::int64_t in = w.in();
    thread_local std::vector<float> xq;
    thread_local std::vector<std::uint8_t> codes;
    const float* lut = e4m3_table().data();
    xq.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(in));
    codes.resize(static_cast<std::size_t>(in));
    for (std::int32_t r = 0; r < rows; ++r) {
      const float s = quantize_row(std::span(x + static_cast<std::size_t>(r) * static_cast<std::size_t>(in),
                                             static_cast<std::size_t>(in)),
                                   codes.data());
      float* dst = xq.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(in);
      for (std::int64_t i = 0; i < in; ++i) dst[i] = lut[codes[static_cast<std::size_t>(i)]] * s;
    }
    // The same values as w.value(o, i), through the table.
    detail::tiled_gemm_xwt(xq.data(), rows, w.out(), in, y, [&](std::int64_t o0, std::int64_t n, float* tile) {
      for (std::int64_t o = 0; o < n; ++o) {
        const std::uint8_t* q = w.q.data() + (o0 + o) * in;
        const float s = w.scale[static_cast<std::size_t>(o0 + o)];
        for (std::int64_t i = 0; i < in; ++i) tile[o * in + i] = lut[q[i]] * s;
      }
    });
  }
};

static_assert(Quantizer<Fp8, cpu>);
static_assert(RoleQuantizer<Fp8, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<Fp8, cuda>);
static_assert(RoleQuantizer<Fp8, cuda>);
#endif

}  // namespace infer
