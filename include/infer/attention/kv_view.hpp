#pragma once
/// \file
/// Plain views of one layer's KV cache for one sequence, the only thing attention kernels see of the
/// allocators. KV storage is the same for both engines — per layer, K and V each
/// `[num_blocks][block_size][kv_heads][head_dim]` — and only the addressing differs: a paged sequence
/// finds token `pos` through its block table; a contiguous one owns a slot of `capacity` tokens.
/// Host metadata types never appear here, so one kernel template serves both engines.
///
/// T is the stored value: float (or bf16 bits on the GPU), or std::uint8_t for an FP8 cache's e4m3 codes,
/// whose values are code · k_scale (K) and code · v_scale (V); the scales are unused otherwise.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "infer/core/macros.hpp"

namespace infer {

enum class KvLayout : std::uint8_t { paged, contiguous };

/// Token `pos` of a paged sequence lives in block `block_table[pos / block_size]` at row `pos % block_size`.
template <class T>
struct PagedKvView {
  T* k = nullptr;  ///< this layer's K storage
  T* v = nullptr;  ///< this layer's V storage
  const std::int32_t* block_table = nullptr;
  std::int32_t num_table_blocks = 0;
  std::int32_t block_size = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;

  INFER_HD std::size_t offset(std::int32_t pos, std::int32_t head) const {
    const auto block = static_cast<std::size_t>(block_table[pos / block_size]);
    const auto row = block * static_cast<std::size_t>(block_size) + static_cast<std::size_t>(pos % block_size);
    return (row * static_cast<std::size_t>(kv_heads) + static_cast<std::size_t>(head)) *
           static_cast<std::size_t>(head_dim);
  }
  INFER_HD T* k_at(std::int32_t pos, std::int32_t head) const { return k + offset(pos, head); }
  INFER_HD T* v_at(std::int32_t pos, std::int32_t head) const { return v + offset(pos, head); }
};

/// A contiguous sequence owns slot `slot`: rows [slot * capacity, (slot + 1) * capacity).
template <class T>
struct ContiguousKvView {
  T* k = nullptr;
  T* v = nullptr;
  std::int32_t slot = 0;
  std::int32_t capacity = 0;  ///< tokens per slot (max_input + max_output of the build)
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;

  INFER_HD std::size_t offset(std::int32_t pos, std::int32_t head) const {
    const auto row = static_cast<std::size_t>(slot) * static_cast<std::size_t>(capacity) + static_cast<std::size_t>(pos);
    return (row * static_cast<std::size_t>(kv_heads) + static_cast<std::size_t>(head)) *
           static_cast<std::size_t>(head_dim);
  }
  INFER_HD T* k_at(std::int32_t pos, std::int32_t head) const { return k + offset(pos, head); }
  INFER_HD T* v_at(std::int32_t pos, std::int32_t head) const { return v + offset(pos, head); }
};

/// What an attention kernel needs of a KV view: where token `pos`'s K and V rows for a KV head are.
template <class V>
concept KvView = requires(const V view, std::int32_t pos, std::int32_t head) {
  { view.k_at(pos, head) };
  { view.v_at(pos, head) };
  { view.kv_heads } -> std::convertible_to<std::int32_t>;
  { view.head_dim } -> std::convertible_to<std::int32_t>;
};

static_assert(KvView<PagedKvView<float>>);
static_assert(KvView<ContiguousKvView<float>>);
static_assert(KvView<PagedKvView<std::uint8_t>>);

}  // namespace infer
