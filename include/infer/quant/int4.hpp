#pragma once
/// \file
/// `infer::Int4`: 4-bit weights in groups along the input dimension (W4A16), asymmetric:
/// w[o][i] = s[o][g] · (q[o][i] − z[o][g]) with q in 0..15, z a float (an integer in 0..15 but for GGUF Q4_1)
/// and g the group of input i. This is its CPU
/// implementation (codes kept one per byte): the reference a GPU kernel is checked against.
///
/// It loads by role (RoleQuantizer). The two checkpoint layouts vLLM serves load as they are, told apart by
/// the shape of `qweight` (int32 words of eight 4-bit codes):
///   - GPTQ (AutoGPTQ, checkpoint format v1): `qweight` [in/8, out], code of input i in word i/8 at bits
///     4·(i%8); `qzeros` [groups, out/8] holding z − 1 (v1's convention); `scales` [groups, out]; `g_idx` [in]
///     (the group of each input; with act-order it is not i / group_size) when present;
///   - AWQ (GEMM layout): `qweight` [in, out/8], output column 8c + kAwqOrder[k] in nibble k of word c;
///     `qzeros` [groups, out/8] packed the same way, holding z; `scales` [groups, out].
/// GGUF Q4_0 and Q4_1 weights load as they are too (from_gguf_q4: groups of 32, the blocks' own scales).
/// Any other weight is quantized at load by round-to-nearest per group of kGroupSize inputs (or the largest
/// power of two below it that divides the input width): over the group's range widened to hold 0 (so 0 is
/// exact, as AWQ and GPTQ make it), s = (max − min) / 15, z = round(−min / s), q = clamp(round(w / s) + z,
/// 0, 15): every value within s / 2. A group of zeros has s = 0.
/// matmul decodes tiles of rows to f32 (quant/tiled_gemm.hpp): exactly x · (s·(q − z))ᵀ in f32.
/// The LM head is kept out of INT4 (quant/kept_head.hpp) unless the checkpoint packed it.
///
/// On the cuda backend (kernels/cuda/int_linear.hpp) the codes are packed eight to a word in the weight
/// arena, with a (bf16 s, bf16 −s·z) pair per group: each weight decodes to bf16(q·s + m), the precision
/// of a bf16 weight, not the f32 value above. A checkpoint's weight (GPTQ, AWQ, GGUF Q4_0/Q4_1) is
/// decoded by the CPU load above and packed; any other weight is decoded to f32 on the device and quantized
/// there, bit for bit as quantize() does. Groups are consecutive inputs, a multiple of 32 long: a GPTQ
/// checkpoint with act-order (a g_idx that reorders inputs) is refused on the GPU. Weights stacked into one
/// (qkv, gate_up) share the smallest of their group sizes (a coarser part's pairs repeated). matmul runs
/// the INT4 GEMV up to kGemvMaxRows rows and, above, dequantizes to bf16 in the step's scratch for the bf16
/// GEMM. The GPU's LM head is the decoder's bf16 head, as for every quantizer on the GPU.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/gguf_blocks.hpp"
#include "infer/quant/kept_head.hpp"
#include "infer/quant/linear_request.hpp"
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
struct Int4Linear;

template <>
struct Int4Linear<cpu> : KeptHead {
  std::vector<std::uint8_t> q;       ///< [out][in], 0..15
  std::vector<float> scale, zero;    ///< [out][groups]
  std::vector<std::int32_t> g_idx;   ///< [in] group of each input; empty: input i is in group i / group_size
  std::int64_t out_features = 0, in_features = 0, group_size = 0, groups = 0;

