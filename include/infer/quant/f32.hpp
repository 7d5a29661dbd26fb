#pragma once
/// \file
/// `infer::F32`: the Quantizer that keeps no quantization at all. Every weight — f32, f16, bf16 or any
/// GGUF block format — is decoded once at load into an f32 `[out][in]` matrix, and the matmul is a
/// plain f32 GEMM (OpenBLAS on the CPU). It is the reference the quantized policies are measured
/// against, and the CPU backend's default: on the host, memory bandwidth spent on f32 weights still
/// beats decoding blocks inside the GEMM without hand-written SIMD kernels.

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/model/dummy.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/weight_tensor.hpp"

namespace infer {

namespace detail {

/// Left undefined for backends not implemented yet, so `Quantizer<F32, cuda>` is simply false.
template <class B>
struct F32Linear;

/// A dense f32 weight, row-major [out][in].
template <>
struct F32Linear<cpu> {
  std::vector<float> w;
  std::int64_t out_features = 0;
  std::int64_t in_features = 0;

  [[nodiscard]] std::int64_t out() const noexcept { return out_features; }
  [[nodiscard]] std::int64_t in() const noexcept { return in_features; }
  [[nodiscard]] const float* data() const noexcept { return w.data(); }
  /// Its arrays and sizes as they are in memory, for the engine file (io/engine_file.hpp), and whether
  /// they agree with each other (a file's parts are checked before anything indexes them).
  template <class Self, class V>
  static void visit_parts(Self& self, V&& v) {
    v("w", self.w);
    v("out", self.out_features);
    v("in", self.in_features);
  }
  [[nodiscard]] bool consistent() const noexcept {
    return out_features > 0 && in_features > 0 && w.size() == static_cast<std::size_t>(out_features * in_features);
  }
};

}  // namespace detail

/// Decodes `t` (any dtype kernels::cpu::dequantize knows) into `dst`, which must hold t.elements() values.
/// FormatError naming the tensor when its bytes do not match its shape and type.
inline void dequantize_to_f32(const WeightTensor& t, std::span<float> dst) {
  if (t.dummy) {  // a dummy model's weight: the same bf16 values the GPU makes
    require<InvalidArgument>(dst.size() == t.elements(), "dequantize_to_f32: tensor '", t.name, "' has ",
                             t.elements(), " values, the destination ", dst.size());
    const DummyFill& f = *t.dummy;
    const auto cols = static_cast<std::uint64_t>(t.cols());
    for (std::size_t i = 0; i < dst.size(); ++i)
      dst[i] = bf16_to_f32(
          f32_to_bf16(dummy_value(f.seed, dummy_index(i, cols, f.row0, f.col0, f.full_cols), f.center, f.spread)));
    return;
  }
  try {
    kernels::cpu::dequantize(t.type, t.data, dst);
  } catch (const InvalidArgument& e) {
    // A size mismatch here is the file's fault (shape and bytes disagree), not the caller's.
    throw FormatError(detail::cat("tensor '", t.name, "' (", name(t.type), ", ", t.elements(),
                                  " values): cannot be decoded: ", e.what()));
  } catch (const UnsupportedError& e) {  // int8 / fp8 without their scales: say which tensor
    throw UnsupportedError(detail::cat("tensor '", t.name, "': ", e.what()));
  }
}

struct F32 {
  static constexpr std::string_view name = "f32";

  template <class B>
  using linear = detail::F32Linear<B>;

  /// A linear layer's weight: `t` must be 2-D ([out, in], row-major). InvalidArgument otherwise.
  template <class B>
  static linear<B> load(const WeightTensor& t, cpu = {}) {
    static_assert(std::is_same_v<B, cpu>, "infer::F32::load: only the cpu backend is implemented so far");
    require<InvalidArgument>(t.shape.size() == 2, "F32::load: tensor '", t.name, "' has ", t.shape.size(),
                             " dimensions; a linear layer's weight has 2 ([out, in])");
    linear<B> l;
    l.out_features = static_cast<std::int64_t>(t.shape[0]);
    l.in_features = static_cast<std::int64_t>(t.shape[1]);
    l.w.resize(static_cast<std::size_t>(t.elements()));
    dequantize_to_f32(t, l.w);
    return l;
  }

  /// y[rows][w.out()] = x[rows][w.in()] · wᵀ.
  static void matmul(cpu, const linear<cpu>& w, const float* x, std::int32_t rows, float* y) {
    kernels::cpu::gemm_xwt(x, w.data(), y, rows, w.out(), w.in());
  }

  /// row[w.in()] = w[id]: the token embedding's lookup, so the embedding and a tied LM head are one
  /// weight (EmbeddingQuantizer). `id` is checked by the decoder (validate_step).
  static void embed(const linear<cpu>& w, std::int32_t id, float* row) {
    std::memcpy(row, w.data() + static_cast<std::size_t>(id) * static_cast<std::size_t>(w.in()),
                static_cast<std::size_t>(w.in()) * sizeof(float));
  }
};

static_assert(Quantizer<F32, cpu>);
static_assert(EmbeddingQuantizer<F32, cpu>);

}  // namespace infer
