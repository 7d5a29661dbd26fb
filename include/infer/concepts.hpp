#pragma once
/// \file
/// The four policies an `Engine` is composed of, as C++20 concepts. Each concept is a conjunction of
/// small named requirements, so a policy that misses one fails with the name of what is missing
/// (e.g. "the required expression 'a.grow(seq, n)' is invalid" under `allocator_grows`), and the
/// Engine repeats the check in a `static_assert` with a sentence saying which policy is wrong.
///
/// The contracts, in the words a policy author needs:
///
/// BlockAllocator — owns KV-cache *metadata* (which physical blocks a sequence uses; never the K/V
/// bytes, which the engine keeps in one tensor per layer). Blocks are `block_size()` tokens; the KV
/// layout (`A::layout`) says how a kernel addresses them (block table or contiguous slot).
///   allocate(seq)     a waiting sequence is admitted: blocks for all of seq.tokens, reusing cached
///                     prefix blocks; returns how many leading tokens were found cached (their K/V need
///                     not be computed), or nullopt with nothing changed when free blocks are short.
///   grow(seq, n)      make room for n tokens in total; false with nothing changed when out of blocks.
///                     Writing into a block shared with another sequence first copies it (copy-on-write;
///                     the copy is queued for take_copies()).
///   fork(parent, c)   c shares all of parent's blocks (n > 1 samples of one prompt).
///   commit(seq, n)    tokens [0, n) of seq will have K/V by the end of the step being planned (the
///                     scheduler calls it as it plans each chunk): full blocks among them become prefix-cache
///                     entries that sequences admitted later — in the same step too — reuse. The model writes
///                     every chunk's K/V before any chunk's attention reads, so a same-step hit is safe; free()
///                     forgets entries whose step never ran (a planned sequence preempted or failed).
///   free(seq)         every block of seq is released; cached prefixes stay until evicted.
///   block_table(seq)  physical block ids of seq, in token order.
///   can_ever_fit(n)   whether a sequence of n tokens fits in the whole cache.
/// Scheduler — decides each step (plan-then-apply): add() queues a sequence, schedule(alloc) admits,
///   chunks and preempts and returns a StepPlan (having reserved blocks and committed the planned tokens'
///   blocks through alloc); after the engine runs the plan and appends sampled tokens, update(plan, alloc)
///   advances the sequences; finish(seq,
///   alloc) retires a finished or aborted one; fork(parent, child, alloc) adds a sibling sample;
///   check(seq, alloc) throws InvalidArgument for a sequence this scheduler could never run.
/// AttentionKernel — computes causal attention for a chunk of query tokens of one sequence over the KV
///   view its layout implies; K/V of the chunk are already written. make_view<T>(k, v, block_table,
///   block_size, kv_heads, head_dim) builds that view for one layer.
/// Quantizer — how a linear layer's weight is stored on a backend, and the matmul that uses it.
/// The types that differ per backend (activations, matmul context, weight store) are BackendTraits<B>.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/attention/device_batch.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/core/backend.hpp"
#include "infer/memory/kv_stats.hpp"
#include "infer/quant/weight_tensor.hpp"
#include "infer/sched/sequence.hpp"
#include "infer/sched/step_plan.hpp"