  [[nodiscard]] std::int64_t out() const noexcept { return out_features; }
  [[nodiscard]] std::int64_t in() const noexcept { return in_features; }
  [[nodiscard]] std::int64_t group_of(std::int64_t i) const noexcept {
    return g_idx.empty() ? i / group_size : g_idx[static_cast<std::size_t>(i)];
  }
  /// w[o][i] as the matmul uses it: s · (q − z), in f32.
  [[nodiscard]] float value(std::int64_t o, std::int64_t i) const noexcept {
    if (is_dense()) return dense[static_cast<std::size_t>(o * in_features + i)];
    const auto k = static_cast<std::size_t>(o * groups + group_of(i));
    return scale[k] * (static_cast<float>(q[static_cast<std::size_t>(o * in_features + i)]) - zero[k]);
  }
  /// Its arrays and sizes as they are in memory, for the engine file (io/engine_file.hpp), and whether
  /// they agree with each other (a file's parts are checked before anything indexes them).
  template <class Self, class V>
  static void visit_parts(Self& self, V&& v) {
    v("q", self.q);
    v("scale", self.scale);
    v("zero", self.zero);
    v("g_idx", self.g_idx);
    v("dense", self.dense);
    v("out", self.out_features);
    v("in", self.in_features);
    v("group_size", self.group_size);
    v("groups", self.groups);
  }
  [[nodiscard]] bool consistent() const noexcept {
    if (is_dense())
      return dense_consistent(out_features, in_features,
                              q.empty() && scale.empty() && zero.empty() && g_idx.empty() && group_size == 0 && groups == 0);
    if (out_features <= 0 || in_features <= 0 || group_size <= 0 || groups <= 0) return false;
    if (q.size() != static_cast<std::size_t>(out_features * in_features)) return false;
    if (scale.size() != static_cast<std::size_t>(out_features * groups) || zero.size() != scale.size()) return false;
    if (g_idx.empty()) return groups == (in_features + group_size - 1) / group_size;
    if (g_idx.size() != static_cast<std::size_t>(in_features)) return false;
    for (const std::int32_t g : g_idx)
      if (g < 0 || g >= groups) return false;
    return true;
  }
};

#if defined(INFER_HAVE_CUDA)
/// Codes [out][in / 8] words (kernels::cuda::int4_nibble's order) and (bf16 s, bf16 m) pairs [out][in /
/// group_size] (kernels::cuda::int4_scale_min_bits), in the CUDA weight arena.
template <>
struct Int4Linear<cuda> {
  const std::uint8_t* codes = nullptr;
  const std::uint32_t* scale_min = nullptr;
  std::int64_t out_features = 0, in_features = 0, group_size = 0;

  [[nodiscard]] std::int64_t out() const noexcept { return out_features; }
  [[nodiscard]] std::int64_t in() const noexcept { return in_features; }
  [[nodiscard]] std::int64_t groups() const noexcept { return group_size > 0 ? in_features / group_size : 0; }
  /// Whether its arrays are there and its shape is one the kernels take.
  [[nodiscard]] bool consistent() const noexcept {
    return codes != nullptr && scale_min != nullptr && out_features > 0 &&
           kernels::cuda::int4_shape_supported(in_features, group_size);
  }
  /// Its sizes and its place in the weight arena, for an engine file (io/engine_file.hpp's arena visitors).
  template <class Self, class V>
  static void visit_arena(Self& self, const V& v) {
    v.scalar("out", self.out_features);
    v.scalar("in", self.in_features);
    v.scalar("group_size", self.group_size);
    const auto out = static_cast<std::size_t>(std::max<std::int64_t>(self.out_features, 0));
    v.pointer("codes", self.codes, out * static_cast<std::size_t>(std::max<std::int64_t>(self.in_features, 0)) / 2);
    v.pointer("scale_min", self.scale_min,
              out * static_cast<std::size_t>(std::max<std::int64_t>(self.groups(), 0)) * sizeof(std::uint32_t));
  }
  /// bf16 scratch values a matmul above kGemvMaxRows rows needs: the weight dequantized for the GEMM.
  [[nodiscard]] std::size_t scratch_elems() const noexcept {
    return static_cast<std::size_t>(out_features * in_features);
  }
};
#endif

}  // namespace detail

struct Int4 {
  static constexpr std::string_view name = "int4";
  static constexpr std::int64_t kGroupSize = 128;
  /// AWQ's order of output columns within a packed word: nibble k holds column kAwqOrder[k] of its eight.
  static constexpr std::array<int, 8> kAwqOrder{0, 2, 4, 6, 1, 3, 5, 7};

  template <class B>
  using linear = detail::Int4Linear<B>;

  /// The group size quantize() uses for `in` inputs: kGroupSize, or the largest power of two below it
  /// that divides `in` (1 at worst).
  static constexpr std::int64_t group_size_for(std::int64_t in) {
    std::int64_t g = kGroupSize;
    while (g > 1 && in % g != 0) g /= 2;
    return g;
  }

