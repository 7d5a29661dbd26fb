#pragma once
/// \file
/// `KvCache<cuda>`: the KV pool on the GPU — one allocation, bf16, with the CPU cache's layout
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

namespace infer {

template <class B>
class KvCache;

template <>
class KvCache<cuda> {
 public:
  using value_type = std::uint16_t;  ///< bf16 bits

  /// InvalidArgument for a non-positive size or an overflowing product; DeviceError (naming the bytes
  /// asked for and free) when the device cannot hold it.
  KvCache(std::int32_t num_layers, std::int32_t num_blocks, std::int32_t block_size, std::int32_t kv_heads,
          std::int32_t head_dim)
      : num_layers_(num_layers), num_blocks_(num_blocks), block_size_(block_size), kv_heads_(kv_heads),
        head_dim_(head_dim) {
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
        total > std::numeric_limits<std::size_t>::max() / sizeof(value_type))
      throw InvalidArgument(cat("KvCache<cuda>: ", num_layers, " layers x ", num_blocks, " blocks x ", block_size,
                                " tokens x ", kv_heads, " heads x ", head_dim, " values does not fit in memory"));
    // The decode attention kernel addresses one layer's K or V in 32-bit units of 16 bytes.
    constexpr std::size_t kMaxLayerBytes = std::size_t{64} << 30;
    if (layer * sizeof(value_type) >= kMaxLayerBytes)
      throw InvalidArgument(cat("KvCache<cuda>: ", num_blocks, " blocks make one layer's K ", layer * sizeof(value_type),
                                " bytes; the attention kernels address at most 64 GiB per layer (fewer blocks)"));
    block_elems_ = block;
    layer_elems_ = layer;
    data_ = backend::cuda::DeviceBuffer(total * sizeof(value_type));
  }

  /// Layer `layer`'s K (or V) storage on the device. InvalidArgument for a layer out of range.
  [[nodiscard]] value_type* k(std::int32_t layer) const { return base() + offset(layer, 0); }
  [[nodiscard]] value_type* v(std::int32_t layer) const { return base() + offset(layer, 1); }

  /// Copies block `src` onto block `dst` in every layer, K and V (copy-on-write), as one strided copy
  /// on the legacy default stream, which orders it before the step's kernels on the model's stream.
  void copy_block(std::int32_t src, std::int32_t dst) {
    check_block(src, "src");
    check_block(dst, "dst");
    if (src == dst) return;
    const std::size_t width = block_elems_ * sizeof(value_type), pitch = layer_elems_ * sizeof(value_type);
    backend::cuda::check(cudaMemcpy2DAsync(base() + static_cast<std::size_t>(dst) * block_elems_, pitch,
                                           base() + static_cast<std::size_t>(src) * block_elems_, pitch, width,
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

  /// Fills every value with NaN (0xffff), so a test shows attention never reads an unwritten slot.
  void poison() { data_.fill_bytes(0xff); }

  /// Bytes one token takes across all layers, K and V.
  [[nodiscard]] static std::size_t bytes_per_token(std::int64_t num_layers, std::int64_t kv_heads,
                                                   std::int64_t head_dim) noexcept {
    return static_cast<std::size_t>(num_layers * 2 * kv_heads * head_dim) * sizeof(value_type);
  }

 private:
  [[nodiscard]] value_type* base() const noexcept { return data_.as<value_type>(); }
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
  std::size_t block_elems_ = 0;
  std::size_t layer_elems_ = 0;
  backend::cuda::DeviceBuffer data_;
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
