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
/// nothing and attend to nothing); other steps run eagerly. q/k/v and gate/up are each stored stacked (one
/// weight) when the Quantizer can (`load_stacked`), else run as separate GEMMs copied into place.
///
/// The file's parts: the weights (one device arena) in llama_cuda_weights.hpp, the step's metadata
/// packing in step_metadata_cuda.hpp, the choice and capture of decode graphs in decode_graphs_cuda.hpp;
/// here the buffers, the step (graph or eager) and the computation. Not thread-safe.
///
/// Tensor parallel (a shard: ModelSource::shard with a dist::DeviceGroup): the config is the rank's (its heads,
/// KV heads and share of the MLP) and the embedding and head hold its block of the vocabulary. The step adds
/// four collectives on the model's stream: the embedding rows (each rank fills the ids it holds, zeros for the
/// rest) are summed, the o and down outputs are summed (bf16) before the residual add that takes them, and the
/// head's logit blocks are all-gathered into [rows][vocab], so every rank samples from the same logits. Each step
/// first checks over the host group that it is rank 0's (check_same_step). Decode graphs are captured only where
/// the group's calls can be (NCCL's).

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "infer/attention/device_batch.hpp"
#include "infer/backend/cuda_runtime.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/dist/device_group.hpp"
#include "infer/engine/engine_options.hpp"
#include "infer/io/engine_file.hpp"
#include "infer/sched/step_plan.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "infer/kernels/cuda/sampling.hpp"
#include "infer/model/decode_graphs_cuda.hpp"
#include "infer/model/forward_batch.hpp"
#include "infer/model/forward_check.hpp"
#include "infer/model/kv_cache.hpp"
#include "infer/model/llama_cuda_weights.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"
#include "infer/model/step_metadata_cuda.hpp"
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
  using Weights = LlamaCudaWeights<Q>;
  using linear = typename Weights::linear;
  using Projection = typename Weights::Projection;
  using Layer = typename Weights::Layer;
  using bf16 = std::uint16_t;

 public:
  /// Loads every weight into one device arena (from an engine file: its arena, copied as it is). Errors as
  /// ModelSource / the Quantizer, naming the tensor; DeviceError when the device cannot hold the weights.
  static LlamaModel load(const ModelSource& src) { return LlamaModel(src); }

  /// The weights as an engine file's parts (LlamaCudaWeights::save): what infer-build writes for cuda.
  void save_weights(EngineFileWriter& out, std::vector<std::byte>& host) const { weights_.save(config_, out, host); }

  LlamaModel(LlamaModel&&) noexcept = default;
  LlamaModel& operator=(LlamaModel&&) noexcept = default;

  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }
  [[nodiscard]] const ModelLoadTimes& load_times() const noexcept { return times_; }

  /// KV-cache bytes one token occupies across all layers (K and V: bf16, or e4m3 codes).
  [[nodiscard]] std::size_t kv_bytes_per_token(KvCacheDtype dtype = KvCacheDtype::automatic) const noexcept {
    return KvCache<cuda>::bytes_per_token(config_.num_layers, config_.num_kv_heads, config_.head_dim, dtype);
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
    require_kv_cache_reader<Attn, cuda>(cache.dtype(), "LlamaModel<cuda>");
    const auto t0 = std::chrono::steady_clock::now();
    const std::int32_t width = (max_model_len + cache.block_size() - 1) / cache.block_size();
    grow(cap_tokens_, cap_seqs_, width);
    graphs_.plan(cap_seqs_, cap_tokens_);
    prepared_cache_ = &cache;
    if (cuda_graphs && (dgroup_ == nullptr || dgroup_->capturable())) {
      // Largest first: each capture's warm-up step is where the GEMMs of its M are tuned (GemmTuning::
      // measured, once per power-of-two bucket of M), so a bucket is tuned at its largest captured size.
      for (auto it = graphs_.sizes().rbegin(); it != graphs_.sizes().rend(); ++it) capture(cache, *it);
    }
    // Eager decode steps past the last bucket: tune their GEMM buckets now, not during the first
    // requests (a padded warm-up step at each power of two; max_num_seqs' capture warmed its own size).
    for (std::int32_t b = 2 * DecodeGraphs::kBuckets.back();
         b <= cap_seqs_ && b <= cap_tokens_ && b <= kernels::cuda::Gemm::kTunedMaxRows; b *= 2)
      if (graphs_.find(b) == nullptr) warm_up(cache, b);
    stream_.synchronize();
    times_.graphs = graphs_.captured();
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
  [[nodiscard]] std::size_t num_graphs() const noexcept { return graphs_.captured(); }
  /// Steps run by graph replay / eagerly so far.
  [[nodiscard]] std::int64_t graph_steps() const noexcept { return graph_steps_; }
  [[nodiscard]] std::int64_t eager_steps() const noexcept { return eager_steps_; }
  /// Rows whose token forward_sample() drew on the device so far.
  [[nodiscard]] std::int64_t device_sampled_rows() const noexcept { return device_sampled_rows_; }

 private:
  explicit LlamaModel(const ModelSource& src)
      : config_(src.config()),
        tp_(src.tensor_parallel()),
        group_(src.group()),
        dgroup_(src.device_group()),
        load_start_(std::chrono::steady_clock::now()),
        weights_(load_checked(src, stream_)) {
    std::vector<float> inv = rope_inv_freq(config_);
    inv_freq_ = backend::cuda::DeviceBuffer(inv.size() * sizeof(float));
    inv_freq_.upload(std::span<const float>(inv));
    times_.weight_bytes = weights_.bytes();
    times_.weights_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start_).count();
    // An engine file's GEMM picks, timed at build: its buckets are not timed again on the first steps.
    if (const EngineFile* file = src.engine_file()) gemm_.adopt_measured_algorithms(file->info().gemm_algorithms);
  }

  /// The weights, once the config's head_dim is one the attention kernels are built for: refused before
  /// any weight reaches the device.
  static Weights load_checked(const ModelSource& src, const backend::cuda::Stream& stream) {
    const ModelConfig& c = src.config();
    require_group_for_split(src);
    if (src.group() != nullptr && src.device_group() == nullptr)
      throw UnsupportedError(detail::cat(src.describe(), ": tensor parallelism on the GPU needs the group's device ",
                                         "collectives (a dist::DeviceGroup: NCCL; ModelSpec::tensor_parallel_device)"));
    if (src.group() != nullptr && src.tensor_parallel().vocab_rows(c.vocab_size) == 0)
      throw UnsupportedError(detail::cat(src.describe(), ": a vocabulary of ", c.vocab_size, " leaves tensor-parallel ",
                                         "rank ", src.tensor_parallel().rank, " of ", src.tensor_parallel().size,
                                         " no rows of the embedding"));
    if (c.head_dim != 64 && c.head_dim != 128)
      throw UnsupportedError(detail::cat(src.describe(), ": head_dim ", c.head_dim,
                                         " is not supported by the CUDA attention kernels (64 or 128); use the CPU backend"));
    return Weights(src, stream.handle());
  }

  // ---- buffers ---------------------------------------------------------------------------------------
  /// Grows every step buffer to hold T tokens, S sequences and tables of `width` (never shrinks).
  /// Growing drops the captured graphs (they point at the old buffers).
  void grow(std::int32_t T, std::int32_t S, std::int32_t width) {
    T = std::max(T, cap_tokens_);
    S = std::max(S, cap_seqs_);
    width = std::max(width, cap_width_);
    if (T == cap_tokens_ && S == cap_seqs_ && width == cap_width_) return;
    graphs_.drop();
    const ModelConfig& c = config_;
    const auto n = [&](std::int64_t rows, std::int64_t cols, std::size_t elem) {
      return static_cast<std::size_t>(rows * cols) * elem;
    };
    const std::int64_t H = c.hidden_size, qkv = c.q_size() + 2 * c.kv_size(), I = c.intermediate_size;
    x_ = backend::cuda::DeviceBuffer(2 * n(T, H, 4));  // the residual stream and its other half (compute())
    xn_ = backend::cuda::DeviceBuffer(n(T, H, 2));
    qkv_ = backend::cuda::DeviceBuffer(n(T, qkv, 2));
    q_ = backend::cuda::DeviceBuffer(n(T, c.q_size(), 2));
    att_ = backend::cuda::DeviceBuffer(n(T, c.q_size(), 2));
    o_ = backend::cuda::DeviceBuffer(n(T, H, 2));
    gu_ = backend::cuda::DeviceBuffer(n(T, 2 * I, 2));
    act_ = backend::cuda::DeviceBuffer(n(T, I, 2));
    if (weights_.split_out() > 0) split_ = backend::cuda::DeviceBuffer(n(T, weights_.split_out(), 2));
    last_ = backend::cuda::DeviceBuffer(n(S, H, 4));
    lastn_ = backend::cuda::DeviceBuffer(n(S, H, 2));
    logits_ = backend::cuda::DeviceBuffer(n(S, c.vocab_size, 4));
    if (dgroup_) {  // this rank's block of every sampled row's logits, and every rank's
      head_block_ = backend::cuda::DeviceBuffer(n(S, tp_.vocab_block(c.vocab_size), 4));
      head_all_ = backend::cuda::DeviceBuffer(n(S * tp_.size, tp_.vocab_block(c.vocab_size), 4));
    }
    ids_ = backend::cuda::DeviceBuffer(n(S, 1, 4));
    sampler_.reserve(S, static_cast<int>(c.vocab_size));
    if (const std::size_t ws = weights_.workspace_bytes(T); ws > 0 && scratch_.size() < ws)
      scratch_ = backend::cuda::DeviceBuffer(ws);
    const StepMetadataLayout m(T, S, width, S);
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
    // Zeroed once, as DeviceAttentionBatch::workspace promises a policy that keeps state there between calls.
    if (ws > 0) backend::cuda::check(cudaMemset(workspace_.data(), 0, ws), "LlamaModel<cuda>: zeroing the attention workspace");
    cap_tokens_ = T;
    cap_seqs_ = S;
    cap_width_ = width;
  }

  /// The parts of a DeviceAttentionBatch that do not depend on the step.
  DeviceAttentionBatch attention_batch(std::int32_t layer, const KvCache<cuda>* cache, std::int32_t width) const {
    DeviceAttentionBatch b;
    if (cache) {
      b.k = cache->k_storage(layer);
      b.v = cache->v_storage(layer);
      b.kv_dtype = cache->dtype();
      b.k_scale = cache->k_scale(layer);
      b.v_scale = cache->v_scale(layer);
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
    const std::int32_t bucket =
        decode_only && all_sample && prepared_cache_ == &cache && width <= cap_width_ ? graphs_.bucket(sh.T) : 0;
    const DecodeGraphs::Graph* graph = bucket > 0 ? graphs_.find(bucket) : nullptr;
    const bool padded = graph != nullptr || (bucket > 0 && eager_padding_);
    if (padded) {
      sh = StepShape::padded_decode(bucket, cap_width_);
    } else {
      sh.width = width;
      sh.identity_samples = sh.S == sh.T;
      grow(sh.T, std::max(sh.C, sh.S), width);
    }
    if (group_) check_same_step(*group_, chunks);
    const StepMetadataLayout m = pack_step_metadata(chunks, sh, bs, pinned_.data());
    if (dgroup_) hold_own_vocabulary(StepMetadata::at(pinned_.data(), m).ids, sh.T);
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

  /// Enqueues the whole step on the stream (what a graph captures).
  void compute(KvCache<cuda>& cache, const StepShape& sh, const StepMetadataLayout& m) {
    const ModelConfig& c = config_;
    void* s = stream_.handle();
    const std::int64_t T = sh.T, H = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), I = c.intermediate_size;
    const std::int64_t qkvw = qs + 2 * kvs;
    const float eps = c.rms_norm_eps;
    const StepMetadata meta = StepMetadata::at(meta_.data(), m);  // the device copy
    // The residual stream moves between the two halves of x_ at each add: a pre-norm writes r = x + delta to the
    // other half, so a kernel that computes the norm itself (prenorm_project) may have CTAs still reading x while
    // others write r. The halves' order is the same in every step, so captured graphs replay it.
    float* x = x_.as<float>();
    float* x_other = x + T * H;
    bf16 *xn = xn_.as<bf16>(), *qkv = qkv_.as<bf16>(), *q = q_.as<bf16>(), *att = att_.as<bf16>(), *o = o_.as<bf16>(),
         *gu = gu_.as<bf16>(), *act = act_.as<bf16>();
    CudaMatmulContext ctx{&gemm_, s, scratch_.as<bf16>(), scratch_.size() / 2};
    const auto rows = static_cast<std::int32_t>(T);
    // The pre-norm of `norm_weight` on x with `delta` added (null: none), its r going to the other half.
    auto prenorm = [&](const bf16* delta, const float* norm_weight) {
      return kernels::cuda::ResidualNorm{x, delta, norm_weight, eps, delta ? x_other : nullptr, xn};
    };
    auto advance = [&](const kernels::cuda::ResidualNorm& n) {  // the stream is now where n wrote r
      if (n.residual_out) std::swap(x, x_other);
    };

    weights_.embed(meta.ids, T, H, x, s);
    if (dgroup_) dgroup_->all_reduce_sum(x, static_cast<std::size_t>(T * H), s);
    // Each residual add is fused into the norm that follows it: the MLP's output of layer l is added by
    // layer l + 1's first norm (or by the final one), the attention output by the MLP's norm.
    const bf16* pending = nullptr;
    const std::vector<Layer>& layers = weights_.layers();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      const auto layer = static_cast<std::int32_t>(l);
      const kernels::cuda::ResidualNorm attn_in = prenorm(pending, L.attn_norm);
      prenorm_project(ctx, L.qkv, attn_in, rows, qkv);
      advance(attn_in);
      if (L.qkv_bias) kernels::cuda::add_bias(qkv, L.qkv_bias, T, qkvw, s);
      kernels::cuda::rope_write_kv(qkv, meta.pos, inv_freq_.as<float>(), T, static_cast<int>(c.num_heads),
                                   static_cast<int>(c.num_kv_heads), static_cast<int>(c.head_dim),
                                   c.rope_style == RopeStyle::neox ? 0 : 1, cache.k_storage(layer), cache.v_storage(layer),
                                   meta.slots, s, cache.dtype(), cache.k_scale(layer), cache.v_scale(layer));
      DeviceAttentionBatch b = attention_batch(layer, &cache, sh.width);
      if (qkvw % 8 != 0) {
        // The attention kernels read q 16 bytes at a time: rows of another length are packed densely first.
        // Rows of a multiple of 8 are read in place, a prefill step's too: the copy moved 2·T·H·2 bytes a layer
        // (0.3 ms of a 2,048-token prompt's prefill at ~3.5 TB/s) that the kernels read either way.
        backend::cuda::check(cudaMemcpy2DAsync(q, static_cast<std::size_t>(qs) * 2, qkv, static_cast<std::size_t>(qkvw) * 2,
                                               static_cast<std::size_t>(qs) * 2, static_cast<std::size_t>(T),
                                               cudaMemcpyDeviceToDevice, stream()),
                             "LlamaModel<cuda>: packing q");
        b.q = q;
      } else {
        b.q = qkv;  // read in place, where the fused projection left it
        b.q_stride = qkvw;
      }
      b.out = att;
      b.num_decode = sh.num_decode;
      b.decode_tables = meta.tables;
      b.decode_lens = meta.lens;
      b.num_prefill = sh.C - sh.num_decode;
      b.prefill_rows = sh.prefill_rows;
      b.prefill_tables = meta.tables + static_cast<std::size_t>(sh.num_decode) * static_cast<std::size_t>(sh.width);
      b.prefill_indptr = meta.indptr;
      b.prefill_start = meta.starts;
      Attn::attend(cuda{}, b);
      Q::matmul(ctx, L.o, att, rows, o);
      if (dgroup_) dgroup_->all_reduce_sum_bf16(o, static_cast<std::size_t>(T * H), s);
      const kernels::cuda::ResidualNorm ffn_in = prenorm(o, L.ffn_norm);
      if (!fused_swiglu_normed(ctx, L.gate_up, ffn_in, rows, act)) {
        kernels::cuda::residual_norm(ffn_in, T, H, s);
        if (!fused_swiglu(ctx, L.gate_up, xn, rows, act)) {
          project(ctx, L.gate_up, xn, rows, gu);
          kernels::cuda::swiglu(gu, T, I, act, s);
        }
      }
      advance(ffn_in);
      Q::matmul(ctx, L.down, act, rows, o);
      if (dgroup_) dgroup_->all_reduce_sum_bf16(o, static_cast<std::size_t>(T * H), s);
      pending = o;
    }
    if (sh.S == 0) return;
    // Final norm and LM head on the sampled rows: in the head's GEMV where every row samples and the Quantizer
    // takes the norm there (its residual is not written: nothing reads it after the head).
    if (sh.identity_samples && dgroup_ == nullptr &&
        weights_.logits_normed(ctx, {x, pending, weights_.output_norm(), eps, nullptr, nullptr}, sh.S,
                               logits_.as<float>()))
      return;
    if (pending) kernels::cuda::add(x, pending, T * H, s);
    const float* last = x;
    if (!sh.identity_samples) {
      kernels::cuda::gather_rows(x, meta.samples, sh.S, H, last_.as<float>(), s);
      last = last_.as<float>();
    }
    kernels::cuda::add_rmsnorm(const_cast<float*>(last), nullptr, weights_.output_norm(), sh.S, H, eps, lastn_.as<bf16>(), s);
    if (dgroup_ == nullptr) {
      weights_.logits(ctx, lastn_.as<bf16>(), sh.S, c.vocab_size, H, logits_.as<float>());
      return;
    }
    const std::int64_t V = c.vocab_size, block = tp_.vocab_block(V);
    weights_.logits(ctx, lastn_.as<bf16>(), sh.S, tp_.vocab_rows(V), H, head_block_.as<float>());
    dgroup_->all_gather(head_block_.as<float>(), head_all_.as<float>(), static_cast<std::size_t>(sh.S * block), s);
    for (int k = 0; k < tp_.size; ++k) {  // rank k's [S][its rows] into its columns of [S][V]
      const TensorParallel tk{k, tp_.size};
      const auto cols = static_cast<std::size_t>(tk.vocab_rows(V));
      if (cols == 0) continue;
      backend::cuda::check(cudaMemcpy2DAsync(logits_.as<float>() + tk.vocab_first(V), static_cast<std::size_t>(V) * 4,
                                             head_all_.as<float>() + static_cast<std::size_t>(k * sh.S * block), cols * 4,
                                             cols * 4, static_cast<std::size_t>(sh.S), cudaMemcpyDeviceToDevice, stream()),
                           "LlamaModel<cuda>: placing a rank's logits");
    }
  }

  /// A tensor-parallel rank's token ids, in place: the row of its embedding block each id is, or -1 (zeros) for an id
  /// another rank holds; the all-reduce after the lookup then gives every rank every row.
  void hold_own_vocabulary(std::int32_t* ids, std::int32_t n) const {
    const std::int64_t first = tp_.vocab_first(config_.vocab_size), held = tp_.vocab_rows(config_.vocab_size);
    for (std::int32_t i = 0; i < n; ++i) {
      const std::int64_t local = ids[i] - first;
      ids[i] = local >= 0 && local < held ? static_cast<std::int32_t>(local) : -1;
    }
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

  /// fused_swiglu with x as the pre-norm `n`, computed in the same kernel (`Q::matmul_swiglu_normed`); false
  /// (nothing done) where the Quantizer has no such hook or it does not take this weight and batch.
  bool fused_swiglu_normed(CudaMatmulContext& ctx, const Projection& p, const kernels::cuda::ResidualNorm& n,
                           std::int32_t rows, bf16* act) {
    if constexpr (requires(const linear& w) {
                    { Q::matmul_swiglu_normed(ctx, w, n, rows, act) } -> std::same_as<bool>;
                  })
      return p.parts.size() == 1 && Q::matmul_swiglu_normed(ctx, p.parts.front(), n, rows, act);
    else
      return false;
  }

  /// y = the pre-norm n's x times p: the first part's matmul computes the norm itself where the Quantizer takes it
  /// (`Q::matmul_normed`, which also leaves x in n.normed_out for the other parts); otherwise the norm kernel runs
  /// first and every part reads its x.
  void prenorm_project(CudaMatmulContext& ctx, const Projection& p, const kernels::cuda::ResidualNorm& n,
                       std::int32_t rows, bf16* y) {
    if constexpr (requires(const linear& w) {
                    { Q::matmul_normed(ctx, w, n, rows, y, std::int64_t{}) } -> std::same_as<bool>;
                  }) {
      if (Q::matmul_normed(ctx, p.parts.front(), n, rows, y, p.parts.size() == 1 ? 0 : p.out)) {
        project(ctx, p, n.normed_out, rows, y, 1);
        return;
      }
    }
    kernels::cuda::residual_norm(n, rows, config_.hidden_size, stream_.handle());
    project(ctx, p, n.normed_out, rows, y);
  }

  /// A stacked projection: one GEMM, or one per part with its output copied into its columns; parts before
  /// `first` are skipped (already in y).
  void project(CudaMatmulContext& ctx, const Projection& p, const bf16* x, std::int32_t rows, bf16* y,
               std::size_t first = 0) {
    if (p.parts.size() == 1) {
      if (first == 0) Q::matmul(ctx, p.parts[0], x, rows, y);
      return;
    }
    std::int64_t col = 0;
    for (std::size_t i = 0; i < first; ++i) col += p.parts[i].out();
    for (std::size_t i = first; i < p.parts.size(); ++i) {
      const linear& w = p.parts[i];
      if constexpr (requires { { Q::matmul_into(ctx, w, x, rows, y, p.out) } -> std::same_as<bool>; }) {
        if (Q::matmul_into(ctx, w, x, rows, y + col, p.out)) {  // written into its columns directly
          col += w.out();
          continue;
        }
      }
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
  std::pair<StepShape, StepMetadataLayout> warm_up(KvCache<cuda>& cache, std::int32_t b) {
    const StepShape sh = StepShape::padded_decode(b, cap_width_);
    // All padding: valid inputs for a warm-up.
    const StepMetadataLayout m = pack_step_metadata({}, sh, cache.block_size(), pinned_.data());
    backend::cuda::check(cudaMemcpyAsync(meta_.data(), pinned_.data(), m.bytes, cudaMemcpyHostToDevice, stream()),
                         "LlamaModel<cuda>: copying warm-up metadata");
    compute(cache, sh, m);
    stream_.synchronize();
    return {sh, m};
  }

  /// Captures the decode step of `b` sequences. The capture's metadata layout is the one
  /// pack_step_metadata makes for a padded decode step of that bucket, so a replay needs only the
  /// metadata copy before it.
  void capture(KvCache<cuda>& cache, std::int32_t b) {
    const auto [sh, m] = warm_up(cache, b);
    graphs_.capture(b, stream_.handle(), [&] { compute(cache, sh, m); });
  }

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }

  // In this order: the weights load on stream_, and load_start_ times them.
  ModelConfig config_;
  TensorParallel tp_;                        ///< this rank's place ({0, 1}: the whole model)
  dist::Group* group_ = nullptr;             ///< the tensor-parallel group (host), or none
  dist::DeviceGroup* dgroup_ = nullptr;      ///< its collectives on the device, or none
  backend::cuda::Stream stream_;
  std::chrono::steady_clock::time_point load_start_;
  Weights weights_;
  kernels::cuda::Gemm gemm_;
  backend::cuda::DeviceBuffer inv_freq_;
  ModelLoadTimes times_;

  std::int32_t cap_tokens_ = 0, cap_seqs_ = 0, cap_width_ = 0;
  backend::cuda::DeviceBuffer x_, xn_, qkv_, q_, att_, o_, gu_, act_, split_, last_, lastn_, logits_, ids_, scratch_,
      meta_, workspace_, head_block_, head_all_;
  backend::cuda::PinnedBuffer pinned_;
  DeviceSampler sampler_;
  DecodeGraphs graphs_;  ///< decode batch sizes with a graph (or, eager, its padded shape), and the graphs
  const KvCache<cuda>* prepared_cache_ = nullptr;
  bool eager_padding_ = false;
  std::int64_t graph_steps_ = 0, eager_steps_ = 0, device_sampled_rows_ = 0;
  std::unique_ptr<backend::cuda::EventTimer> step_timer_;
  bool timed_ = false;
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