  /// Round-to-nearest per group of `group` inputs of an f32 [out][in] matrix (what load does for a weight
  /// that is not INT4): every value within half a step (s / 2) of the original.
  static linear<cpu> quantize(std::span<const float> w, std::int64_t out, std::int64_t in, std::int64_t group) {
    require<InvalidArgument>(w.size() == static_cast<std::size_t>(out * in) && group > 0 && in % group == 0,
                             "Int4::quantize: ", w.size(), " values for [", out, ", ", in, "] in groups of ", group);
    linear<cpu> l;
    l.out_features = out;
    l.in_features = in;
    l.group_size = group;
    l.groups = in / group;
    l.q.resize(w.size());
    l.scale.resize(static_cast<std::size_t>(out * l.groups));
    l.zero.resize(l.scale.size());
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t g = 0; g < l.groups; ++g) {
        const float* v = w.data() + o * in + g * group;
        float lo = 0.0f, hi = 0.0f;  // the range always holds 0, so zero is exact (as AWQ and GPTQ make it)
        for (std::int64_t i = 0; i < group; ++i) {
          require<FormatError>(std::isfinite(v[i]), "Int4::quantize: row ", o, " holds a value that is not finite");
          lo = std::min(lo, v[i]);
          hi = std::max(hi, v[i]);
        }
        const float s = (hi - lo) / 15.0f;
        const float z = s > 0.0f ? std::clamp(std::nearbyint(-lo / s), 0.0f, 15.0f) : 0.0f;
        const auto k = static_cast<std::size_t>(o * l.groups + g);
        l.scale[k] = s;
        l.zero[k] = z;
        for (std::int64_t i = 0; i < group; ++i)
          l.q[static_cast<std::size_t>(o * in + g * group + i)] =
              static_cast<std::uint8_t>(s > 0.0f ? std::clamp(std::nearbyint(v[i] / s) + z, 0.0f, 15.0f) : 0.0f);
      }
    return l;
  }

  /// GGUF Q4_0 / Q4_1 blocks as they are: already 4-bit in groups of 32 along the input, so group 32 with
  /// the block's own scale. Q4_0's d·(q − 8) is s = d, z = 8 exactly; Q4_1's d·q + m is s = d, z = −m/d (a
  /// float zero; equal to the block's value up to one f32 rounding), and a block with d = 0 holds m everywhere
  /// (codes 0, s = m, z = −1). FormatError when the bytes do not hold [out, in] of such blocks.
  static linear<cpu> from_gguf_q4(const WeightTensor& t, std::int64_t out, std::int64_t in) {
    constexpr std::int64_t kBlock = 32;
    const bool q4_1 = t.type == DType::q4_1;
    const std::size_t block_bytes = q4_1 ? sizeof(quant::BlockQ4_1) : sizeof(quant::BlockQ4_0);
    const std::int64_t blocks = in / kBlock;
    require<FormatError>(in % kBlock == 0 && t.data.size() == static_cast<std::size_t>(out * blocks) * block_bytes,
                         name, ": tensor '", t.name, "' (", q4_1 ? "q4_1" : "q4_0", ") holds ", t.data.size(),
                         " bytes, not [", out, ", ", in, "] in blocks of 32");
    linear<cpu> l;
    l.out_features = out;
    l.in_features = in;
    l.group_size = kBlock;
    l.groups = blocks;
    l.q.resize(static_cast<std::size_t>(out * in));
    l.scale.resize(static_cast<std::size_t>(out * blocks));
    l.zero.resize(l.scale.size());
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::byte* src = t.data.data() + static_cast<std::size_t>(o * blocks + b) * block_bytes;
        std::uint16_t d16 = 0, m16 = 0;
        std::memcpy(&d16, src, 2);
        if (q4_1) std::memcpy(&m16, src + 2, 2);
        const auto* qs = reinterpret_cast<const std::uint8_t*>(src + (q4_1 ? 4 : 2));
        const float d = f16_to_f32(d16), m = f16_to_f32(m16);
        const auto k = static_cast<std::size_t>(o * blocks + b);
        std::uint8_t* q = l.q.data() + o * in + b * kBlock;
        for (int j = 0; j < 16; ++j) {  // byte j: value j (low nibble) and value j + 16 (high nibble)
          q[j] = static_cast<std::uint8_t>(qs[j] & 0x0f);
          q[j + 16] = static_cast<std::uint8_t>(qs[j] >> 4);
        }
        if (!q4_1) {
          l.scale[k] = d;
          l.zero[k] = 8.0f;
        } else if (d != 0.0f) {
          l.scale[k] = d;
          l.zero[k] = -m / d;
        } else {
          std::fill(q, q + kBlock, std::uint8_t{0});
          l.scale[k] = m;
          l.zero[k] = -1.0f;
        }
      }
    return l;
  }

  /// The weight of `r`: a GPTQ or AWQ checkpoint's `qweight`, `qzeros`, `scales` (and `g_idx`) as they are,
  /// else its weight quantized at load. FormatError for a packed tensor of the wrong shape, NotFoundError
  /// for `qweight` without its companions.
  template <class B>
  static linear<B> load(const LinearRequest& r, cpu = {}) {
    static_assert(std::is_same_v<B, cpu>, "infer::Int4::load: this overload loads for the cpu backend");
    const auto packed = r.companion("qweight");
    if (!packed && r.lm_head) return detail::KeptHead::keep<linear<B>>(r);
    if (!packed) {
      const WeightTensor t = r.checked_weight();
      if (!t.dummy && (t.type == DType::q4_0 || t.type == DType::q4_1)) return from_gguf_q4(t, r.out, r.in);
      std::vector<float> w(static_cast<std::size_t>(r.out * r.in));
      dequantize_to_f32(t, w);
      return quantize(w, r.out, r.in, group_size_for(r.in));
    }
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    const WeightTensor& qw = *packed;
    const bool gptq = qw.shape.size() == 2 && r.in % 8 == 0 && qw.shape[0] == u(r.in / 8) && qw.shape[1] == u(r.out);
    const bool awq = qw.shape.size() == 2 && r.out % 8 == 0 && qw.shape[0] == u(r.in) && qw.shape[1] == u(r.out / 8);
    if (qw.type != DType::int32 || (!gptq && !awq))
      r.wrong_shape(qw, detail::cat("int32 [", r.in / 8, ", ", r.out, "] (GPTQ) or [", r.in, ", ", r.out / 8,
                                    "] (AWQ): 4-bit codes, eight to a word"));
    // quantization_config, when the checkpoint has one, names the packing and the group size: both checked.
    const auto& qc = r.source.config().quantization;
    if (qc && (qc->method == "gptq" || qc->method == "awq") && (qc->method == "gptq") != gptq)
      r.wrong_shape(qw, detail::cat("the ", qc->method, " packing its quantization_config names (",
                                    qc->method == "gptq" ? detail::cat("[", r.in / 8, ", ", r.out, "]")
                                                         : detail::cat("[", r.in, ", ", r.out / 8, "]"), ")"));
    const WeightTensor scales = r.require_companion("scales", name);
    const WeightTensor qzeros = r.require_companion("qzeros", name);
    if (qc && qc->group_size > 0 && scales.shape.size() == 2 &&
        scales.shape[0] * static_cast<std::uint64_t>(qc->group_size) != u(r.in))
      r.wrong_shape(scales, detail::cat("[", r.in / qc->group_size, ", ", r.out, "]: group_size ", qc->group_size,
                                        " from quantization_config"));
    if (scales.shape.size() != 2 || scales.shape[1] != u(r.out) || scales.shape[0] == 0 || r.in % static_cast<std::int64_t>(scales.shape[0]) != 0)
      r.wrong_shape(scales, detail::cat("[groups, ", r.out, "] with groups dividing ", r.in));
    linear<B> l;
    l.out_features = r.out;
    l.in_features = r.in;
    l.groups = static_cast<std::int64_t>(scales.shape[0]);
    l.group_size = r.in / l.groups;
    if (qzeros.type != DType::int32 || qzeros.shape.size() != 2 || qzeros.shape[0] != u(l.groups) || r.out % 8 != 0 ||
        qzeros.shape[1] != u(r.out / 8))
      r.wrong_shape(qzeros, detail::cat("int32 [", l.groups, ", ", r.out / 8, "]"));
    const auto word = [](const WeightTensor& t, std::size_t k) {
      std::int32_t v;
      std::memcpy(&v, t.data.data() + k * 4, 4);
      return static_cast<std::uint32_t>(v);
    };
    // Codes: GPTQ packs along the input (word [i/8][o]), AWQ along the output (word [i][o/8], AWQ order).
    l.q.resize(static_cast<std::size_t>(r.out * r.in));
    for (std::int64_t i = 0; i < r.in; ++i)
      for (std::int64_t o = 0; o < r.out; ++o) {
        const std::uint32_t bits =
            gptq ? word(qw, static_cast<std::size_t>((i / 8) * r.out + o)) >> (4 * (i % 8))
                 : word(qw, static_cast<std::size_t>(i * (r.out / 8) + o / 8)) >> (4 * awq_nibble(o % 8));
        l.q[static_cast<std::size_t>(o * r.in + i)] = static_cast<std::uint8_t>(bits & 15u);
      }
    // Scales [groups][out] and zeros (GPTQ v1 stores z − 1) into [out][groups].
    std::vector<float> s(static_cast<std::size_t>(l.groups * r.out));
    dequantize_to_f32(scales, s);
    l.scale.resize(s.size());
    l.zero.resize(s.size());
    for (std::int64_t g = 0; g < l.groups; ++g)
      for (std::int64_t o = 0; o < r.out; ++o) {
        const std::uint32_t w = word(qzeros, static_cast<std::size_t>(g * (r.out / 8) + o / 8));
        const std::uint32_t z = (w >> (4 * (gptq ? o % 8 : awq_nibble(o % 8)))) & 15u;
        const auto k = static_cast<std::size_t>(o * l.groups + g);
        l.scale[k] = s[static_cast<std::size_t>(g * r.out + o)];
        l.zero[k] = static_cast<float>(z) + (gptq ? 1.0f : 0.0f);
      }
    if (const auto g_idx = r.companion("g_idx"); gptq && g_idx) {
      if (g_idx->type != DType::int32 || g_idx->shape.size() != 1 || g_idx->shape[0] != u(r.in))
        r.wrong_shape(*g_idx, detail::cat("int32 [", r.in, "]"));
      l.g_idx.resize(static_cast<std::size_t>(r.in));
      for (std::size_t i = 0; i < l.g_idx.size(); ++i) {
        l.g_idx[i] = static_cast<std::int32_t>(word(*g_idx, i));
        require<FormatError>(l.g_idx[i] >= 0 && l.g_idx[i] < l.groups, name, ": '", g_idx->name, "' puts input ", i,
                             " in group ", l.g_idx[i], " of ", l.groups);
      }
    }
    return l;
  }