namespace infer {

// ---- BlockAllocator ---------------------------------------------------------------------------------
namespace policy_detail {
template <class A>
concept allocator_describes_layout = requires(const A& a) {
  { A::layout } -> std::convertible_to<KvLayout>;
  { a.block_size() } -> std::same_as<std::int32_t>;
  { a.num_blocks() } -> std::same_as<std::int32_t>;
  { a.num_free_blocks() } -> std::same_as<std::int32_t>;
  { a.stats() } -> std::same_as<KvStats>;
};
template <class A>
concept allocator_admits = requires(A& a, const A& ca, Sequence& seq, std::int32_t n) {
  { a.allocate(seq) } -> std::same_as<std::optional<std::int32_t>>;
  { ca.can_ever_fit(n) } -> std::same_as<bool>;
};
template <class A>
concept allocator_grows = requires(A& a, Sequence& seq, std::int32_t n) {
  { a.grow(seq, n) } -> std::same_as<bool>;
  { a.take_copies() } -> std::same_as<std::vector<BlockCopy>>;
};
template <class A>
concept allocator_shares = requires(A& a, const Sequence& parent, Sequence& child) {
  { a.fork(parent, child) } -> std::same_as<void>;
};
template <class A>
concept allocator_caches_and_frees = requires(A& a, const A& ca, Sequence& seq, std::int32_t n) {
  { a.commit(seq, n) } -> std::same_as<void>;
  { a.free(seq) } -> std::same_as<void>;
  { ca.block_table(seq) } -> std::same_as<std::span<const std::int32_t>>;
};
}  // namespace policy_detail

template <class A>
concept BlockAllocator = policy_detail::allocator_describes_layout<A> && policy_detail::allocator_admits<A> &&
                         policy_detail::allocator_grows<A> && policy_detail::allocator_shares<A> &&
                         policy_detail::allocator_caches_and_frees<A>;

// ---- Scheduler ------------------------------------------------------------------------------------
namespace policy_detail {
template <class S, class A>
concept scheduler_queues = requires(S& s, const S& cs, Sequence* seq, const Sequence& cseq, A& a) {
  { s.add(seq) } -> std::same_as<void>;
  { cs.check(cseq, std::as_const(a)) } -> std::same_as<void>;
  { cs.num_waiting() } -> std::convertible_to<std::size_t>;
  { cs.num_running() } -> std::convertible_to<std::size_t>;
};
template <class S, class A>
concept scheduler_plans = requires(S& s, A& a, const StepPlan& plan) {
  { s.schedule(a) } -> std::same_as<StepPlan>;
  { s.update(plan, a) } -> std::same_as<void>;
};
template <class S, class A>
concept scheduler_retires = requires(S& s, Sequence* seq, Sequence* child, A& a) {
  { s.finish(seq, a) } -> std::same_as<void>;
  { s.fork(seq, child, a) } -> std::same_as<void>;
};
}  // namespace policy_detail

/// `S` schedules sequences whose KV blocks come from allocator `A`.
template <class S, class A>
concept Scheduler = BlockAllocator<A> && policy_detail::scheduler_queues<S, A> && policy_detail::scheduler_plans<S, A> &&
                    policy_detail::scheduler_retires<S, A>;

// ---- AttentionKernel --------------------------------------------------------------------------------
/// Shape of one attention call: GQA when num_kv_heads < num_heads (query head h reads KV head
/// h / (num_heads / num_kv_heads)).
struct AttentionShape {
  std::int32_t num_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  float scale = 1.0f;  ///< usually 1 / sqrt(head_dim)
};

template <class K>
concept attention_describes_itself = requires {
  { K::layout } -> std::convertible_to<KvLayout>;
  { K::name } -> std::convertible_to<std::string_view>;
  typename K::template view<float>;
};

/// The kernel builds its view from what every allocator gives: a block table and a block size (a
/// contiguous allocator's table is its slot's consecutive blocks).
template <class K>
concept attention_makes_views = requires(float* k, float* v, std::span<const std::int32_t> table, std::int32_t n) {
  { K::template make_view<float>(k, v, table, n, n, n) } -> std::same_as<typename K::template view<float>>;
};

/// `K` computes attention on backend `B`.
/// On the CPU, per chunk: for query rows q[count][num_heads][head_dim] at positions start..start+count-1,
/// out[i] = softmax(q[i] · K[0..start+i]ᵀ · scale) · V[0..start+i], through the view make_view gives.
/// On the GPU, per layer and step: `K::attend(cuda{}, batch)` for a whole DeviceAttentionBatch (every
/// decode and prefill chunk of the step in one or two launches), with `K::workspace_bytes(cuda{}, batch)`
/// bytes of device workspace.
template <class K, class B>
concept attention_computes =
    (std::same_as<B, cpu> &&
     requires(const AttentionShape& shape, const float* q, float* out, std::int32_t start, std::int32_t count,
              const typename K::template view<float>& kv) {
       { K::attend(cpu{}, shape, q, out, start, count, kv) } -> std::same_as<void>;
     }) ||
    (std::same_as<B, cuda> && requires(const DeviceAttentionBatch& batch) {
      { K::attend(cuda{}, batch) } -> std::same_as<void>;
      { K::workspace_bytes(cuda{}, batch) } -> std::convertible_to<std::size_t>;
    });

template <class K, class B>
concept AttentionKernel = Backend<B> && attention_describes_itself<K> && attention_makes_views<K> &&
                          KvView<typename K::template view<float>> && attention_computes<K, B>;

// ---- Quantizer --------------------------------------------------------------------------------------
/// `Q` stores linear-layer weights for backend `B` (`typename Q::template linear<B>`), built from a
/// file's tensor by `Q::template load<B>(tensor, store)` (`store`: where B keeps weights, see
/// BackendTraits), and multiplies with them: `Q::matmul(ctx, w, x, rows, y)` computes
/// y[rows][w.out()] = x[rows][w.in()] · wᵀ in B's activation type (f32 on the CPU; bf16 on the GPU,
/// accumulated in f32), `ctx` being B's matmul context (the tag on the CPU; handle, stream, scratch on the GPU).
template <class Q, class B>
concept Quantizer = Backend<B> && requires(const WeightTensor& t, typename BackendTraits<B>::weight_store& store) {
  { Q::name } -> std::convertible_to<std::string_view>;
  typename Q::template linear<B>;
  { Q::template load<B>(t, store) } -> std::same_as<typename Q::template linear<B>>;
} && requires(const typename Q::template linear<B>& w, typename BackendTraits<B>::matmul_context& ctx,
              const typename BackendTraits<B>::activation* x, std::int32_t rows,
              typename BackendTraits<B>::activation* y) {
  { w.out() } -> std::convertible_to<std::int64_t>;
  { w.in() } -> std::convertible_to<std::int64_t>;
  { Q::matmul(ctx, w, x, rows, y) } -> std::same_as<void>;
};

}  // namespace infer
