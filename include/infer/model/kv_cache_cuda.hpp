#pragma once
/// \file
/// `KvCache<cuda>`: the KV pool on the GPU — one allocation, bf16 (or e4m3 codes with a per-layer scale for
/// K and for V: KvCacheDtype::fp8_e4m3, kv_dtype.hpp), with the CPU cache's layout
/// ([layer][K, V][num_blocks][block_size][kv_heads][head_dim]), so the same block ids and tables index
/// both and the paged kernels address it exactly as PagedKvView does on the host. Sized by the engine
/// from `gpu_memory_utilization` (see kv_pool_bytes) or an explicit byte budget.

#if defined(INFER_HAVE_CUDA)

#include <cstddef>
#include <cstdint>
#include <limits>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/kv_dtype.hpp"
#include <vector>

namespace infer {

template <class B>
class KvCache;

template <>
class KvCache<cuda> {
 public:
  using value_type = std::uint16_t;  ///< bf16 bits (an automatic cache)

  /// InvalidArgument for a non-positive size or an overflowing product; DeviceError (naming the bytes
  /// asked for and free) when the device cannot hold it.
  KvCache(std::int32_t num_layers, std::int32_t num_blocks, std::int32_t block_size, std::int32_t kv_heads,
          std::int32_t head_dim, KvCacheDtype dtype = KvCacheDtype::automatic)
      : num_layers_(num_layers), num_blocks_(num_blocks), block_size_(block_size), kv_heads_(kv_heads),
        head_dim_(head_dim), dtype_(dtype), value_bytes_(kv_value_bytes(dtype, sizeof(value_type))) {
    using detail::cat;
    auto positive = [](const char* what, std::int32_t v) {
      if (v <= 0) throw InvalidArgument(cat("KvCache<cuda>: ", what, " = ", v, " must be positive"));
    };
    positive("num_layers", num_layers);
    positive("num_blocks", num_blocks);
    positive("block_size", block_size);
    positive("kv_heads", kv_heads);
    positive("head_dim", head_dim);
    std::size_t block = 0, layer = 0, total = 0;
    const auto u = [](std::int32_t v) { return static_cast<std::size_t>(v); };
    if (__builtin_mul_overflow(u(block_size) * u(kv_heads), u(head_dim), &block) ||
        __builtin_mul_overflow(block, u(num_blocks), &layer) ||
        __builtin_mul_overflow(layer, u(num_layers) * 2, &total) ||
        total > std::numeric_limits<std::size_t>::max() / value_bytes_)
      throw InvalidArgument(cat("KvCache<cuda>: ", num_layers, " layers x ", num_blocks, " blocks x ", block_size,
                                " tokens x ", kv_heads, " heads x ", head_dim, " values does not fit in memory"));
    // The decode attention kernel addresses one layer's K or V in 32-bit units of 16 bytes.
    constexpr std::size_t kMaxLayerBytes = std::size_t{64} << 30;
    if (layer * value_bytes_ >= kMaxLayerBytes)
      throw InvalidArgument(cat("KvCache<cuda>: ", num_blocks, " blocks make one layer's K ", layer * value_bytes_,
                                " bytes; the attention kernels address at most 64 GiB per layer (fewer blocks)"));
    block_elems_ = block;
    layer_elems_ = layer;
    data_ = backend::cuda::DeviceBuffer(total * value_bytes_);
    k_scale_.assign(static_cast<std::size_t>(num_layers), 1.0f);
    v_scale_.assign(static_cast<std::size_t>(num_layers), 1.0f);
  }

  [[nodiscard]] KvCacheDtype dtype() const noexcept { return dtype_; }

  /// Layer `layer`'s K (or V) bf16 values on the device. InvalidArgument for a layer out of range, or when
  /// the cache holds e4m3 codes (k_storage).
  [[nodiscard]] value_type* k(std::int32_t layer) const { return static_cast<value_type*>(bf16_storage(layer, 0)); }
  [[nodiscard]] value_type* v(std::int32_t layer) const { return static_cast<value_type*>(bf16_storage(layer, 1)); }
  /// Layer `layer`'s K (or V) storage whatever it holds: bf16 values, or e4m3 codes (dtype()).
  [[nodiscard]] void* k_storage(std::int32_t layer) const { return bytes_base() + offset(layer, 0) * value_bytes_; }
  [[nodiscard]] void* v_storage(std::int32_t layer) const { return bytes_base() + offset(layer, 1) * value_bytes_; }

