#pragma once
/// \file
/// `detail::PerRowLinear<Code>`: the CPU storage that Int8WeightOnly (int8 codes) and Fp8 (e4m3 codes) share —
/// codes [out][in] row-major with one f32 scale per output row, or the LM head kept in f32 (KeptHead) — with
/// the part list an engine file saves and the consistency check it loads against. Each quantizer adds only
/// how a code decodes (`value`) and its matmul. `detail::CudaPerRowLinear<Code>` is the same storage in the
/// CUDA weight arena, with the stacking both quantizers load through.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "infer/quant/kept_head.hpp"

#if defined(INFER_HAVE_CUDA)
#include <algorithm>
#include <span>
#include <string_view>

#include "infer/backend/weight_store.hpp"
#include "infer/core/error.hpp"
#include "infer/quant/linear_request.hpp"
#endif

namespace infer::detail {

template <class Code>
struct PerRowLinear : KeptHead {
  std::vector<Code> q;       ///< [out][in] codes
  std::vector<float> scale;  ///< [out]
  std::int64_t out_features = 0;
  std::int64_t in_features = 0;

  [[nodiscard]] std::int64_t out() const noexcept { return out_features; }
  [[nodiscard]] std::int64_t in() const noexcept { return in_features; }
  /// Its arrays and sizes as they are in memory, for the engine file (io/engine_file.hpp), and whether
  /// they agree with each other (a file's parts are checked before anything indexes them).
  template <class Self, class V>
  static void visit_parts(Self& self, V&& v) {
    v("q", self.q);
    v("scale", self.scale);
    v("dense", self.dense);
    v("out", self.out_features);
    v("in", self.in_features);
  }
  [[nodiscard]] bool consistent() const noexcept {
    if (is_dense()) return dense_consistent(out_features, in_features, q.empty() && scale.empty());
    return out_features > 0 && in_features > 0 && q.size() == static_cast<std::size_t>(out_features * in_features) &&
           scale.size() == static_cast<std::size_t>(out_features);
  }
};

#if defined(INFER_HAVE_CUDA)
/// Codes [out][in] and one f32 scale per output row, in the CUDA weight arena.
template <class Code>
struct CudaPerRowLinear {
  const Code* q = nullptr;
  const float* scale = nullptr;
  std::int64_t out_features = 0;
  std::int64_t in_features = 0;

  [[nodiscard]] std::int64_t out() const noexcept { return out_features; }
  [[nodiscard]] std::int64_t in() const noexcept { return in_features; }
  /// Whether its arrays are there (an engine file's offsets were placed).
  [[nodiscard]] bool consistent() const noexcept {
    return q != nullptr && scale != nullptr && out_features > 0 && in_features > 0;
  }
  /// Its sizes and its place in the weight arena, for an engine file (io/engine_file.hpp's arena visitors).
  template <class Self, class V>
  static void visit_arena(Self& self, const V& v) {
    v.scalar("out", self.out_features);
    v.scalar("in", self.in_features);
    const auto out = static_cast<std::size_t>(std::max<std::int64_t>(self.out_features, 0));
    v.pointer("q", self.q, out * static_cast<std::size_t>(std::max<std::int64_t>(self.in_features, 0)) * sizeof(Code));
    v.pointer("scale", self.scale, out * sizeof(float));
  }

  /// Several weights of one input stacked into one linear L (q, k, v → qkv; gate, up → gate_up; or one):
  /// rows and their scales are independent, so stacking is placing them one after another, each part's
  /// written by `load_rows(r, store, q, scale)` (null pointers in the measuring pass). `who` names the
  /// quantizer in the errors: InvalidArgument for inputs not a multiple of 16 (the kernels' unit) or parts
  /// of different input widths.
  template <class L, class LoadRows>
  static L load_stacked(std::span<const LinearRequest> parts, CudaWeightStore& store, std::string_view who,
                        LoadRows&& load_rows) {
    require<InvalidArgument>(!parts.empty(), who, " on cuda: no weights to stack");
    L l;
    l.in_features = parts[0].in;
    for (const LinearRequest& r : parts) {
      require<InvalidArgument>(r.in % 16 == 0, who, " on cuda: '", r.role, "' has ", r.in,
                               " inputs; its kernels need a multiple of 16");
      require<InvalidArgument>(r.in == l.in_features, who, " on cuda: '", r.role, "' has ", r.in, " inputs, '",
                               parts[0].role, "' ", l.in_features, "; stacked weights share their input");
      l.out_features += r.out;
    }
    auto* q = static_cast<Code*>(store.allocate(static_cast<std::size_t>(l.out_features * l.in_features) * sizeof(Code)));
    auto* scale = static_cast<float*>(store.allocate(static_cast<std::size_t>(l.out_features) * sizeof(float)));
    l.q = q;
    l.scale = scale;
    for (const LinearRequest& r : parts) {
      load_rows(r, store, q, scale);
      if (q != nullptr) {
        q += r.out * r.in;
        scale += r.out;
      }
    }
    return l;
  }
};
#endif

}  // namespace infer::detail
