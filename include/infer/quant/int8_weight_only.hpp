#pragma once
/// \file
/// `infer::Int8WeightOnly`: W8A16 weights, per-channel symmetric INT8 — each output row of a linear layer
/// stored as int8 values q with one f32 scale s, w ≈ q · s. This is its CPU implementation (the reference
/// a GPU kernel is checked against; the activations stay f32 here).
///
/// It loads by role (RoleQuantizer), so a checkpoint that is already INT8 loads as it is: `weight` of
/// dtype I8 [out, in] with `weight_scale` [out] or [out, 1] (f32, f16 or bf16), compressed-tensors'
/// channel-wise "int-quantized" layout, which vLLM loads. Any other weight (f32, f16, bf16, GGUF blocks,
/// dummy) is quantized at build by round-to-nearest: s = max|w_row| / 127 and q = round(w / s), within
/// [-127, 127] (the symmetric range: -q is always representable). A row of zeros has s = 0 and q = 0.
///
/// matmul dequantizes a tile of rows at a time into f32 and multiplies it through the CPU GEMM
/// (quant/tiled_gemm.hpp), so it computes exactly x · (q·s)ᵀ in f32 without ever holding the f32 matrix.
/// The LM head is kept out of INT8 (quant/kept_head.hpp) unless the checkpoint holds it in INT8.
///
/// On the cuda backend (kernels/cuda/int_linear.hpp) the codes and scales live in the weight arena: a
/// checkpoint's as they are, any other weight decoded to f32 on the device and quantized there, bit for
/// bit as quantize() does. matmul runs the INT8 GEMV (bf16 activations, f32 sums) up to kGemvMaxRows rows
/// and, above, dequantizes to bf16 in the step's scratch for the bf16 GEMM. The GPU's LM head is the
/// decoder's bf16 head, as for every quantizer on the GPU. K must be a multiple of 16.

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
#include "infer/kernels/cpu_ops.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/linear_request.hpp"
#include "infer/quant/per_row_linear.hpp"
#include "infer/quant/tiled_gemm.hpp"

#if defined(INFER_HAVE_CUDA)
#include "infer/backend/weight_store.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/int_linear.hpp"
#endif

namespace infer {

namespace detail {

/// The weight as a backend holds it: cpu here, cuda below.
template <class B>
struct Int8Linear;

/// q [out][in] int8 row-major, and one scale per output row (detail::PerRowLinear).
template <>
struct Int8Linear<cpu> : PerRowLinear<std::int8_t> {
  /// w[o][i] as the matmul uses it: q · s, in f32.
  [[nodiscard]] float value(std::int64_t o, std::int64_t i) const noexcept {
    if (is_dense()) return dense[static_cast<std::size_t>(o * in_features + i)];
    return static_cast<float>(q[static_cast<std::size_t>(o * in_features + i)]) * scale[static_cast<std::size_t>(o)];
  }
};

#if defined(INFER_HAVE_CUDA)
/// int8 codes [out][in] and one f32 scale per output row, in the CUDA weight arena (detail::CudaPerRowLinear).
template <>
struct Int8Linear<cuda> : CudaPerRowLinear<std::int8_t> {
  /// bf16 scratch values a matmul above kGemvMaxRows rows needs: the weight dequantized for the GEMM.
  [[nodiscard]] std::size_t scratch_elems() const noexcept {
    return static_cast<std::size_t>(out_features * in_features);
  }
};
#endif

}  // namespace detail

struct Int8WeightOnly {
  static constexpr std::string_view name = "int8-weight-only";

  template <class B>
  using linear = detail::Int8Linear<B>;

