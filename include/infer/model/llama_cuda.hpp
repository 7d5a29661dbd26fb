#pragma once
/// \file
/// `LlamaModel<cuda, Q, Attn>`: the Llama-family decoder on the GPU — the same step as the CPU decoder
/// (every chunk's tokens stacked into one [T][hidden] activation, one GEMM per projection over all T rows,
/// attention per step through the Attn policy), in bf16 with f32 accumulation and an f32 residual stream.
/// Per layer:
///   (+x) RMSNorm → qkv GEMM (+ bias) → RoPE + K/V write into the paged cache → attention (decode rows by
///   flash-decoding, prefill chunks by the causal kernel) → o GEMM → +x RMSNorm → gate_up GEMM →
///   SwiGLU → down GEMM, each residual add fused into the norm after it, and SwiGLU into the gate_up
///   GEMV where the Quantizer offers it (bf16 weights at batch 1)
/// then the final norm on the sampled rows and the LM head (bf16 weights, f32 logits).
///
/// Host work per step is one packing of the step's metadata (ids, positions, cache slots, block tables,
/// lengths) into pinned memory and one copy of it; no allocation and no synchronization until the
/// results are read. Decode-only steps replay a CUDA graph captured at `prepare()` for the next larger
/// batch bucket (up to 256) or for max_num_seqs when that pads at most an eighth of it (padding rows write
/// nothing and attend to nothing); other steps run eagerly. q/k/v and gate/up are each stored stacked (one weight) when the Quantizer can
/// (`load_stacked`), else run as separate GEMMs copied into place.
///
/// Weights live in one arena sized by a measuring pass over the same loading code. Not thread-safe.

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "infer/attention/device_batch.hpp"
#include "infer/backend/cuda_runtime.hpp"
#include "infer/backend/weight_store.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/engine/engine_options.hpp"
#include "infer/sched/step_plan.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/kernels/cuda/sampling.hpp"
#include "infer/model/forward_batch.hpp"
#include "infer/model/forward_check.hpp"
#include "infer/model/kv_cache.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"
#include "infer/sampling/device_sampler.hpp"

namespace infer {

template <class B, class Q, class Attn>
class LlamaModel;

/// Wall-clock seconds of the loading phases (cold-start figures of infer-bench-latency).
struct ModelLoadTimes {
  double weights_s = 0;  ///< measuring pass + arena + copies/decodes/fills, until the device is done
  double graphs_s = 0;   ///< capturing and instantiating the decode graphs (prepare)
  std::size_t weight_bytes = 0;
  std::size_t graphs = 0;
};

template <class Q, class Attn>
  requires Quantizer<Q, cuda> && AttentionKernel<Attn, cuda>
class LlamaModel<cuda, Q, Attn> {
  using linear = typename Q::template linear<cuda>;
  using bf16 = std::uint16_t;
  using Graph = backend::cuda::Graph;

  /// A projection of several stacked outputs (qkv, gate_up): one weight when Q can stack them, else the
  /// parts, whose outputs are copied side by side.
  struct Projection {
    std::vector<linear> parts;
    std::int64_t out = 0;
  };
  struct Layer {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* qkv_bias = nullptr;  ///< [q_size + 2 kv_size], Qwen2 only
    Projection qkv, gate_up;
    linear o, down;
  };

 public:
  /// Loads every weight into one device arena. Errors as ModelSource / the Quantizer, naming the tensor;
  /// DeviceError when the device cannot hold the weights.
  static LlamaModel load(const ModelSource& src) { return LlamaModel(src); }

  LlamaModel(LlamaModel&&) noexcept = default;
  LlamaModel& operator=(LlamaModel&&) noexcept = default;

  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  [[nodiscard]] const ModelLoadTimes& load_times() const noexcept { return times_; }

  /// KV-cache bytes one token occupies across all layers (K and V, bf16).
  [[nodiscard]] std::size_t kv_bytes_per_token() const noexcept {
    return KvCache<cuda>::bytes_per_token(config_.num_layers, config_.num_kv_heads, config_.head_dim);
  }

  /// Allocates the activations of the largest step the scheduler plans (its StepBounds: tokens and
  /// sequences), before the KV pool takes what is left: vLLM's order. A step within the bounds never
  /// regrows them, so the graphs captured in prepare() stay valid.
  void reserve(const StepBounds& bounds) { grow(bounds.max_tokens, bounds.max_sequences, 1); }

  /// The KV budget when none is given: gpu_memory_utilization of the device minus what is in use now
  /// (weights, activations, workspaces), as vLLM sizes its pool.
  [[nodiscard]] std::size_t default_kv_cache_bytes(const EngineOptions& o) const {
    const auto m = backend::cuda::memory_info();
    return backend::cuda::kv_pool_bytes(o.gpu_memory_utilization, m.total - m.free, m.total);
  }

