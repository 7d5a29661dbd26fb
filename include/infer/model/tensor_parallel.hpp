#pragma once
/// \file
/// `TensorParallel`: where a model's part sits in a tensor-parallel split (rank `rank` of `size`), and what that
/// means for the vocabulary. A shard (ModelSource::shard) and an engine file built from one
/// (EngineFileInfo::tensor_parallel) carry it.

#include <cstdint>
#include <string>

namespace infer {

/// Where a model's part sits in a tensor-parallel group: rank `rank` of `size` ({0, 1}: the whole model).
struct TensorParallel {
  int rank = 0;
  int size = 1;
  /// The vocabulary rows this rank holds of the embedding and the LM head: ceil(vocab / size) a rank, in rank
  /// order, the last rank's fewer (or none), so all-gathered logits are `size` equal blocks.
  [[nodiscard]] std::int64_t vocab_block(std::int64_t vocab) const noexcept { return (vocab + size - 1) / size; }
  [[nodiscard]] std::int64_t vocab_first(std::int64_t vocab) const noexcept { return rank * vocab_block(vocab); }
  [[nodiscard]] std::int64_t vocab_rows(std::int64_t vocab) const noexcept {
    const std::int64_t first = vocab_first(vocab), block = vocab_block(vocab);
    return first >= vocab ? 0 : (vocab - first < block ? vocab - first : block);
  }
  /// Whether this is one part of a split (not the whole model).
  [[nodiscard]] bool split() const noexcept { return size > 1; }
  [[nodiscard]] bool valid() const noexcept { return size >= 1 && rank >= 0 && rank < size; }
  /// "the whole model" or "rank 1 of a 2-way tensor-parallel split", for messages.
  [[nodiscard]] std::string describe() const {
    return split() ? "rank " + std::to_string(rank) + " of a " + std::to_string(size) + "-way tensor-parallel split"
                   : std::string("the whole model");
  }
  friend bool operator==(const TensorParallel&, const TensorParallel&) = default;
};

}  // namespace infer
