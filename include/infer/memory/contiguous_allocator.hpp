#pragma once
/// \file
/// `ContiguousAllocator<Shape>`: the static engine's BlockAllocator. The KV cache is `max_batch` fixed
/// slots of `max_input + max_output` tokens, one per resident sequence, sized once from the Shape (a
/// template argument, or with `kShapeAtRuntime` the value given to the constructor): no block tables to
/// walk, no fragmentation to manage, and every kernel shape is known when the step's CUDA graphs are
/// captured. The price is memory: a slot is reserved for the longest possible sequence, and the waste is
/// what stats() reports.
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
  static constexpr bool kAtRuntime = S == kShapeAtRuntime;
  static_assert(kAtRuntime || S.max_batch >= 1, "ContiguousAllocator<Shape>: Shape::max_batch must be at least 1");
  static_assert(kAtRuntime || S.max_input >= 1, "ContiguousAllocator<Shape>: Shape::max_input must be at least 1 token");
  static_assert(S.max_output >= 0, "ContiguousAllocator<Shape>: Shape::max_output must not be negative");
  static_assert(S.capacity() <= std::numeric_limits<std::int32_t>::max(),
                "ContiguousAllocator<Shape>: max_input + max_output must fit in int32");

 public:
  static constexpr KvLayout layout = KvLayout::contiguous;
  /// Tokens per block: the paged engine's default, which the GPU attention kernels are built for.
  static constexpr std::int32_t kBlockSize = 16;
  /// Whether the shape is given to the constructor (`ContiguousAllocator<kShapeAtRuntime>`).
  static constexpr bool shape_at_runtime = kAtRuntime;

  /// The build-time shape's allocator.
  ContiguousAllocator()
    requires(!kAtRuntime)
      : ContiguousAllocator(S, 0) {}
  /// The allocator of `shape`, given at run time. InvalidArgument naming the field that is out of range.
  explicit ContiguousAllocator(Shape shape)
    requires(kAtRuntime)
      : ContiguousAllocator((validate(shape), shape), 0) {}

  /// The shape this allocator's slots are built for.
  [[nodiscard]] Shape shape() const noexcept { return shape_; }
  /// Tokens a sequence may hold: max_input + max_output.
  [[nodiscard]] std::int32_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int32_t blocks_per_slot() const noexcept { return blocks_per_slot_; }

  /// InvalidArgument naming the first field of `shape` that no engine can be built for.
  static void validate(const Shape& shape) {
    using detail::cat;
    if (shape.max_batch < 1)
      throw InvalidArgument(cat("static shape: max_batch is ", shape.max_batch, "; it must be at least 1 slot"));
    if (shape.max_input < 1)
      throw InvalidArgument(cat("static shape: max_input is ", shape.max_input, "; it must be at least 1 token"));
    if (shape.max_output < 0)
      throw InvalidArgument(cat("static shape: max_output is ", shape.max_output, "; it must not be negative"));
    if (shape.capacity() > std::numeric_limits<std::int32_t>::max() - kBlockSize)
      throw InvalidArgument(cat("static shape: max_input + max_output = ", shape.capacity(), " tokens is too large"));
  }

  /// Bytes of KV storage the engine must allocate: every slot at full capacity (rounded up to whole
  /// blocks), when one token's K and V over all layers take `kv_bytes_per_token`. InvalidArgument if
  /// that overflows size_t.
  [[nodiscard]] std::size_t required_bytes(std::size_t kv_bytes_per_token) const {
    const std::size_t tokens = slots() * static_cast<std::size_t>(blocks_per_slot_) * kBlockSize;
    if (tokens != 0 && kv_bytes_per_token > std::numeric_limits<std::size_t>::max() / tokens) {
      throw InvalidArgument(detail::cat("ContiguousAllocator::required_bytes: ", tokens, " tokens of ",
                                        kv_bytes_per_token, " bytes overflow size_t; shrink the Shape"));
    }
    return tokens * kv_bytes_per_token;
  }

  [[nodiscard]] std::int32_t block_size() const noexcept { return kBlockSize; }
  [[nodiscard]] std::int32_t num_blocks() const noexcept { return shape_.max_batch * blocks_per_slot_; }
  /// Blocks of free slots (a slot is taken whole).
  [[nodiscard]] std::int32_t num_free_blocks() const noexcept {
    return (shape_.max_batch - used_count_) * blocks_per_slot_;
  }
  [[nodiscard]] bool can_ever_fit(std::int32_t n) const noexcept { return n <= capacity_; }

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
    if (seq.prompt_len > shape_.max_input) {
      throw InvalidArgument(detail::cat("prompt has ", seq.prompt_len, " tokens; this engine's max_input is ",
                                        shape_.max_input, ": shorten the prompt or build with a larger Shape::max_input"));
    }
    if (seq.len() > capacity_) {
      throw InvalidArgument(detail::cat("sequence ", seq.id, " has ", seq.len(),
                                        " tokens; this engine's slots hold max_input + max_output = ", capacity_));
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
    if (n > capacity_) return false;
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
                                        "; all ", shape_.max_batch, " slots (Shape::max_batch) are in use"));
    }
    occupy(*to, child.id, held_[from]);
    const auto first = [this](std::size_t slot) { return static_cast<std::int32_t>(slot) * blocks_per_slot_; };
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
    return std::span<const std::int32_t>(block_ids_).subspan(*slot * static_cast<std::size_t>(blocks_per_slot_),
                                                            static_cast<std::size_t>(blocks_per_slot_));
  }

  [[nodiscard]] KvStats stats() const noexcept {
    KvStats s;
    s.block_size = kBlockSize;
    s.total_blocks = num_blocks();
    s.free_blocks = num_free_blocks();
    s.used_blocks = used_count_ * blocks_per_slot_;
    s.tokens_stored = tokens_stored_;
    s.live_sequences = used_count_;
    return s;
  }

 private:
  ContiguousAllocator(Shape shape, int /*validated*/)
      : shape_(shape),
        capacity_(static_cast<std::int32_t>(shape.capacity())),
        blocks_per_slot_((capacity_ + kBlockSize - 1) / kBlockSize),
        block_ids_(static_cast<std::size_t>(shape.max_batch) * static_cast<std::size_t>(blocks_per_slot_)),
        owner_(slots()),
        used_(slots(), false),
        held_(slots(), 0) {
    for (std::size_t i = 0; i < block_ids_.size(); ++i) block_ids_[i] = static_cast<std::int32_t>(i);
  }

  [[nodiscard]] std::size_t slots() const noexcept { return static_cast<std::size_t>(shape_.max_batch); }

  /// Slots are few (the batch size): a linear scan beats a hash map and never allocates.
  [[nodiscard]] std::optional<std::size_t> slot_of(SeqId id) const noexcept {
    for (std::size_t i = 0; i < slots(); ++i) {
      if (used_[i] && owner_[i] == id) return i;
    }
    return std::nullopt;
  }
  [[nodiscard]] std::optional<std::size_t> free_slot() const noexcept {
    for (std::size_t i = 0; i < slots(); ++i) {
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

  Shape shape_;
  std::int32_t capacity_;
  std::int32_t blocks_per_slot_;
  std::vector<std::int32_t> block_ids_;  ///< block_ids_[i] == i: what block_table() views
  std::vector<SeqId> owner_;
  std::vector<bool> used_;
  std::vector<std::int32_t> held_;
  std::int32_t used_count_ = 0;
  std::int64_t tokens_stored_ = 0;
  std::vector<BlockCopy> copies_;
};

static_assert(BlockAllocator<ContiguousAllocator<Shape{.max_batch = 2, .max_input = 8, .max_output = 8}>>,
              "ContiguousAllocator must satisfy infer::BlockAllocator");
static_assert(BlockAllocator<ContiguousAllocator<kShapeAtRuntime>>,
              "ContiguousAllocator<kShapeAtRuntime> must satisfy infer::BlockAllocator");

}  // namespace infer
