#pragma once
/// \file
/// `ContiguousAllocator<Shape>`: the static engine's BlockAllocator. The KV cache is `S.max_batch`
/// fixed slots of `S.max_input + S.max_output` tokens, one per resident sequence, all sized at compile
/// time: no block tables to walk, no fragmentation to manage, and every kernel shape is known when the
/// step's CUDA graph is captured. The price is memory: a slot is reserved for the longest possible
/// sequence, and the waste is what stats() reports.
///
/// In the BlockAllocator contract a slot is `blocks_per_slot` consecutive blocks of kBlockSize tokens:
/// slot s holds blocks [s·blocks_per_slot, (s+1)·blocks_per_slot), and a sequence's block table is that
/// range. The storage is the paged engine's ([blocks][block_size][kv_heads][head_dim] per layer), so a
/// slot is contiguous rows (FusedContiguousAttention addresses it by a multiply) and at the same time a
/// block table the paged GPU kernels read as they are: one set of kernels serves both engines. A fork's
/// slot copy is one block copy per block the parent has written. There is no prefix cache: allocate
/// always returns 0 cached tokens.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/kv_stats.hpp"
#include "infer/memory/shape.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

template <Shape S>
class ContiguousAllocator {
  static_assert(S.max_batch >= 1, "ContiguousAllocator<Shape>: Shape::max_batch must be at least 1");
  static_assert(S.max_input >= 1, "ContiguousAllocator<Shape>: Shape::max_input must be at least 1 token");
  static_assert(S.max_output >= 0, "ContiguousAllocator<Shape>: Shape::max_output must not be negative");
  static_assert(S.capacity() <= std::numeric_limits<std::int32_t>::max(),
                "ContiguousAllocator<Shape>: max_input + max_output must fit in int32");

  static constexpr auto kSlots = static_cast<std::size_t>(S.max_batch);

 public:
  static constexpr Shape shape = S;
  static constexpr KvLayout layout = KvLayout::contiguous;
  /// Tokens a sequence may hold: max_input + max_output.
  static constexpr auto capacity = static_cast<std::int32_t>(S.capacity());
  /// Tokens per block: the paged engine's default, which the GPU attention kernels are built for.
  static constexpr std::int32_t kBlockSize = 16;
  static constexpr std::int32_t blocks_per_slot = (capacity + kBlockSize - 1) / kBlockSize;

  ContiguousAllocator() : block_ids_(kSlots * blocks_per_slot) {
    for (std::size_t i = 0; i < block_ids_.size(); ++i) block_ids_[i] = static_cast<std::int32_t>(i);
  }

