#pragma once
/// \file
/// The four policies an `Engine` is composed of, as C++20 concepts. Each concept is a conjunction of
/// small named requirements, so a policy that misses one fails with the name of what is missing
/// (e.g. "the required expression 'a.grow(seq, n)' is invalid" under `allocator_grows`). The Engine checks
/// each policy through `diagnose_*` (at the end of this file), which reports one member at a time: a
/// missing member as "no member callable as `<signature>`", a member of the wrong return type as
/// "`<signature>` returns another type" with a note naming the type it returns (a concept failure alone
/// only says which type was expected).
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
/// Quantizer — how a linear layer's weight is stored on a backend (loaded from one tensor, or by role with
///   its companion tensors), and the matmul that uses it.
/// The types that differ per backend (activations, matmul context, weight store) are BackendTraits<B>.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "infer/attention/device_batch.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/memory/kv_dtype.hpp"
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

/// An AttentionKernel that also reads an FP8 KV cache (KvCacheDtype::fp8_e4m3) on backend B: it says so with
/// `static constexpr bool reads_fp8_kv_cache = true`, and then honours DeviceAttentionBatch::kv_dtype on the
/// GPU; on the CPU it must also take `view<std::uint8_t>` (e4m3 codes and the view's k_scale / v_scale), so a
/// kernel that inherits the flag but overrides attend for f32 views only does not qualify. An engine asked
/// for an FP8 cache with a kernel that does not qualify refuses at construction, naming it.
template <class K, class B>
concept reads_fp8_kv_cache =
    requires { requires K::reads_fp8_kv_cache; } &&
    (!std::same_as<B, cpu> ||
     requires(const AttentionShape& shape, const float* q, float* out, std::int32_t n,
              const typename K::template view<std::uint8_t>& kv) { K::attend(cpu{}, shape, q, out, n, n, kv); });

/// InvalidArgument naming `who` and the kernel when a cache of `dtype` is asked of a kernel that cannot read
/// it on B (every kernel reads the default cache): the one refusal the engine and the decoders share.
template <class K, class B>
void require_kv_cache_reader(KvCacheDtype dtype, std::string_view who) {
  if constexpr (!reads_fp8_kv_cache<K, B>)
    require<InvalidArgument>(dtype != KvCacheDtype::fp8_e4m3, who, ": kv_cache_dtype fp8_e4m3 needs an attention kernel ",
                             "that reads an FP8 cache; '", K::name, "' declares no reads_fp8_kv_cache (concepts.hpp); ",
                             "use kv_cache_dtype auto");
}

// ---- Quantizer --------------------------------------------------------------------------------------
struct LinearRequest;  // quant/linear_request.hpp: a weight asked for by role, with its logical shape

namespace policy_detail {
template <class Q, class B>
concept quantizer_loads_tensor = requires(const WeightTensor& t, typename BackendTraits<B>::weight_store& store) {
  { Q::template load<B>(t, store) } -> std::same_as<typename Q::template linear<B>>;
};
}  // namespace policy_detail

/// `Q` loads a linear layer by role: `Q::template load<B>(request, store)` reads the weight and any
/// companion tensors (scales, zeros, g_idx) through the LinearRequest and checks their shapes itself.
template <class Q, class B>
concept RoleQuantizer = requires(const LinearRequest& r, typename BackendTraits<B>::weight_store& store) {
  { Q::template load<B>(r, store) } -> std::same_as<typename Q::template linear<B>>;
};