  /// Called once the cache exists: sizes the block tables for `max_model_len`, the decode workspace for
  /// every batch size, and captures the decode graphs (unless `cuda_graphs` is false).
  void prepare(KvCache<cuda>& cache, std::int32_t max_model_len, bool cuda_graphs) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::int32_t width = (max_model_len + cache.block_size() - 1) / cache.block_size();
    grow(cap_tokens_, cap_seqs_, width);
    graphs_.clear();
    graph_sizes_.clear();
    for (std::int32_t b : kBuckets) {
      if (b > cap_seqs_ || b > cap_tokens_) break;
      graph_sizes_.push_back(b);
    }
    // The largest bucket may fall short of max_num_seqs: capture it exactly too.
    if (cap_seqs_ <= cap_tokens_ && (graph_sizes_.empty() || graph_sizes_.back() != cap_seqs_))
      graph_sizes_.push_back(cap_seqs_);
    prepared_cache_ = &cache;
    if (cuda_graphs) {
      // Largest first: each capture's warm-up step is where the GEMMs of its M are tuned (GemmTuning::
      // measured, once per power-of-two bucket of M), so a bucket is tuned at its largest captured size.
      for (auto it = graph_sizes_.rbegin(); it != graph_sizes_.rend(); ++it) capture(cache, *it);
    }
    // Eager decode steps past the last bucket: tune their GEMM buckets now, not during the first
    // requests (a padded warm-up step at each power of two; max_num_seqs' capture warmed its own size).
    for (std::int32_t b = 2 * kBuckets.back();
         b <= cap_seqs_ && b <= cap_tokens_ && b <= kernels::cuda::Gemm::kTunedMaxRows; b *= 2)
      if (!graphs_.contains(b)) warm_up(cache, b);
    stream_.synchronize();
    times_.graphs = graphs_.size();
    times_.graphs_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// Computes every chunk, writes their K/V into `cache`, and fills `logits` (host, f32) with
  /// [chunks with samples][vocab] rows in chunk order. Errors as the CPU decoder's (validate_step).
  void forward(std::span<const ForwardChunk> chunks, KvCache<cuda>& cache, std::vector<float>& logits) {
    const std::int32_t rows = run(chunks, cache);
    const auto V = static_cast<std::size_t>(config_.vocab_size);
    logits.resize(static_cast<std::size_t>(rows) * V);
    if (rows == 0) return;
    backend::cuda::check(cudaMemcpyAsync(logits.data(), logits_.data(), logits.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream()),
                         "LlamaModel<cuda>: copying logits to the host");
    stream_.synchronize();
  }

  /// As forward(), but each sampled row's argmax (lowest id on ties) is taken on the GPU and only the
  /// ids come back: what greedy requests without penalties or logprobs need.
  void forward_greedy(std::span<const ForwardChunk> chunks, KvCache<cuda>& cache, std::vector<std::int32_t>& tokens) {
    const std::int32_t rows = run(chunks, cache);
    tokens.resize(static_cast<std::size_t>(rows));
    if (rows == 0) return;
    kernels::cuda::argmax_rows(logits_.as<float>(), rows, static_cast<int>(config_.vocab_size), ids_.as<std::int32_t>(),
                               nullptr, stream_.handle());
    backend::cuda::check(cudaMemcpyAsync(tokens.data(), ids_.data(), tokens.size() * sizeof(std::int32_t),
                                         cudaMemcpyDeviceToHost, stream()),
                         "LlamaModel<cuda>: copying sampled ids to the host");
    stream_.synchronize();
  }

  /// As forward(), but each sampled row draws its token on the GPU (`DeviceSampler`: the CPU Sampler's
  /// pipeline of bans, penalties, temperature, top-k/p, min-p and the seeded draw) and only the ids come
  /// back, with the sampled token's raw logprob for rows that ask for logprobs. `rows` are the sampled
  /// rows in chunk order; each non-greedy row takes its one draw from its rng here, after the step is
  /// enqueued (the host stages the rows while the GPU computes). A row whose logits are not finite gets
  /// token -1. Errors as forward().
  void forward_sample(std::span<const ForwardChunk> chunks, KvCache<cuda>& cache, std::span<const SampleRow> rows,
                      std::optional<std::int32_t> eos_id, std::vector<SampleResult>& out) {
    const std::int32_t n = run(chunks, cache);
    require<InvalidArgument>(static_cast<std::size_t>(n) == rows.size(), "LlamaModel<cuda>::forward_sample: ",
                             rows.size(), " sample rows for a step that samples ", n);
    sampler_.sample(logits_.as<float>(), rows, eos_id, out, stream());
    device_sampled_rows_ += n;
  }

  /// Measures each step's device time with events (for infer-bench-latency: device time against the
  /// step's wall time shows the host's share). Off by default: the events cost a little per step.
  void set_step_timing(bool on) {
    step_timer_ = on ? std::make_unique<backend::cuda::EventTimer>() : nullptr;
    timed_ = false;
  }
  /// Milliseconds the device spent on the last step, from the metadata copy to its last kernel; -1 when
  /// timing is off or no step ran since it was turned on.
  [[nodiscard]] double last_step_device_ms() const {
    return step_timer_ && timed_ ? static_cast<double>(step_timer_->elapsed_ms()) : -1.0;
  }

