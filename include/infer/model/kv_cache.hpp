#pragma once
/// \file
/// `KvCache<B>`: the K/V bytes of every layer, for both engines. Allocators own only the metadata
/// (which block a sequence uses); this owns the storage those ids index. Per layer, K and V are each
/// `[num_blocks][block_size][kv_heads][head_dim]` — the layout PagedKvView and ContiguousKvView
/// address (a contiguous engine's "block" is a slot of `capacity` tokens).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"

namespace infer {

template <class B>
class KvCache;

template <>
class KvCache<cpu> {
 public:
  /// InvalidArgument when a size is not positive or the cache would not fit in memory addresses.
  KvCache(std::int32_t num_layers, std::int32_t num_blocks, std::int32_t block_size, std::int32_t kv_heads,
          std::int32_t head_dim)
      : num_layers_(num_layers), num_blocks_(num_blocks), block_size_(block_size), kv_heads_(kv_heads),
        head_dim_(head_dim) {
    using detail::cat;
    auto positive = [](const char* what, std::int32_t v) {
      if (v <= 0) throw InvalidArgument(cat("KvCache: ", what, " = ", v, " must be positive"));
    };
    positive("num_layers", num_layers);
    positive("num_blocks", num_blocks);
    positive("block_size", block_size);
    positive("kv_heads", kv_heads);
    positive("head_dim", head_dim);
    // Checked products: a typo'd num_blocks must be an error, not a wrapped small allocation.
    std::size_t block = 0, layer = 0, total = 0;
    const auto u = [](std::int32_t v) { return static_cast<std::size_t>(v); };
    if (__builtin_mul_overflow(u(block_size) * u(kv_heads), u(head_dim), &block) ||
        __builtin_mul_overflow(block, u(num_blocks), &layer) ||
        __builtin_mul_overflow(layer, u(num_layers) * 2, &total) ||
        total > std::numeric_limits<std::size_t>::max() / sizeof(float))
      throw InvalidArgument(cat("KvCache: ", num_layers, " layers x ", num_blocks, " blocks x ", block_size,
                                " tokens x ", kv_heads, " heads x ", head_dim, " values does not fit in memory"));
    block_elems_ = block;
    layer_elems_ = layer;
    data_.assign(total, 0.0f);
  }

  /// Layer `layer`'s K (or V) storage. InvalidArgument for a layer out of range.
  [[nodiscard]] float* k(std::int32_t layer) { return data_.data() + offset(layer, 0); }
  [[nodiscard]] float* v(std::int32_t layer) { return data_.data() + offset(layer, 1); }
  [[nodiscard]] const float* k(std::int32_t layer) const { return data_.data() + offset(layer, 0); }
  [[nodiscard]] const float* v(std::int32_t layer) const { return data_.data() + offset(layer, 1); }

  /// Copies block `src` onto block `dst` in every layer, K and V: the engine applies an allocator's
  /// copy-on-write (BlockCopy) with this before the step that writes into `dst`.
  void copy_block(std::int32_t src, std::int32_t dst) {
    check_block(src, "src");
    check_block(dst, "dst");
    if (src == dst) return;
    for (std::int32_t l = 0; l < num_layers_; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        float* base = data_.data() + offset(l, kv);
        std::memcpy(base + static_cast<std::size_t>(dst) * block_elems_,
                    base + static_cast<std::size_t>(src) * block_elems_, block_elems_ * sizeof(float));
      }
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size() * sizeof(float); }
  [[nodiscard]] std::int32_t num_layers() const noexcept { return num_layers_; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept { return num_blocks_; }
  [[nodiscard]] std::int32_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::int32_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::int32_t head_dim() const noexcept { return head_dim_; }

  /// Fills every value with a quiet NaN, so a test can show that attention never reads a slot that
  /// was not written (a NaN read anywhere reaches the logits).
  void poison() { std::fill(data_.begin(), data_.end(), std::numeric_limits<float>::quiet_NaN()); }

 private:
  [[nodiscard]] std::size_t offset(std::int32_t layer, int which) const {
    if (layer < 0 || layer >= num_layers_)
      throw InvalidArgument(detail::cat("KvCache: layer ", layer, " is out of range [0, ", num_layers_, ")"));
    return (static_cast<std::size_t>(layer) * 2 + static_cast<std::size_t>(which)) * layer_elems_;
  }
  void check_block(std::int32_t b, const char* what) const {
    if (b < 0 || b >= num_blocks_)
      throw InvalidArgument(detail::cat("KvCache::copy_block: ", what, " block ", b, " is out of range [0, ",
                                        num_blocks_, ")"));
  }

  std::int32_t num_layers_;
  std::int32_t num_blocks_;
  std::int32_t block_size_;
  std::int32_t kv_heads_;
  std::int32_t head_dim_;
  std::size_t block_elems_ = 0;  ///< floats of one block of one layer's K (or V)
  std::size_t layer_elems_ = 0;  ///< floats of one layer's K (or V)
  std::vector<float> data_;      ///< [layer][K, V][num_blocks][block_size][kv_heads][head_dim]
};

}  // namespace infer

#if defined(INFER_HAVE_CUDA)
#include "infer/model/kv_cache_cuda.hpp"
#endif