/// `Q` stores linear-layer weights for backend `B` (`typename Q::template linear<B>`), built either from a
/// file's tensor by `Q::template load<B>(tensor, store)` (the decoder checks the tensor is [out, in]
/// first) or, for layouts that need more than one tensor or are not [out, in] (packed INT4 with scales and
/// zeros, FP8 with its scales), from a LinearRequest by `Q::template load<B>(request, store)`
/// (RoleQuantizer); `store` is where B keeps weights (BackendTraits). It multiplies with them:
/// `Q::matmul(ctx, w, x, rows, y)` computes y[rows][w.out()] = x[rows][w.in()] · wᵀ in B's activation type
/// (f32 on the CPU; bf16 on the GPU, accumulated in f32), `ctx` being B's matmul context (the tag on the
/// CPU; handle, stream, scratch on the GPU).
template <class Q, class B>
concept Quantizer = Backend<B> && requires {
  { Q::name } -> std::convertible_to<std::string_view>;
  typename Q::template linear<B>;
} && (policy_detail::quantizer_loads_tensor<Q, B> || RoleQuantizer<Q, B>) &&
    requires(const typename Q::template linear<B>& w, typename BackendTraits<B>::matmul_context& ctx,
             const typename BackendTraits<B>::activation* x, std::int32_t rows,
             typename BackendTraits<B>::activation* y) {
  { w.out() } -> std::convertible_to<std::int64_t>;
  { w.in() } -> std::convertible_to<std::int64_t>;
  { Q::matmul(ctx, w, x, rows, y) } -> std::same_as<void>;
};

/// A Quantizer whose weights can also serve as the token embedding: `Q::embed(w, id, row)` writes row
/// `id` of `w` (`w.in()` values in B's activation type). The decoder then loads the embedding through Q
/// once, and a tied LM head multiplies with that same weight. Without `embed` the embedding is decoded to
/// f32 outside Q, and a tied LM head is loaded through Q a second time, so that every linear layer,
/// the LM head included, goes through the Quantizer either way.
template <class Q, class B>
concept EmbeddingQuantizer =
    Quantizer<Q, B> && requires(const typename Q::template linear<B>& w, std::int32_t id,
                                typename BackendTraits<B>::activation* row) {
      { Q::embed(w, id, row) } -> std::same_as<void>;
    };

// ---- Diagnostics ------------------------------------------------------------------------------------
namespace policy_detail {
/// Unevaluated values of any type, short enough to spell a member call (std::declval).
template <class T>
std::add_rvalue_reference_t<T> v() noexcept;
template <class>
inline constexpr bool never = false;
/// Named so a failed assertion's note reads "'returns<int, void>' evaluates to false": the type returned first.
template <class Actual, class Expected>
inline constexpr bool returns = std::is_same_v<Actual, Expected>;
template <class Actual, class Expected>
inline constexpr bool returns_convertible = std::is_convertible_v<Actual, Expected>;
}  // namespace policy_detail

// One member of a policy concept: absent (or not callable with these arguments), or of another return type.
// `expr` is the call the concept makes, spelled with policy_detail::v<T>().
#define INFER_DIAGNOSE_MEMBER(owner, concept_name, expr, check, Expected, signature)                      \
  if constexpr (!requires { expr; })                                                                    \
    static_assert(policy_detail::never<owner>, concept_name ": no member callable as `" signature "`");  \
  else                                                                                                  \
    static_assert(policy_detail::check<decltype(expr), Expected>,                                       \
                  concept_name ": `" signature "` returns another type (the note below names it)")