#if defined(INFER_HAVE_CUDA)
  /// The weight of `r` in the arena (see the file's comment). Errors as the CPU load, and InvalidArgument
  /// for a shape the GPU kernels do not take (inputs or group not a multiple of 32, act-order).
  template <class B>
  static linear<B> load(const LinearRequest& r, CudaWeightStore& store) {
    return load_stacked<B>(std::span<const LinearRequest>(&r, 1), store);
  }

  /// Several weights of one input stacked into one (q, k, v → qkv; gate, up → gate_up), in the smallest
  /// of their group sizes; InvalidArgument when one part's group size is not a multiple of it.
  template <class B>
  static linear<B> load_stacked(std::span<const LinearRequest> parts, CudaWeightStore& store) {
    static_assert(std::is_same_v<B, cuda>);
    require<InvalidArgument>(!parts.empty(), "Int4 on cuda: no weights to stack");
    linear<B> l;
    l.in_features = parts[0].in;
    std::vector<std::int64_t> source(parts.size());  // each part's own group size
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const LinearRequest& r = parts[i];
      require<InvalidArgument>(r.in == l.in_features, "Int4 on cuda: '", r.role, "' has ", r.in, " inputs, '",
                               parts[0].role, "' ", l.in_features, "; stacked weights share their input");
      const std::int64_t g = source[i] = source_group(r);
      require<InvalidArgument>(kernels::cuda::int4_shape_supported(r.in, g), "Int4 on cuda: '", r.role, "' has ", r.in,
                               " inputs in groups of ", g, "; the INT4 kernels need multiples of 32");
      l.group_size = l.group_size == 0 ? g : std::min(l.group_size, g);
      l.out_features += r.out;
    }
    for (std::size_t i = 0; i < parts.size(); ++i)
      require<InvalidArgument>(source[i] % l.group_size == 0, "Int4 on cuda: '", parts[i].role, "' in groups of ",
                               source[i], " cannot be stacked with groups of ", l.group_size);
    const auto pairs = static_cast<std::size_t>(l.out_features * l.groups());
    auto* codes = static_cast<std::uint8_t*>(store.allocate(static_cast<std::size_t>(l.out_features * l.in_features) / 2));
    auto* scale_min = static_cast<std::uint32_t*>(store.allocate(pairs * sizeof(std::uint32_t)));
    l.codes = codes;
    l.scale_min = scale_min;
    for (const LinearRequest& r : parts) {
      load_rows(r, l.group_size, store, codes, scale_min);
      if (codes != nullptr) {
        codes += r.out * r.in / 2;
        scale_min += r.out * l.groups();
      }
    }
    return l;
  }

  /// y[rows][w.out()] (bf16) = x · (s·(q − z))ᵀ: the INT4 GEMV up to kGemvMaxRows rows, else the weight
  /// dequantized to bf16 in ctx's scratch and the bf16 GEMM.
  static void matmul(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                     std::uint16_t* y) {
    namespace kc = kernels::cuda;
    if (rows <= kc::kGemvMaxRows && reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
      kc::int4_gemv(w.codes, w.scale_min, w.group_size, x, rows, w.out(), w.in(), y, ctx.stream);
      return;
    }
    require<InvalidArgument>(ctx.scratch != nullptr && ctx.scratch_elems >= w.scratch_elems(), "Int4 matmul of ", rows,
                             " rows of [", w.out(), ", ", w.in(), "] needs ", w.scratch_elems(),
                             " bf16 values of scratch; the context has ", ctx.scratch_elems);
    kc::dequantize_int4_bf16(w.codes, w.scale_min, w.group_size, w.out(), w.in(), ctx.scratch, ctx.stream);
    ctx.gemm->run(x, ctx.scratch, y, rows, w.out(), w.in(), ctx.stream);
  }

 private:
  /// The group size r's weight comes in, read from the file's shapes without decoding anything: a packed
  /// checkpoint's (from its `scales`), 32 for GGUF Q4_0/Q4_1 blocks, else what quantize() uses.
  static std::int64_t source_group(const LinearRequest& r) {
    if (const auto scales = r.companion("scales"); scales && r.companion("qweight") && scales->shape.size() == 2 &&
                                                   scales->shape[0] > 0 && r.in % static_cast<std::int64_t>(scales->shape[0]) == 0)
      return r.in / static_cast<std::int64_t>(scales->shape[0]);
    if (!r.companion("qweight")) {
      const WeightTensor t = r.checked_weight();
      if (!t.dummy && (t.type == DType::q4_0 || t.type == DType::q4_1)) return 32;
    }
    return group_size_for(r.in);
  }

  /// r's rows, in groups of `group` (a divisor of its own), into `codes` and `scale_min`; both null in the
  /// measuring pass, which still checks what can be checked without decoding.
  static void load_rows(const LinearRequest& r, std::int64_t group, CudaWeightStore& store, std::uint8_t* codes,
                        std::uint32_t* scale_min) {
    const bool checkpoint = r.companion("qweight").has_value();
    if (const auto g_idx = r.companion("g_idx"); checkpoint && g_idx) {
      // Act-order reorders the inputs among the groups; the kernels read groups of consecutive inputs.
      const std::int64_t source = source_group(r);
      bool consecutive = g_idx->type == DType::int32 && g_idx->data.size() == static_cast<std::size_t>(r.in) * 4;
      for (std::int64_t i = 0; consecutive && i < r.in; ++i) {
        std::int32_t v;
        std::memcpy(&v, g_idx->data.data() + i * 4, 4);
        consecutive = v == i / source;
      }
      require<InvalidArgument>(consecutive, "Int4 on cuda: '", r.role, "' is a GPTQ checkpoint with act-order ('",
                               g_idx->name, "' puts inputs out of order among the groups); the GPU kernels take groups "
                               "of consecutive inputs only (requantize without desc_act, or use --backend cpu)");
    }
    const WeightTensor t = checkpoint ? WeightTensor{} : r.checked_weight();
    const bool gguf_q4 = !checkpoint && !t.dummy && (t.type == DType::q4_0 || t.type == DType::q4_1);
    if (codes == nullptr) return;
    if (!checkpoint && !gguf_q4) {
      float* values = store.f32_scratch(static_cast<std::size_t>(r.out * r.in));
      store.store_f32(values, t);
      kernels::cuda::quantize_groups_int4(values, r.out, r.in, group, codes, scale_min, store.stream_handle());
      return;
    }
    // Decoded on the host by the CPU load, then packed.
    std::vector<std::uint32_t> words, pairs;
    pack_for_cuda(load<cpu>(r), group, words, pairs);
    store.copy_host(codes, words.data(), words.size() * sizeof(std::uint32_t));
    store.copy_host(scale_min, pairs.data(), pairs.size() * sizeof(std::uint32_t));
  }

 public:
  /// A CPU Int4 weight (groups of consecutive inputs: no act-order g_idx) in the GPU's layout, in groups of
  /// `group` (a divisor of its own group size: each of its pairs repeated for the groups it covers): code
  /// words in int4_nibble's order, and per group int4_scale_min_bits(bf16(s), bf16(−s·z)).
  static void pack_for_cuda(const linear<cpu>& c, std::int64_t group, std::vector<std::uint32_t>& words,
                            std::vector<std::uint32_t>& pairs) {
    namespace kc = kernels::cuda;
    require<InvalidArgument>(!c.is_dense() && c.group_size > 0, "Int4::pack_for_cuda: not a grouped weight");
    require<InvalidArgument>(group > 0 && c.group_size % group == 0 && c.in_features % 8 == 0,
                             "Int4::pack_for_cuda: groups of ", group, " do not divide groups of ", c.group_size);
    const std::int64_t in = c.in_features, groups = in / group, per = c.group_size / group;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(c.g_idx.size()); ++i)
      require<InvalidArgument>(c.g_idx[static_cast<std::size_t>(i)] == i / c.group_size,
                               "Int4::pack_for_cuda: act-order (input ", i, " in group ", c.g_idx[static_cast<std::size_t>(i)], ")");
    words.assign(static_cast<std::size_t>(c.out_features * in / 8), 0u);
    pairs.resize(static_cast<std::size_t>(c.out_features * groups));
    for (std::int64_t o = 0; o < c.out_features; ++o) {
      for (std::int64_t i = 0; i < in; ++i)
        words[static_cast<std::size_t>((o * in + i) / 8)] |= static_cast<std::uint32_t>(c.q[static_cast<std::size_t>(o * in + i)])
                                                             << (4 * kc::int4_nibble(static_cast<int>(i % 8)));
      for (std::int64_t g = 0; g < groups; ++g) {
        const auto k = static_cast<std::size_t>(o * c.groups + g / per);
        const float s = c.scale[k], m = -s * c.zero[k];
        pairs[static_cast<std::size_t>(o * groups + g)] = kc::int4_scale_min_bits(f32_to_bf16(s), f32_to_bf16(m));
      }
    }
  }
 public:
