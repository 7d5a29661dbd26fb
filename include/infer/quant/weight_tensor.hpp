#pragma once
/// \file
/// `WeightTensor`: one weight as a Quantizer receives it, whichever file it came from. Shapes are
/// row-major with the slowest dimension first — a linear layer is `[out_features, in_features]` — so a
/// GGUF tensor's dimensions arrive reversed from the file's order. The bytes are the file's own (mapped),
/// in `type`'s encoding; a Quantizer decides what to keep.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "infer/core/dtype.hpp"

namespace infer {

/// How a dummy model's weight is made instead of read (vLLM's load_format=dummy): value i is
/// `dummy_value(seed, i, center, spread)` (model/dummy.hpp), rounded to bf16, computed wherever the weight
/// is stored — on the GPU for the CUDA backend, so an 8B model needs no host work and no transfer.
struct DummyFill {
  std::uint64_t seed = 0;
  float center = 0.0f;
  float spread = 0.0f;
  /// A slice of the whole tensor (a tensor-parallel shard, ModelSource::shard): element j of the slice, `cols`
  /// values a row, is element (row0 + j / cols) · full_cols + col0 + j % cols of the whole. full_cols 0: the
  /// whole tensor (element j is j).
  std::uint64_t row0 = 0, col0 = 0, full_cols = 0;
};

struct WeightTensor {
  std::string name;                  ///< the file's name for it, for error messages
  DType type = DType::f32;
  std::vector<std::uint64_t> shape;  ///< row-major, slowest first
  std::span<const std::byte> data;  ///< empty for a dummy weight
  std::optional<DummyFill> dummy;   ///< set (with type bf16) for a dummy model's weight

  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  [[nodiscard]] std::int64_t rows() const noexcept { return shape.empty() ? 1 : static_cast<std::int64_t>(shape.front()); }
  [[nodiscard]] std::int64_t cols() const noexcept {
    return shape.size() < 2 ? static_cast<std::int64_t>(elements()) : static_cast<std::int64_t>(elements() / shape.front());
  }
};

}  // namespace infer