/// Whether `A` is a BlockAllocator, with one compile error per missing or mistyped member when it is not.
template <class A>
consteval bool diagnose_block_allocator() {
  using policy_detail::v;
  if constexpr (!BlockAllocator<A>) {
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", A::layout, returns_convertible, KvLayout,
                          "static constexpr infer::KvLayout layout");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<const A&>().block_size(), returns, std::int32_t,
                          "std::int32_t block_size() const");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<const A&>().num_blocks(), returns, std::int32_t,
                          "std::int32_t num_blocks() const");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<const A&>().num_free_blocks(), returns, std::int32_t,
                          "std::int32_t num_free_blocks() const");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<const A&>().stats(), returns, KvStats,
                          "infer::KvStats stats() const");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<A&>().allocate(v<Sequence&>()), returns,
                          std::optional<std::int32_t>, "std::optional<std::int32_t> allocate(infer::Sequence&)");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<const A&>().can_ever_fit(std::int32_t{}), returns, bool,
                          "bool can_ever_fit(std::int32_t tokens) const");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<A&>().grow(v<Sequence&>(), std::int32_t{}), returns, bool,
                          "bool grow(infer::Sequence&, std::int32_t tokens)");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<A&>().take_copies(), returns, std::vector<BlockCopy>,
                          "std::vector<infer::BlockCopy> take_copies()");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<A&>().fork(v<const Sequence&>(), v<Sequence&>()), returns,
                          void, "void fork(const infer::Sequence& parent, infer::Sequence& child)");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<A&>().commit(v<Sequence&>(), std::int32_t{}), returns, void,
                          "void commit(infer::Sequence&, std::int32_t tokens)");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<A&>().free(v<Sequence&>()), returns, void,
                          "void free(infer::Sequence&)");
    INFER_DIAGNOSE_MEMBER(A, "infer::BlockAllocator", v<const A&>().block_table(v<Sequence&>()), returns,
                          std::span<const std::int32_t>,
                          "std::span<const std::int32_t> block_table(const infer::Sequence&) const");
  }
  return BlockAllocator<A>;
}

/// Whether `S` is a Scheduler for allocator `A`, with one compile error per missing or mistyped member.
template <class S, class A>
consteval bool diagnose_scheduler() {
  using policy_detail::v;
  if constexpr (BlockAllocator<A> && !Scheduler<S, A>) {
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<S&>().add(v<Sequence*>()), returns, void,
                          "void add(infer::Sequence*)");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<const S&>().check(v<const Sequence&>(), v<const A&>()), returns,
                          void, "void check(const infer::Sequence&, const A&) const");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<const S&>().num_waiting(), returns_convertible, std::size_t,
                          "std::size_t num_waiting() const");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<const S&>().num_running(), returns_convertible, std::size_t,
                          "std::size_t num_running() const");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<S&>().schedule(v<A&>()), returns, StepPlan,
                          "infer::StepPlan schedule(A&)");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<S&>().update(v<const StepPlan&>(), v<A&>()), returns, void,
                          "void update(const infer::StepPlan&, A&)");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<S&>().finish(v<Sequence*>(), v<A&>()), returns, void,
                          "void finish(infer::Sequence*, A&)");
    INFER_DIAGNOSE_MEMBER(S, "infer::Scheduler", v<S&>().fork(v<Sequence*>(), v<Sequence*>(), v<A&>()), returns,
                          void, "void fork(infer::Sequence* parent, infer::Sequence* child, A&)");
  }
  return Scheduler<S, A>;
}