  /// The scales of layer `layer`'s e4m3 codes (value = code · scale; 1.0 until set, unused by a bf16 cache).
  [[nodiscard]] float k_scale(std::int32_t layer) const { return k_scale_[index(layer)]; }
  [[nodiscard]] float v_scale(std::int32_t layer) const { return v_scale_[index(layer)]; }
  /// Sets them (positive and finite, else InvalidArgument). A captured CUDA graph keeps the scales it captured:
  /// set them before the model's prepare().
  void set_scales(std::int32_t layer, float k, float v) {
    require_kv_scales(detail::cat("KvCache<cuda>::set_scales: layer ", layer), k, v);
    k_scale_[index(layer)] = k;
    v_scale_[index(layer)] = v;
  }

  /// Copies block `src` onto block `dst` in every layer, K and V (copy-on-write), as one strided copy
  /// on the legacy default stream, which orders it before the step's kernels on the model's stream.
  void copy_block(std::int32_t src, std::int32_t dst) {
    check_block(src, "src");
    check_block(dst, "dst");
    if (src == dst) return;
    const std::size_t width = block_elems_ * value_bytes_, pitch = layer_elems_ * value_bytes_;
    backend::cuda::check(cudaMemcpy2DAsync(bytes_base() + static_cast<std::size_t>(dst) * width, pitch,
                                           bytes_base() + static_cast<std::size_t>(src) * width, pitch, width,
                                           static_cast<std::size_t>(num_layers_) * 2, cudaMemcpyDeviceToDevice,
                                           nullptr),
                         "KvCache<cuda>::copy_block");
  }

  [[nodiscard]] std::size_t bytes() const noexcept { return data_.size(); }
  [[nodiscard]] std::int32_t num_layers() const noexcept { return num_layers_; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept { return num_blocks_; }
  [[nodiscard]] std::int32_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::int32_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::int32_t head_dim() const noexcept { return head_dim_; }

  /// Fills every value with NaN (bf16 0xffff, e4m3 0xff), so a test shows attention never reads an unwritten slot.
  void poison() { data_.fill_bytes(0xff); }

  /// Bytes one token takes across all layers, K and V.
  [[nodiscard]] static std::size_t bytes_per_token(std::int64_t num_layers, std::int64_t kv_heads, std::int64_t head_dim,
                                                   KvCacheDtype dtype = KvCacheDtype::automatic) noexcept {
    return static_cast<std::size_t>(num_layers * 2 * kv_heads * head_dim) * kv_value_bytes(dtype, sizeof(value_type));
  }

 private:
  [[nodiscard]] unsigned char* bytes_base() const noexcept { return data_.as<unsigned char>(); }
  [[nodiscard]] void* bf16_storage(std::int32_t layer, int which) const {
    require<InvalidArgument>(dtype_ != KvCacheDtype::fp8_e4m3, "KvCache<cuda>: this cache holds e4m3 codes ",
                             "(kv_cache_dtype fp8_e4m3), not bf16 values; address it with k_storage/v_storage");
    return bytes_base() + offset(layer, which) * value_bytes_;
  }
  [[nodiscard]] std::size_t index(std::int32_t layer) const {
    if (layer < 0 || layer >= num_layers_)
      throw InvalidArgument(detail::cat("KvCache<cuda>: layer ", layer, " is out of range [0, ", num_layers_, ")"));
    return static_cast<std::size_t>(layer);
  }
  [[nodiscard]] std::size_t offset(std::int32_t layer, int which) const {
    if (layer < 0 || layer >= num_layers_)
      throw InvalidArgument(detail::cat("KvCache<cuda>: layer ", layer, " is out of range [0, ", num_layers_, ")"));
    return (static_cast<std::size_t>(layer) * 2 + static_cast<std::size_t>(which)) * layer_elems_;
  }
  void check_block(std::int32_t b, const char* what) const {
    if (b < 0 || b >= num_blocks_)
      throw InvalidArgument(detail::cat("KvCache<cuda>::copy_block: ", what, " block ", b, " is out of range [0, ",
                                        num_blocks_, ")"));
  }

  std::int32_t num_layers_;
  std::int32_t num_blocks_;
  std::int32_t block_size_;
  std::int32_t kv_heads_;
  std::int32_t head_dim_;
  KvCacheDtype dtype_;
  std::size_t value_bytes_;  ///< 2 (bf16) or 1 (e4m3)
  std::size_t block_elems_ = 0;
  std::size_t layer_elems_ = 0;
  backend::cuda::DeviceBuffer data_;
  std::vector<float> k_scale_, v_scale_;  ///< per layer
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
