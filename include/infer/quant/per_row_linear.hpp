#pragma once
/// \file
/// `detail::PerRowLinear<Code>`: the CPU storage that Int8WeightOnly (int8 codes) and Fp8 (e4m3 codes) share —
/// codes [out][in] row-major with one f32 scale per output row, or the LM head kept in f32 (KeptHead) — with
/// the part list an engine file saves and the consistency check it loads against. Each quantizer adds only
/// how a code decodes (`value`) and its matmul.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "infer/quant/kept_head.hpp"

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

}  // namespace infer::detail