/// Whether `K` is an AttentionKernel on backend `B`, with one compile error per missing or mistyped member.
template <class K, class B>
consteval bool diagnose_attention_kernel() {
  using policy_detail::v;
  if constexpr (Backend<B> && !AttentionKernel<K, B>) {
    INFER_DIAGNOSE_MEMBER(K, "infer::AttentionKernel", K::layout, returns_convertible, KvLayout,
                          "static constexpr infer::KvLayout layout");
    INFER_DIAGNOSE_MEMBER(K, "infer::AttentionKernel", K::name, returns_convertible, std::string_view,
                          "static constexpr std::string_view name");
    if constexpr (!requires { typename K::template view<float>; }) {
      static_assert(policy_detail::never<K>,
                    "infer::AttentionKernel: no member template `template <class T> using view` (a KvView type)");
    } else {
      static_assert(KvView<typename K::template view<float>>,
                    "infer::AttentionKernel: `view<float>` is not an infer::KvView (k_at(pos, head), v_at(pos, head))");
      INFER_DIAGNOSE_MEMBER(K, "infer::AttentionKernel",
                            K::template make_view<float>(v<float*>(), v<float*>(), v<std::span<const std::int32_t>>(),
                                                         std::int32_t{}, std::int32_t{}, std::int32_t{}),
                            returns, typename K::template view<float>,
                            "template <class T> static view<T> make_view(T* k, T* v, std::span<const std::int32_t> "
                            "block_table, std::int32_t block_size, std::int32_t kv_heads, std::int32_t head_dim)");
      if constexpr (std::same_as<B, cpu>) {
        INFER_DIAGNOSE_MEMBER(K, "infer::AttentionKernel",
                              K::attend(cpu{}, v<const AttentionShape&>(), v<const float*>(), v<float*>(),
                                        std::int32_t{}, std::int32_t{}, v<const typename K::template view<float>&>()),
                              returns, void,
                              "static void attend(infer::cpu, const infer::AttentionShape&, const float* q, float* out, "
                              "std::int32_t start, std::int32_t count, const view<float>&)");
      } else {
        INFER_DIAGNOSE_MEMBER(K, "infer::AttentionKernel", K::attend(cuda{}, v<const DeviceAttentionBatch&>()),
                              returns, void, "static void attend(infer::cuda, const infer::DeviceAttentionBatch&)");
        INFER_DIAGNOSE_MEMBER(K, "infer::AttentionKernel", K::workspace_bytes(cuda{}, v<const DeviceAttentionBatch&>()),
                              returns_convertible, std::size_t,
                              "static std::size_t workspace_bytes(infer::cuda, const infer::DeviceAttentionBatch&)");
      }
    }
  }
  return AttentionKernel<K, B>;
}

/// Whether `Q` is a Quantizer on backend `B`, with one compile error per missing or mistyped member.
template <class Q, class B>
consteval bool diagnose_quantizer() {
  using policy_detail::v;
  if constexpr (Backend<B> && !Quantizer<Q, B>) {
    using T = BackendTraits<B>;
    INFER_DIAGNOSE_MEMBER(Q, "infer::Quantizer", Q::name, returns_convertible, std::string_view,
                          "static constexpr std::string_view name");
    if constexpr (!requires { typename Q::template linear<B>; }) {
      static_assert(policy_detail::never<Q>,
                    "infer::Quantizer: no member template `template <class B> using linear` (a weight on backend B)");
    } else {
      using L = typename Q::template linear<B>;
      if constexpr (requires { Q::template load<B>(v<const LinearRequest&>(), v<typename T::weight_store&>()); })
        INFER_DIAGNOSE_MEMBER(Q, "infer::Quantizer",
                              Q::template load<B>(v<const LinearRequest&>(), v<typename T::weight_store&>()), returns,
                              L, "template <class B> static linear<B> load(const infer::LinearRequest&, "
                              "BackendTraits<B>::weight_store&)");
      else
        INFER_DIAGNOSE_MEMBER(Q, "infer::Quantizer",
                              Q::template load<B>(v<const WeightTensor&>(), v<typename T::weight_store&>()), returns,
                              L, "template <class B> static linear<B> load(const infer::WeightTensor&, "
                              "BackendTraits<B>::weight_store&) (or load(const infer::LinearRequest&, ...))");
      INFER_DIAGNOSE_MEMBER(Q, "infer::Quantizer", v<const L&>().out(), returns_convertible, std::int64_t,
                            "std::int64_t linear<B>::out() const");
      INFER_DIAGNOSE_MEMBER(Q, "infer::Quantizer", v<const L&>().in(), returns_convertible, std::int64_t,
                            "std::int64_t linear<B>::in() const");
      INFER_DIAGNOSE_MEMBER(Q, "infer::Quantizer",
                            Q::matmul(v<typename T::matmul_context&>(), v<const L&>(),
                                      v<const typename T::activation*>(), std::int32_t{},
                                      v<typename T::activation*>()),
                            returns, void,
                            "static void matmul(BackendTraits<B>::matmul_context&, const linear<B>&, const activation* "
                            "x, std::int32_t rows, activation* y)");
    }
  }
  return Quantizer<Q, B>;
}

#undef INFER_DIAGNOSE_MEMBER

}  // namespace infer