  /// With eager padding, a decode step that would replay a graph but has none (enforce_eager) runs eagerly
  /// at the graph's shape: its batch padded to the bucket, block tables at full width. The same kernels on
  /// the same shapes then compute the same bits as the replay would, which is how the tests check the
  /// graphs bit for bit. Off by default: padding costs an eager step time for nothing.
  void set_eager_padding(bool on) noexcept { eager_padding_ = on; }

  [[nodiscard]] std::size_t weight_bytes() const noexcept { return times_.weight_bytes; }
  [[nodiscard]] std::size_t num_graphs() const noexcept { return graphs_.size(); }
  /// Steps run by graph replay / eagerly so far.
  [[nodiscard]] std::int64_t graph_steps() const noexcept { return graph_steps_; }
  [[nodiscard]] std::int64_t eager_steps() const noexcept { return eager_steps_; }
  /// Rows whose token forward_sample() drew on the device so far.
  [[nodiscard]] std::int64_t device_sampled_rows() const noexcept { return device_sampled_rows_; }

 private:
  /// Decode batch sizes with a captured graph (a step of n sequences replays the smallest bucket >= n),
  /// and max_num_seqs itself. Small steps are bound by reading the weights, so a few padding rows cost
  /// nothing; past the last bucket a step is compute-bound and replays max_num_seqs' graph only when
  /// the padding is at most kMaxPaddingShare of it (else it runs eagerly at its own size).
  static constexpr std::array<std::int32_t, 16> kBuckets{1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  static constexpr std::int32_t kMaxPaddingShare = 8;  ///< 1/8

  explicit LlamaModel(const ModelSource& src) : config_(src.config()) {
    const auto t0 = std::chrono::steady_clock::now();
    // The attention kernels are built for these widths; refuse before any weight reaches the device.
    if (config_.head_dim != 64 && config_.head_dim != 128)
      throw UnsupportedError(detail::cat(src.describe(), ": head_dim ", config_.head_dim,
                                         " is not supported by the CUDA attention kernels (64 or 128); use the CPU backend"));
    CudaWeightStore measuring;
    load_weights(src, measuring);  // sizes only
    CudaWeightStore store(measuring.measured_bytes(), stream_.handle());
    load_weights(src, store);
    store.finish();
    arena_ = store.release_arena();
    std::vector<float> inv = rope_inv_freq(config_);
    inv_freq_ = backend::cuda::DeviceBuffer(inv.size() * sizeof(float));
    inv_freq_.upload(std::span<const float>(inv));
    times_.weight_bytes = arena_.used();
    times_.weights_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // ---- loading ---------------------------------------------------------------------------------------
  static constexpr bool kStacks = requires(std::span<const WeightTensor> parts, CudaWeightStore& s) {
    { Q::template load_stacked<cuda>(parts, s) } -> std::same_as<linear>;
  };

  static void check_shape(const ModelSource& src, const WeightTensor& t, std::int64_t out, std::int64_t in) {
    const bool ok = in == 0 ? (t.shape.size() == 1 && t.shape[0] == static_cast<std::uint64_t>(out))
                            : (t.shape.size() == 2 && t.shape[0] == static_cast<std::uint64_t>(out) &&
                               t.shape[1] == static_cast<std::uint64_t>(in));
    if (!ok)
      throw FormatError(detail::cat(src.describe(), ": tensor '", t.name, "' has shape ", shape_text(t.shape),
                                    ", expected ", in == 0 ? detail::cat("[", out, "]") : detail::cat("[", out, ", ", in, "]"),
                                    " from the model config"));
  }
  static std::string shape_text(const std::vector<std::uint64_t>& s) {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }

  Projection load_projection(const ModelSource& src, std::span<const WeightTensor> parts, CudaWeightStore& store) {
    Projection p;
    for (const auto& t : parts) p.out += static_cast<std::int64_t>(t.shape[0]);
    if constexpr (kStacks) {
      p.parts.push_back(Q::template load_stacked<cuda>(parts, store));
    } else {
      for (const auto& t : parts) p.parts.push_back(Q::template load<cuda>(t, store));
      split_out_ = std::max(split_out_, p.out);
    }
    for (const auto& w : p.parts) note_scratch(w);
    (void)src;
    return p;
  }
  linear load_linear(const ModelSource& src, const WeightTensor& t, std::int64_t out, std::int64_t in,
                     CudaWeightStore& store) {
    check_shape(src, t, out, in);
    linear w = Q::template load<cuda>(t, store);
    note_scratch(w);
    return w;
  }
  void note_scratch(const linear& w) {
    if constexpr (requires { w.scratch_elems(); }) scratch_elems_ = std::max(scratch_elems_, w.scratch_elems());
  }
  /// A bf16 [rows][cols] matrix (embedding, LM head) — always bf16: a gather reads rows, and the LM
  /// head's f32 logits need the bf16 GEMM with f32 output.
  const bf16* load_bf16_matrix(const ModelSource& src, const WeightTensor& t, std::int64_t rows, std::int64_t cols,
                               CudaWeightStore& store) {
    check_shape(src, t, rows, cols);
    auto* p = static_cast<bf16*>(store.allocate(static_cast<std::size_t>(rows * cols) * sizeof(bf16)));
    if (p) store.store_bf16(p, t);
    return p;
  }
  const float* load_f32_vectors(const ModelSource& src, std::span<const WeightTensor> parts,
                                std::span<const std::int64_t> sizes, CudaWeightStore& store) {
    std::int64_t total = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      check_shape(src, parts[i], sizes[i], 0);
      total += sizes[i];
    }
    auto* p = static_cast<float*>(store.allocate(static_cast<std::size_t>(total) * sizeof(float)));
    float* at = p;
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (p) {
        store.store_f32(at, parts[i]);
        at += sizes[i];
      }
    return p;
  }

  void load_weights(const ModelSource& src, CudaWeightStore& store) {
    using detail::cat;
    const ModelConfig& c = config_;
    const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, qs = c.q_size(), kvs = c.kv_size();
    split_out_ = 0;
    scratch_elems_ = 0;
    layers_.clear();
    const WeightTensor embd = src.get("token_embd");
    embedding_ = load_bf16_matrix(src, embd, V, H, store);
    lm_head_ = c.tie_word_embeddings ? embedding_ : load_bf16_matrix(src, src.get("output"), V, H, store);
    {
      const WeightTensor n = src.get("output_norm");
      const std::array<std::int64_t, 1> sz{H};
      output_norm_ = load_f32_vectors(src, std::span(&n, 1), sz, store);
    }
    layers_.reserve(static_cast<std::size_t>(c.num_layers));
    for (std::int64_t i = 0; i < c.num_layers; ++i) {
      const auto role = [&](const char* name) { return cat("blk.", i, ".", name); };
      Layer L;
      const std::array<std::int64_t, 1> hsz{H};
      const WeightTensor an = src.get(role("attn_norm")), fn = src.get(role("ffn_norm"));
      L.attn_norm = load_f32_vectors(src, std::span(&an, 1), hsz, store);
      L.ffn_norm = load_f32_vectors(src, std::span(&fn, 1), hsz, store);
      const std::array<WeightTensor, 3> qkv{src.get(role("attn_q")), src.get(role("attn_k")), src.get(role("attn_v"))};
      check_shape(src, qkv[0], qs, H);
      check_shape(src, qkv[1], kvs, H);
      check_shape(src, qkv[2], kvs, H);
      L.qkv = load_projection(src, qkv, store);
      if (c.attention_bias) {
        const std::array<WeightTensor, 3> b{src.get(role("attn_q.bias")), src.get(role("attn_k.bias")),
                                            src.get(role("attn_v.bias"))};
        const std::array<std::int64_t, 3> sz{qs, kvs, kvs};
        L.qkv_bias = load_f32_vectors(src, b, sz, store);
      }
      L.o = load_linear(src, src.get(role("attn_output")), H, qs, store);
      const std::array<WeightTensor, 2> gu{src.get(role("ffn_gate")), src.get(role("ffn_up"))};
      check_shape(src, gu[0], I, H);
      check_shape(src, gu[1], I, H);
      L.gate_up = load_projection(src, gu, store);
      L.down = load_linear(src, src.get(role("ffn_down")), H, I, store);
      layers_.push_back(std::move(L));
    }
  }

  // ---- buffers ---------------------------------------------------------------------------------------
  /// Where the step's metadata lies in the pinned staging buffer and in its device copy: one layout
  /// for a step of T tokens, C chunks (tables of `width` entries) and S sampled rows.
  struct MetaLayout {
    std::size_t ids = 0, pos = 0, slots = 0, tables = 0, lens = 0, indptr = 0, starts = 0, samples = 0, bytes = 0;
    MetaLayout(std::int64_t T, std::int64_t C, std::int64_t width, std::int64_t S) {
      std::size_t at = 0;
      auto take = [&](std::size_t n, std::size_t elem) {
        at = (at + 7) / 8 * 8;
        const std::size_t r = at;
        at += n * elem;
        return r;
      };
      slots = take(static_cast<std::size_t>(T), 8);
      ids = take(static_cast<std::size_t>(T), 4);
      pos = take(static_cast<std::size_t>(T), 4);
      tables = take(static_cast<std::size_t>(C * width), 4);
      lens = take(static_cast<std::size_t>(C), 4);
      indptr = take(static_cast<std::size_t>(C + 1), 4);
      starts = take(static_cast<std::size_t>(C), 4);
      samples = take(static_cast<std::size_t>(S), 4);
      bytes = at;
    }
  };

  /// Grows every step buffer to hold T tokens, S sequences and tables of `width` (never shrinks).
  /// Growing drops the captured graphs (they point at the old buffers).
  void grow(std::int32_t T, std::int32_t S, std::int32_t width) {
    T = std::max(T, cap_tokens_);
    S = std::max(S, cap_seqs_);
    width = std::max(width, cap_width_);
    if (T == cap_tokens_ && S == cap_seqs_ && width == cap_width_) return;
    graphs_.clear();
    const ModelConfig& c = config_;
    const auto n = [&](std::int64_t rows, std::int64_t cols, std::size_t elem) {
      return static_cast<std::size_t>(rows * cols) * elem;
    };
    const std::int64_t H = c.hidden_size, qkv = c.q_size() + 2 * c.kv_size(), I = c.intermediate_size;
    x_ = backend::cuda::DeviceBuffer(n(T, H, 4));
    xn_ = backend::cuda::DeviceBuffer(n(T, H, 2));
    qkv_ = backend::cuda::DeviceBuffer(n(T, qkv, 2));
    q_ = backend::cuda::DeviceBuffer(n(T, c.q_size(), 2));
    att_ = backend::cuda::DeviceBuffer(n(T, c.q_size(), 2));
    o_ = backend::cuda::DeviceBuffer(n(T, H, 2));
    gu_ = backend::cuda::DeviceBuffer(n(T, 2 * I, 2));
    act_ = backend::cuda::DeviceBuffer(n(T, I, 2));
    if (split_out_ > 0) split_ = backend::cuda::DeviceBuffer(n(T, split_out_, 2));
    last_ = backend::cuda::DeviceBuffer(n(S, H, 4));
    lastn_ = backend::cuda::DeviceBuffer(n(S, H, 2));
    logits_ = backend::cuda::DeviceBuffer(n(S, c.vocab_size, 4));
    ids_ = backend::cuda::DeviceBuffer(n(S, 1, 4));
    sampler_.reserve(S, static_cast<int>(c.vocab_size));
    if (T > kernels::cuda::kGemvMaxRows && scratch_elems_ > 0 && scratch_.size() < scratch_elems_ * 2)
      scratch_ = backend::cuda::DeviceBuffer(scratch_elems_ * 2);
    const MetaLayout m(T, S, width, S);
    meta_ = backend::cuda::DeviceBuffer(m.bytes);
    pinned_ = backend::cuda::PinnedBuffer(m.bytes);
    // The decode kernel's split count grows as the batch shrinks: size for the worst batch size.
    std::size_t ws = 0;
    DeviceAttentionBatch probe = attention_batch(0, nullptr, width);
    for (std::int32_t s = 1; s <= S; ++s) {
      probe.num_decode = s;
      ws = std::max(ws, Attn::workspace_bytes(cuda{}, probe));
    }
    workspace_ = backend::cuda::DeviceBuffer(ws);
    cap_tokens_ = T;
    cap_seqs_ = S;
    cap_width_ = width;
  }

  /// The parts of a DeviceAttentionBatch that do not depend on the step.
  DeviceAttentionBatch attention_batch(std::int32_t layer, const KvCache<cuda>* cache, std::int32_t width) const {
    DeviceAttentionBatch b;
    if (cache) {
      b.k = cache->k(layer);
      b.v = cache->v(layer);
      b.block_size = cache->block_size();
    } else {
      b.block_size = 16;
    }
    b.num_heads = static_cast<std::int32_t>(config_.num_heads);
    b.num_kv_heads = static_cast<std::int32_t>(config_.num_kv_heads);
    b.head_dim = static_cast<std::int32_t>(config_.head_dim);
    b.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config_.head_dim)));
    b.table_width = width;
    b.workspace = workspace_.as<float>();
    b.workspace_bytes = workspace_.size();
    b.stream = stream_.handle();
    return b;
  }

  // ---- one step --------------------------------------------------------------------------------------
  /// The shape of a step as the kernels see it.
  struct StepShape {
    std::int32_t T = 0, C = 0, S = 0, width = 0, num_decode = 0, prefill_rows = 0;
    bool identity_samples = false;  ///< every row samples (rows == sampled rows): no gather
  };

  /// Validates, packs the metadata, runs the step (graph or eager); returns the number of logits rows.
  std::int32_t run(std::span<const ForwardChunk> chunks, KvCache<cuda>& cache) {
    const std::int64_t total = validate_step(config_, chunks, cache);
    if (chunks.empty()) return 0;
    const auto bs = cache.block_size();
    StepShape sh;
    sh.T = static_cast<std::int32_t>(total);
    sh.C = static_cast<std::int32_t>(chunks.size());
    bool decode_only = true, all_sample = true;
    std::int32_t width = 1;
    for (const auto& c : chunks) {
      const auto n = static_cast<std::int32_t>(c.tokens.size());
      if (n == 1 && decode_only) sh.num_decode++;
      else decode_only = false;
      if (c.samples) sh.S++;
      else all_sample = false;
      width = std::max(width, (c.start + n + bs - 1) / bs);
    }
    sh.prefill_rows = sh.T - sh.num_decode;
    // A graph serves a decode-only step whose every row samples, padded to its bucket; with eager padding
    // on and no graph, the same padded step runs eagerly.
    const Graph* graph = nullptr;
    const std::int32_t bucket =
        decode_only && all_sample && prepared_cache_ == &cache && width <= cap_width_ ? graph_bucket(sh.T) : 0;
    if (bucket > 0) {
      const auto it = graphs_.find(bucket);
      if (it != graphs_.end()) graph = &it->second;
    }
    const bool padded = graph != nullptr || (bucket > 0 && eager_padding_);
    if (padded) {
      sh.T = sh.C = sh.S = sh.num_decode = bucket;
      sh.width = cap_width_;
      sh.identity_samples = true;
    } else {
      sh.width = width;
      sh.identity_samples = sh.S == sh.T;
      grow(sh.T, std::max(sh.C, sh.S), width);
    }
    const MetaLayout m = pack(chunks, sh, bs);
    if (step_timer_) step_timer_->start(stream_.handle());
    backend::cuda::check(cudaMemcpyAsync(meta_.data(), pinned_.data(), m.bytes, cudaMemcpyHostToDevice, stream()),
                         "LlamaModel<cuda>: copying the step's metadata");
    if (graph) {
      graph->launch(stream_.handle());
      graph_steps_++;
    } else {
      compute(cache, sh, m);
      eager_steps_++;
    }
    if (step_timer_) {
      step_timer_->stop(stream_.handle());
      timed_ = true;
    }
    return padded ? static_cast<std::int32_t>(chunks.size()) : sh.S;  // padding rows' logits are not read
  }

  /// The captured batch size a decode step of `n` rows takes (the smallest one >= n, past the last bucket only
  /// when padding is at most 1/kMaxPaddingShare of it), or 0 when it runs at its own size.
  [[nodiscard]] std::int32_t graph_bucket(std::int32_t n) const {
    const auto it = std::lower_bound(graph_sizes_.begin(), graph_sizes_.end(), n);
    if (it == graph_sizes_.end()) return 0;
    return *it <= kBuckets.back() || (*it - n) * kMaxPaddingShare <= *it ? *it : 0;
  }

  /// Writes the step's metadata into the pinned buffer; rows beyond the chunks (graph padding) get
  /// token 0 at position 0, slot -1 (no cache write), length 0 (attends to nothing).
  MetaLayout pack(std::span<const ForwardChunk> chunks, const StepShape& sh, std::int32_t bs) {
    const MetaLayout m(sh.T, sh.C, sh.width, sh.S);
    auto* base = static_cast<std::byte*>(pinned_.data());
    auto* ids = reinterpret_cast<std::int32_t*>(base + m.ids);
    auto* pos = reinterpret_cast<std::int32_t*>(base + m.pos);
    auto* slots = reinterpret_cast<std::int64_t*>(base + m.slots);
    auto* tables = reinterpret_cast<std::int32_t*>(base + m.tables);
    auto* lens = reinterpret_cast<std::int32_t*>(base + m.lens);
    auto* indptr = reinterpret_cast<std::int32_t*>(base + m.indptr);
    auto* starts = reinterpret_cast<std::int32_t*>(base + m.starts);
    auto* samples = reinterpret_cast<std::int32_t*>(base + m.samples);
    std::int32_t row = 0, s = 0, prefill = 0;
    indptr[0] = 0;
    for (std::size_t ci = 0; ci < chunks.size(); ++ci) {
      const ForwardChunk& c = chunks[ci];
      const auto n = static_cast<std::int32_t>(c.tokens.size());
      for (std::int32_t i = 0; i < n; ++i, ++row) {
        const std::int32_t p = c.start + i;
        ids[row] = c.tokens[static_cast<std::size_t>(i)];
        pos[row] = p;
        slots[row] = static_cast<std::int64_t>(c.block_table[static_cast<std::size_t>(p / bs)]) * bs + p % bs;
      }
      std::int32_t* t = tables + ci * static_cast<std::size_t>(sh.width);
      const auto used = std::min<std::size_t>(c.block_table.size(), static_cast<std::size_t>(sh.width));
      std::memcpy(t, c.block_table.data(), used * sizeof(std::int32_t));
      std::fill(t + used, t + sh.width, 0);
      if (static_cast<std::int32_t>(ci) < sh.num_decode) {
        lens[ci] = c.start + 1;
      } else {
        // Prefill chunks are numbered from 0 in their own arrays (after the decode chunks' tables).
        starts[prefill] = c.start;
        indptr[prefill + 1] = indptr[prefill] + n;
        prefill++;
      }
      if (c.samples) samples[s++] = row - 1;
    }
    for (; row < sh.T; ++row) {  // graph padding
      ids[row] = 0;
      pos[row] = 0;
      slots[row] = -1;
      samples[row] = row;
    }
    for (auto ci = static_cast<std::int32_t>(chunks.size()); ci < sh.C; ++ci) {
      lens[ci] = 0;
      std::fill(tables + ci * static_cast<std::size_t>(sh.width), tables + (ci + 1) * static_cast<std::size_t>(sh.width), 0);
    }
    return m;
  }

  /// Enqueues the whole step on the stream (what a graph captures).
  void compute(KvCache<cuda>& cache, const StepShape& sh, const MetaLayout& m) {
    const ModelConfig& c = config_;
    void* s = stream_.handle();
    const std::int64_t T = sh.T, H = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), I = c.intermediate_size;
    const std::int64_t qkvw = qs + 2 * kvs;
    const float eps = c.rms_norm_eps;
    auto* meta = static_cast<std::byte*>(meta_.data());
    const auto* ids = reinterpret_cast<const std::int32_t*>(meta + m.ids);
    const auto* pos = reinterpret_cast<const std::int32_t*>(meta + m.pos);
    const auto* slots = reinterpret_cast<const std::int64_t*>(meta + m.slots);
    const auto* tables = reinterpret_cast<const std::int32_t*>(meta + m.tables);
    float* x = x_.as<float>();
    bf16 *xn = xn_.as<bf16>(), *qkv = qkv_.as<bf16>(), *q = q_.as<bf16>(), *att = att_.as<bf16>(), *o = o_.as<bf16>(),
         *gu = gu_.as<bf16>(), *act = act_.as<bf16>();
    CudaMatmulContext ctx{&gemm_, s, scratch_.as<bf16>(), scratch_.size() / 2};
    const auto rows = static_cast<std::int32_t>(T);

    kernels::cuda::embedding(embedding_, ids, T, H, x, s);
    // Each residual add is fused into the norm that follows it: the MLP's output of layer l is added by
    // layer l + 1's first norm (or after the loop), the attention output by the MLP's norm.
    const bf16* pending = nullptr;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      const auto layer = static_cast<std::int32_t>(l);
      if (pending) kernels::cuda::add_bf16_rmsnorm(x, pending, L.attn_norm, T, H, eps, xn, s);
      else kernels::cuda::add_rmsnorm(x, nullptr, L.attn_norm, T, H, eps, xn, s);
      project(ctx, L.qkv, xn, rows, qkv);
      if (L.qkv_bias) kernels::cuda::add_bias(qkv, L.qkv_bias, T, qkvw, s);
      kernels::cuda::rope_write_kv(qkv, pos, inv_freq_.as<float>(), T, static_cast<int>(c.num_heads),
                                   static_cast<int>(c.num_kv_heads), static_cast<int>(c.head_dim),
                                   c.rope_style == RopeStyle::neox ? 0 : 1, cache.k(layer), cache.v(layer), slots, s);
      DeviceAttentionBatch b = attention_batch(layer, &cache, sh.width);
      if (sh.prefill_rows > 0 || qkvw % 8 != 0) {
        // The prefill kernel reads q densely packed (the decode kernel, 16-byte aligned rows): take it out of the fused rows.
        backend::cuda::check(cudaMemcpy2DAsync(q, static_cast<std::size_t>(qs) * 2, qkv, static_cast<std::size_t>(qkvw) * 2,
                                               static_cast<std::size_t>(qs) * 2, static_cast<std::size_t>(T),
                                               cudaMemcpyDeviceToDevice, stream()),
                             "LlamaModel<cuda>: packing q");
      } else {
        b.decode_q = qkv;  // decode-only: read q in place
        b.decode_q_stride = qkvw;
      }
      b.q = q;
      b.out = att;
      b.num_decode = sh.num_decode;
      b.decode_tables = tables;
      b.decode_lens = reinterpret_cast<const std::int32_t*>(meta + m.lens);
      b.num_prefill = sh.C - sh.num_decode;
      b.prefill_rows = sh.prefill_rows;
      b.prefill_tables = tables + static_cast<std::size_t>(sh.num_decode) * static_cast<std::size_t>(sh.width);
      b.prefill_indptr = reinterpret_cast<const std::int32_t*>(meta + m.indptr);
      b.prefill_start = reinterpret_cast<const std::int32_t*>(meta + m.starts);
      Attn::attend(cuda{}, b);
      Q::matmul(ctx, L.o, att, rows, o);
      kernels::cuda::add_bf16_rmsnorm(x, o, L.ffn_norm, T, H, eps, xn, s);
      if (!fused_swiglu(ctx, L.gate_up, xn, rows, act)) {
        project(ctx, L.gate_up, xn, rows, gu);
        kernels::cuda::swiglu(gu, T, I, act, s);
      }
      Q::matmul(ctx, L.down, act, rows, o);
      pending = o;
    }
    if (pending) kernels::cuda::add(x, pending, T * H, s);
    // Final norm and LM head on the sampled rows.
    const float* last = x;
    if (!sh.identity_samples) {
      kernels::cuda::gather_rows(x, reinterpret_cast<const std::int32_t*>(meta + m.samples), sh.S, H, last_.as<float>(), s);
      last = last_.as<float>();
    }
    if (sh.S == 0) return;
    kernels::cuda::add_rmsnorm(const_cast<float*>(last), nullptr, output_norm_, sh.S, H, eps, lastn_.as<bf16>(), s);
    if (sh.S <= kernels::cuda::kBf16GemvPreferredRows && kernels::cuda::bf16_gemv_supports(lm_head_, lastn_.data(), H))
      kernels::cuda::bf16_gemv(lm_head_, lastn_.as<bf16>(), sh.S, c.vocab_size, H, logits_.as<float>(), s);
    else
      gemm_.run(lastn_.as<bf16>(), lm_head_, logits_.as<float>(), sh.S, c.vocab_size, H, 0.0f, s);
  }

  /// act = SwiGLU of the gate/up projection in one kernel, when the Quantizer has the optional hook
  /// (`Q::matmul_swiglu`) and it takes this weight and batch; false (nothing done) otherwise.
  bool fused_swiglu(CudaMatmulContext& ctx, const Projection& p, const bf16* x, std::int32_t rows, bf16* act) {
    if constexpr (requires(const linear& w) {
                    { Q::matmul_swiglu(ctx, w, x, rows, act) } -> std::same_as<bool>;
                  })
      return p.parts.size() == 1 && Q::matmul_swiglu(ctx, p.parts.front(), x, rows, act);
    else
      return false;
  }

  /// A stacked projection: one GEMM, or one per part with its output copied into its columns.
  void project(CudaMatmulContext& ctx, const Projection& p, const bf16* x, std::int32_t rows, bf16* y) {
    if (p.parts.size() == 1) {
      Q::matmul(ctx, p.parts[0], x, rows, y);
      return;
    }
    std::int64_t col = 0;
    for (const auto& w : p.parts) {
      Q::matmul(ctx, w, x, rows, split_.as<bf16>());
      backend::cuda::check(cudaMemcpy2DAsync(y + col, static_cast<std::size_t>(p.out) * 2, split_.data(),
                                             static_cast<std::size_t>(w.out()) * 2, static_cast<std::size_t>(w.out()) * 2,
                                             static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, stream()),
                           "LlamaModel<cuda>: placing a projection's part");
      col += w.out();
    }
  }

  /// Runs a decode step of `b` padding rows (they write nothing and attend to nothing), so that cuBLASLt
  /// picks, tunes and caches its plans for these shapes now; returns the step's shape and layout.
  std::pair<StepShape, MetaLayout> warm_up(KvCache<cuda>& cache, std::int32_t b) {
    StepShape sh;
    sh.T = sh.C = sh.S = sh.num_decode = b;
    sh.width = cap_width_;
    sh.identity_samples = true;
    const MetaLayout m = pack({}, sh, cache.block_size());  // all padding: valid inputs for a warm-up
    backend::cuda::check(cudaMemcpyAsync(meta_.data(), pinned_.data(), m.bytes, cudaMemcpyHostToDevice, stream()),
                         "LlamaModel<cuda>: copying warm-up metadata");
    compute(cache, sh, m);
    stream_.synchronize();
    return {sh, m};
  }

  /// Captures the decode step of `b` sequences. The capture's metadata layout is the one pack() makes
  /// for a padded decode step of that bucket, so a replay needs only the metadata copy before it.
  void capture(KvCache<cuda>& cache, std::int32_t b) {
    const auto [sh, m] = warm_up(cache, b);
    Graph::begin_capture(stream_.handle());
    try {
      compute(cache, sh, m);
    } catch (...) {
      Graph::abort_capture(stream_.handle());
      throw;
    }
    graphs_.emplace(b, Graph::end_capture(stream_.handle()));
  }

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }

  ModelConfig config_;
  backend::cuda::Stream stream_;
  kernels::cuda::Gemm gemm_;
  backend::cuda::DeviceArena arena_;
  backend::cuda::DeviceBuffer inv_freq_;
  const bf16* embedding_ = nullptr;
  const bf16* lm_head_ = nullptr;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::int64_t split_out_ = 0;     ///< widest unstacked projection (0: every projection is stacked)
  std::size_t scratch_elems_ = 0;  ///< largest GGUF weight dequantized for a GEMM
  ModelLoadTimes times_;

  std::int32_t cap_tokens_ = 0, cap_seqs_ = 0, cap_width_ = 0;
  backend::cuda::DeviceBuffer x_, xn_, qkv_, q_, att_, o_, gu_, act_, split_, last_, lastn_, logits_, ids_, scratch_,
      meta_, workspace_;
  backend::cuda::PinnedBuffer pinned_;
  DeviceSampler sampler_;
  std::map<std::int32_t, Graph> graphs_;
  std::vector<std::int32_t> graph_sizes_;  ///< decode batch sizes with a graph (or, eager, its padded shape)
  const KvCache<cuda>* prepared_cache_ = nullptr;
  bool eager_padding_ = false;
  std::int64_t graph_steps_ = 0, eager_steps_ = 0, device_sampled_rows_ = 0;
  std::unique_ptr<backend::cuda::EventTimer> step_timer_;
  bool timed_ = false;
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