  /// Bytes of KV storage the engine must allocate: every slot at full capacity (rounded up to whole
  /// blocks), when one token's K and V over all layers take `kv_bytes_per_token`. InvalidArgument if
  /// that overflows size_t.
  [[nodiscard]] static std::size_t required_bytes(std::size_t kv_bytes_per_token) {
    const std::size_t tokens = kSlots * static_cast<std::size_t>(blocks_per_slot) * kBlockSize;
    if (tokens != 0 && kv_bytes_per_token > std::numeric_limits<std::size_t>::max() / tokens) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::required_bytes: ", tokens, " tokens of ",
                                        kv_bytes_per_token, " bytes overflow size_t; shrink the Shape"));
    }
    return tokens * kv_bytes_per_token;
  }

  [[nodiscard]] std::int32_t block_size() const noexcept { return kBlockSize; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept { return S.max_batch * blocks_per_slot; }
  /// Blocks of free slots (a slot is taken whole).
  [[nodiscard]] std::int32_t num_free_blocks() const noexcept { return (S.max_batch - used_count_) * blocks_per_slot; }
  [[nodiscard]] bool can_ever_fit(std::int32_t n) const noexcept { return n <= capacity; }

  /// Gives seq the lowest free slot; nullopt (nothing changed) when every slot is taken. Never finds
  /// cached tokens. InvalidArgument for an empty sequence, one that already has a slot, a prompt over
  /// max_input or a sequence over the slot capacity.
  [[nodiscard]] std::optional<std::int32_t> allocate(Sequence& seq) {
    if (seq.len() < 1) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::allocate: sequence ", seq.id,
                                        " has no tokens; a prompt needs at least one token"));
    }
    if (slot_of(seq.id)) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::allocate: sequence ", seq.id,
                                        " already holds a slot; free it before allocating it again"));
    }
    if (seq.prompt_len > S.max_input) {
      throw InvalidArgument(detail::cat("prompt has ", seq.prompt_len, " tokens; this engine's max_input is ",
                                        S.max_input, ": shorten the prompt or build with a larger Shape::max_input"));
    }
    if (seq.len() > capacity) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " has ", seq.len(),
                                        " tokens; this engine's slots hold max_input + max_output = ", capacity));
    }
    const auto slot = free_slot();
    if (!slot) return std::nullopt;
    occupy(*slot, seq.id, seq.len());
    return 0;
  }

  /// True iff n tokens fit in the slot (n <= capacity); the slot is already reserved, so nothing else
  /// can run out. InvalidArgument for a sequence without a slot.
  [[nodiscard]] bool grow(Sequence& seq, std::int32_t n) {
    const std::size_t slot = require_slot(seq.id, "grow");
    if (n < 0) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::grow: sequence ", seq.id, " asked for ", n,
                                        " tokens; a token count is never negative"));
    }
    if (n > capacity) return false;
    if (n > held_[slot]) {
      tokens_stored_ += n - held_[slot];
      held_[slot] = n;
    }
    return true;
  }

  [[nodiscard]] std::vector<BlockCopy> take_copies() { return std::exchange(copies_, {}); }

  /// child gets the lowest free slot and a queued copy of parent's slot. Forking cannot share a slot,
  /// so it needs a free one: InvalidArgument when none is left (check num_free_blocks() first), when
  /// parent has no slot or child has one.
  void fork(const Sequence& parent, Sequence& child) {
    if (parent.id == child.id) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::fork: parent and child are both sequence ", parent.id,
                                        "; give the child its own id"));
    }
    const std::size_t from = require_slot(parent.id, "fork");
    if (slot_of(child.id)) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::fork: child sequence ", child.id,
                                        " already holds a slot; fork into a new sequence"));
    }
    const auto to = free_slot();
    if (!to) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::fork: no free slot for child sequence ", child.id,
                                        "; all ", S.max_batch, " slots (Shape::max_batch) are in use"));
    }
    occupy(*to, child.id, held_[from]);
    const auto first = [](std::size_t slot) { return static_cast<std::int32_t>(slot) * blocks_per_slot; };
    for (std::int32_t b = 0; b < (held_[from] + kBlockSize - 1) / kBlockSize; ++b)
      copies_.push_back(BlockCopy{first(from) + b, first(*to) + b});
  }

  /// No prefix cache: nothing to register.
  void commit(const Sequence& /*seq*/, std::int32_t /*num_tokens*/) noexcept {}

  /// Returns seq's slot; unknown sequences are a no-op.
  void free(const Sequence& seq) noexcept {
    const auto slot = slot_of(seq.id);
    if (!slot) return;
    used_[*slot] = false;
    tokens_stored_ -= held_[*slot];
    held_[*slot] = 0;
    --used_count_;
  }

  /// The slot's blocks (consecutive ids) for a sequence that holds one, else empty.
  [[nodiscard]] std::span<const std::int32_t> block_table(const Sequence& seq) const noexcept {
    const auto slot = slot_of(seq.id);
    if (!slot) return {};
    return std::span<const std::int32_t>(block_ids_).subspan(*slot * static_cast<std::size_t>(blocks_per_slot),
                                                            static_cast<std::size_t>(blocks_per_slot));
  }

  [[nodiscard]] KvStats stats() const noexcept {
    KvStats s;
    s.block_size = kBlockSize;
    s.total_blocks = num_blocks();
    s.free_blocks = num_free_blocks();
    s.used_blocks = used_count_ * blocks_per_slot;
    s.tokens_stored = tokens_stored_;
    s.live_sequences = used_count_;
    return s;
  }

 private:
  /// Slots are few (the batch size): a linear scan beats a hash map and never allocates.
  [[nodiscard]] std::optional<std::size_t> slot_of(SeqId id) const noexcept {
    for (std::size_t i = 0; i < kSlots; ++i) {
      if (used_[i] && owner_[i] == id) return i;
    }
    return std::nullopt;
  }
  [[nodiscard]] std::optional<std::size_t> free_slot() const noexcept {
    for (std::size_t i = 0; i < kSlots; ++i) {
      if (!used_[i]) return i;
    }
    return std::nullopt;
  }
  std::size_t require_slot(SeqId id, const char* what) const {
    const auto slot = slot_of(id);
    if (!slot) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::", what, ": sequence ", id,
                                        " holds no slot; allocate it first"));
    }
    return *slot;
  }
  void occupy(std::size_t slot, SeqId id, std::int32_t tokens) noexcept {
    used_[slot] = true;
    owner_[slot] = id;
    held_[slot] = tokens;
    tokens_stored_ += tokens;
    ++used_count_;
  }

  std::vector<std::int32_t> block_ids_;  ///< block_ids_[i] == i: what block_table() views
  std::array<SeqId, kSlots> owner_{};
  std::array<bool, kSlots> used_{};
  std::array<std::int32_t, kSlots> held_{};
  std::int32_t used_count_ = 0;
  std::int64_t tokens_stored_ = 0;
  std::vector<BlockCopy> copies_;
};

static_assert(BlockAllocator<ContiguousAllocator<Shape{.max_batch = 2, .max_input = 8, .max_output = 8}>>,
              "ContiguousAllocator must satisfy infer::BlockAllocator");

}  // namespace infer
