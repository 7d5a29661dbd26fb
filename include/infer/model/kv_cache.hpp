#pragma once
/// \file
/// `KvCache<B>`: the K/V bytes of every layer, for both engines. Allocators own only the metadata
/// (which block a sequence uses); this owns the storage those ids index. Per layer, K and V are each
/// `[num_blocks][block_size][kv_heads][head_dim]` — the layout PagedKvView and ContiguousKvView
/// address (a contiguous engine's "block" is a slot of `capacity` tokens). The values are the backend's
/// type, or e4m3 codes with a per-layer scale for K and for V (KvCacheDtype::fp8_e4m3, kv_dtype.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/kv_dtype.hpp"

namespace infer {

template <class B>
class KvCache;

template <>
class KvCache<cpu> {
 public:
  /// InvalidArgument when a size is not positive or the cache would not fit in memory addresses.
  KvCache(std::int32_t num_layers, std::int32_t num_blocks, std::int32_t block_size, std::int32_t kv_heads,
          std::int32_t head_dim, KvCacheDtype dtype = KvCacheDtype::automatic)
      : num_layers_(num_layers), num_blocks_(num_blocks), block_size_(block_size), kv_heads_(kv_heads),
        head_dim_(head_dim), dtype_(dtype) {
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
    if (dtype_ == KvCacheDtype::fp8_e4m3) codes_.assign(total, 0);
    else data_.assign(total, 0.0f);
    k_scale_.assign(static_cast<std::size_t>(num_layers), 1.0f);
    v_scale_.assign(static_cast<std::size_t>(num_layers), 1.0f);
  }

  [[nodiscard]] KvCacheDtype dtype() const noexcept { return dtype_; }

  /// Layer `layer`'s K (or V) values of an f32 cache. InvalidArgument for a layer out of range, or when the
  /// cache holds e4m3 codes (k_codes, v_codes).
  [[nodiscard]] float* k(std::int32_t layer) { return values() + offset(layer, 0); }
  [[nodiscard]] float* v(std::int32_t layer) { return values() + offset(layer, 1); }
  [[nodiscard]] const float* k(std::int32_t layer) const { return const_cast<KvCache*>(this)->k(layer); }
  [[nodiscard]] const float* v(std::int32_t layer) const { return const_cast<KvCache*>(this)->v(layer); }

  /// Layer `layer`'s K (or V) codes of an fp8_e4m3 cache: value = e4m3_to_f32(code) · k_scale(layer).
  /// InvalidArgument for a layer out of range, or when the cache holds f32 values.
  [[nodiscard]] std::uint8_t* k_codes(std::int32_t layer) { return codes() + offset(layer, 0); }
  [[nodiscard]] std::uint8_t* v_codes(std::int32_t layer) { return codes() + offset(layer, 1); }

  /// The scales of layer `layer`'s codes (1.0 until set; unused by an f32 cache).
  [[nodiscard]] float k_scale(std::int32_t layer) const { return k_scale_[index(layer)]; }
  [[nodiscard]] float v_scale(std::int32_t layer) const { return v_scale_[index(layer)]; }
  /// Sets them (positive and finite, else InvalidArgument); codes already written keep the old ones' meaning.
  void set_scales(std::int32_t layer, float k, float v) {
    require_kv_scales(detail::cat("KvCache::set_scales: layer ", layer), k, v);
    k_scale_[index(layer)] = k;
    v_scale_[index(layer)] = v;
  }

  /// Copies block `src` onto block `dst` in every layer, K and V: the engine applies an allocator's
  /// copy-on-write (BlockCopy) with this before the step that writes into `dst`.
  void copy_block(std::int32_t src, std::int32_t dst) {
    check_block(src, "src");
    check_block(dst, "dst");
    if (src == dst) return;
    const std::size_t size = value_bytes();
    auto* base = dtype_ == KvCacheDtype::fp8_e4m3 ? codes_.data() : reinterpret_cast<std::uint8_t*>(data_.data());
    for (std::int32_t l = 0; l < num_layers_; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        std::uint8_t* part = base + offset(l, kv) * size;
        std::memcpy(part + static_cast<std::size_t>(dst) * block_elems_ * size,
                    part + static_cast<std::size_t>(src) * block_elems_ * size, block_elems_ * size);
      }
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size() * sizeof(float) + codes_.size(); }
  /// Bytes one token takes across all layers, K and V.
  [[nodiscard]] static std::size_t bytes_per_token(std::int64_t num_layers, std::int64_t kv_heads, std::int64_t head_dim,
                                                   KvCacheDtype dtype = KvCacheDtype::automatic) noexcept {
    return static_cast<std::size_t>(num_layers * 2 * kv_heads * head_dim) * kv_value_bytes(dtype, sizeof(float));
  }
  [[nodiscard]] std::int32_t num_layers() const noexcept { return num_layers_; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept { return num_blocks_; }
  [[nodiscard]] std::int32_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::int32_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::int32_t head_dim() const noexcept { return head_dim_; }

  /// Fills every value with a quiet NaN (an e4m3 cache: the NaN code 0x7f), so a test can show that attention
  /// never reads a slot that was not written (a NaN read anywhere reaches the logits).
  void poison() {
    std::fill(data_.begin(), data_.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(codes_.begin(), codes_.end(), std::uint8_t{0x7f});
  }

 private:
  [[nodiscard]] std::size_t value_bytes() const noexcept { return kv_value_bytes(dtype_, sizeof(float)); }
  [[nodiscard]] float* values() {
    require<InvalidArgument>(dtype_ != KvCacheDtype::fp8_e4m3,
                             "KvCache: this cache holds e4m3 codes (kv_cache_dtype fp8_e4m3); read them with k_codes/v_codes");
    return data_.data();
  }
  [[nodiscard]] std::uint8_t* codes() {
    require<InvalidArgument>(dtype_ == KvCacheDtype::fp8_e4m3, "KvCache: this cache holds f32 values, not e4m3 codes");
    return codes_.data();
  }
  [[nodiscard]] std::size_t index(std::int32_t layer) const {
    if (layer < 0 || layer >= num_layers_)
      throw InvalidArgument(detail::cat("KvCache: layer ", layer, " is out of range [0, ", num_layers_, ")"));
    return static_cast<std::size_t>(layer);
  }
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
  KvCacheDtype dtype_;
  std::size_t block_elems_ = 0;  ///< values of one block of one layer's K (or V)
  std::size_t layer_elems_ = 0;  ///< values of one layer's K (or V)
  std::vector<float> data_;      ///< [layer][K, V][num_blocks][block_size][kv_heads][head_dim] (f32 cache)
  std::vector<std::uint8_t> codes_;  ///< the same layout, e4m3 codes (fp8_e4m3 cache)
  std::vector<float> k_scale_, v_scale_;  ///< per layer
};

}  // namespace infer

#if defined(INFER_HAVE_CUDA)
#include "infer/model/kv_cache_cuda.hpp"
#endif