  /// Per-channel round-to-nearest of an f32 [out][in] matrix (what load does for a weight that is not INT8).
  static linear<cpu> quantize(std::span<const float> w, std::int64_t out, std::int64_t in) {
    require<InvalidArgument>(w.size() == static_cast<std::size_t>(out * in), "Int8WeightOnly::quantize: ", w.size(),
                             " values for [", out, ", ", in, "]");
    linear<cpu> l;
    l.out_features = out;
    l.in_features = in;
    l.q.resize(w.size());
    l.scale.resize(static_cast<std::size_t>(out));
    for (std::int64_t o = 0; o < out; ++o) {
      const float* row = w.data() + o * in;
      float amax = 0.0f;
      bool finite = true;
      for (std::int64_t i = 0; i < in; ++i) {
        finite = finite && std::isfinite(row[i]);
        amax = std::max(amax, std::fabs(row[i]));
      }
      require<FormatError>(finite, "Int8WeightOnly::quantize: row ", o, " holds a value that is not finite");
      const float s = amax / 127.0f;
      l.scale[static_cast<std::size_t>(o)] = s;
      for (std::int64_t i = 0; i < in; ++i) {
        const float v = s > 0.0f ? std::nearbyint(row[i] / s) : 0.0f;
        l.q[static_cast<std::size_t>(o * in + i)] = static_cast<std::int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
    }
    return l;
  }

  /// The weight of `r`: kept as it is when the file holds INT8 with its `weight_scale`, else quantized.
  /// FormatError for a weight or scale of the wrong shape, NotFoundError for INT8 without its scale.
  template <class B>
  static linear<B> load(const LinearRequest& r, cpu = {}) {
    static_assert(std::is_same_v<B, cpu>, "infer::Int8WeightOnly::load: this overload loads for the cpu backend");
    const WeightTensor t = r.checked_weight();
    const auto n = static_cast<std::size_t>(r.out * r.in);
    if (t.type != DType::int8 && r.lm_head) return detail::KeptHead::keep<linear<B>>(r);
    if (t.type != DType::int8) {
      std::vector<float> w(n);
      dequantize_to_f32(t, w);
      return quantize(w, r.out, r.in);
    }
    linear<B> l;
    l.out_features = r.out;
    l.in_features = r.in;
    l.q.resize(n);
    require<FormatError>(t.data.size() == n, name, ": tensor '", t.name, "' holds ", t.data.size(), " bytes for ", n,
                         " int8 values");
    std::memcpy(l.q.data(), t.data.data(), n);
    l.scale = checkpoint_scales(r);
    return l;
  }

  /// An INT8 checkpoint's `weight_scale` for `r`, one value per output row. FormatError for a scale of the
  /// wrong shape, NotFoundError when it is missing.
  static std::vector<float> checkpoint_scales(const LinearRequest& r) {
    const WeightTensor s = r.require_companion("weight_scale", name);
    const bool column = s.shape.size() == 1 || (s.shape.size() == 2 && s.shape[1] == 1);
    if (!column || s.shape[0] != static_cast<std::uint64_t>(r.out))
      r.wrong_shape(s, detail::cat("[", r.out, "] or [", r.out, ", 1] (one scale per output row)"));
    std::vector<float> scales(static_cast<std::size_t>(r.out));
    dequantize_to_f32(s, scales);
    return scales;
  }

#if defined(INFER_HAVE_CUDA)
  /// The weight of `r` in the arena: an INT8 checkpoint's codes and scales as they are; any other weight
  /// decoded to f32 on the device and quantized per row there. Errors as the CPU load, and InvalidArgument
  /// for an input width that is not a multiple of 16 (the INT8 GEMV's unit).
  template <class B>
  static linear<B> load(const LinearRequest& r, CudaWeightStore& store) {
    return load_stacked<B>(std::span<const LinearRequest>(&r, 1), store);
  }

  /// Several weights of one input stacked into one (q, k, v → qkv; gate, up → gate_up), each loaded as
  /// load() loads it: rows and their scales are independent, so stacking is placing them one after another.
  template <class B>
  static linear<B> load_stacked(std::span<const LinearRequest> parts, CudaWeightStore& store) {
    static_assert(std::is_same_v<B, cuda>);
    return linear<B>::template load_stacked<linear<B>>(parts, store, name, load_rows);
  }

  /// r's rows into `q` and `scale`; both null in the measuring pass, which still checks what can be checked
  /// without the device.
  static void load_rows(const LinearRequest& r, CudaWeightStore& store, std::int8_t* q, float* scale) {
    const WeightTensor t = r.checked_weight();
    if (t.type == DType::int8) {
      const std::vector<float> s = checkpoint_scales(r);  // checked even while measuring
      require<FormatError>(t.data.size() == static_cast<std::size_t>(r.out * r.in), name, ": tensor '", t.name,
                           "' holds ", t.data.size(), " bytes for ", r.out * r.in, " int8 values");
      if (q == nullptr) return;
      store.copy_bytes(q, t);
      store.copy_host(scale, s.data(), s.size() * sizeof(float));
      return;
    }
    if (q == nullptr) return;
    float* values = store.f32_scratch(static_cast<std::size_t>(r.out * r.in));
    store.store_f32(values, t);
    kernels::cuda::quantize_rows_int8(values, r.out, r.in, q, scale, store.stream_handle());
  }

  /// y[rows][w.out()] (bf16) = x · (q·s)ᵀ: the INT8 GEMV up to kGemvMaxRows rows, else the weight
  /// dequantized to bf16 in ctx's scratch and the bf16 GEMM.
  static void matmul(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                     std::uint16_t* y) {
    namespace kc = kernels::cuda;
    if (rows <= kc::kGemvMaxRows && kc::int8_gemv_supports(w.q, x, w.in())) {
      kc::int8_gemv(w.q, w.scale, x, rows, w.out(), w.in(), y, ctx.stream);
      return;
    }
    require<InvalidArgument>(ctx.scratch != nullptr && ctx.scratch_elems >= w.scratch_elems(), "Int8WeightOnly matmul of ",
                             rows, " rows of [", w.out(), ", ", w.in(), "] needs ", w.scratch_elems(),
                             " bf16 values of scratch; the context has ", ctx.scratch_elems);
    kc::dequantize_int8_bf16(w.q, w.scale, w.out(), w.in(), ctx.scratch, ctx.stream);
    ctx.gemm->run(x, ctx.scratch, y, rows, w.out(), w.in(), ctx.stream);
  }
#endif

  /// y[rows][w.out()] = x[rows][w.in()] · (q·s)ᵀ.
  static void matmul(cpu, const linear<cpu>& w, const float* x, std::int32_t rows, float* y) {
    if (w.dense_matmul(w.out(), w.in(), x, rows, y)) return;
    const std::int64_t in = w.in();
    detail::tiled_gemm_xwt(x, rows, w.out(), in, y, [&](std::int64_t o0, std::int64_t n, float* tile) {
      for (std::int64_t o = 0; o < n; ++o) {
        const std::int8_t* q = w.q.data() + (o0 + o) * in;
        const float s = w.scale[static_cast<std::size_t>(o0 + o)];
        for (std::int64_t i = 0; i < in; ++i) tile[o * in + i] = static_cast<float>(q[i]) * s;
      }
    });
  }
};

static_assert(Quantizer<Int8WeightOnly, cpu>);
static_assert(RoleQuantizer<Int8WeightOnly, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<Int8WeightOnly, cuda>);
static_assert(RoleQuantizer<Int8WeightOnly, cuda>);
#endif

}  // namespace infer
