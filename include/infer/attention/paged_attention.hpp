#pragma once
/// \file
/// `PagedAttention<Tuning>`: the AttentionKernel of the dynamic paged engine. A sequence's K/V rows
/// are found through its block table (PagedKvView), so blocks can be shared between sequences
/// (prefix cache, forks) and grown one at a time. `Tuning` holds the per-backend tile sizes
/// (`cpu_kv_tile`, see cpu_attention.hpp); `void` takes the defaults.
/// The CPU `attend` is here; the CUDA one will be an overload `attend(cuda, ...)` of the same policy.

#include <cstdint>
#include <span>
#include <string_view>

#include "infer/attention/cpu_attention.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"

namespace infer {

template <class Tuning = void>
struct PagedAttention {
  static constexpr KvLayout layout = KvLayout::paged;
  static constexpr std::string_view name = "paged";
  template <class T>
  using view = PagedKvView<T>;

  /// One layer's view of one sequence: `table` (the allocator's block_table) must outlive the view.
  template <class T>
  static view<T> make_view(T* k, T* v, std::span<const std::int32_t> table, std::int32_t block_size,
                           std::int32_t kv_heads, std::int32_t head_dim) {
    return view<T>{k, v, table.data(), static_cast<std::int32_t>(table.size()), block_size, kv_heads, head_dim};
  }

  static void attend(cpu, const AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<float>& kv) {
    require<InvalidArgument>(static_cast<std::int64_t>(start) + count <=
                                 static_cast<std::int64_t>(kv.num_table_blocks) * kv.block_size,
                             "PagedAttention: positions up to ", static_cast<std::int64_t>(start) + count,
                             " need more than the ", kv.num_table_blocks, " blocks of ", kv.block_size,
                             " tokens in the block table; grow the sequence first");
    kernels::cpu::attention<kernels::cpu::detail::cpu_kv_tile<Tuning>()>(shape, q, out, start, count, kv);
  }
};

static_assert(AttentionKernel<PagedAttention<>, cpu>);

}  // namespace infer