#endif

  /// y[rows][w.out()] = x[rows][w.in()] · (s·(q − z))ᵀ (· denseᵀ for a kept head).
  static void matmul(cpu, const linear<cpu>& w, const float* x, std::int32_t rows, float* y) {
    if (w.dense_matmul(w.out(), w.in(), x, rows, y)) return;
    const std::int64_t in = w.in();
    // The same values as w.value(o, i), a group's scale and zero fetched once per group (or per input
    // through g_idx) instead of a division per weight.
    detail::tiled_gemm_xwt(x, rows, w.out(), in, y, [&](std::int64_t o0, std::int64_t n, float* tile) {
      for (std::int64_t o = 0; o < n; ++o) {
        const std::uint8_t* q = w.q.data() + (o0 + o) * in;
        const float* s = w.scale.data() + (o0 + o) * w.groups;
        const float* z = w.zero.data() + (o0 + o) * w.groups;
        float* t = tile + o * in;
        if (w.g_idx.empty()) {
          for (std::int64_t g = 0; g < w.groups; ++g)
            for (std::int64_t i = g * w.group_size, end = std::min(in, i + w.group_size); i < end; ++i)
              t[i] = s[g] * (static_cast<float>(q[i]) - z[g]);
        } else {
          for (std::int64_t i = 0; i < in; ++i) {
            const auto g = static_cast<std::size_t>(w.g_idx[static_cast<std::size_t>(i)]);
            t[i] = s[g] * (static_cast<float>(q[i]) - z[g]);
          }
        }
      }
    });
  }

 private:
  /// The nibble of an AWQ word that holds output column `c` (0..7) of its eight.
  static constexpr int awq_nibble(std::int64_t c) {
    for (int k = 0; k < 8; ++k)
      if (kAwqOrder[static_cast<std::size_t>(k)] == c) return k;
    return 0;
  }
};

static_assert(Quantizer<Int4, cpu>);
static_assert(RoleQuantizer<Int4, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<Int4, cuda>);
static_assert(RoleQuantizer<Int4, cuda>);
#endif

}  // namespace infer
