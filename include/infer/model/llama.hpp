#pragma once
/// \file
/// `LlamaModel<B, Q, Attn>`: the decoder shared by Llama 1-3, SmolLM/SmolLM2, Mistral and Qwen2
/// (q/k/v biases). `infer::llama` is its Model tag for `Engine<Backend, Model, ...>`. This file holds
/// the CPU decoder (f32, the reference); the GPU one (bf16, CUDA graphs) is llama_cuda.hpp, included
/// at the end when the build has CUDA.
///
/// One `forward` computes a whole engine step: the tokens of every chunk (decodes and prefill pieces
/// of several sequences) are stacked into one [T][hidden] activation so each projection is a single
/// GEMM over all T rows; only attention runs per chunk, through the Attn policy's view of the
/// sequence's KV blocks. Per layer:
///   x → RMSNorm → q, k, v (+ biases) → RoPE(q, k) → write k, v to the cache → attention → o_proj → +x
///     → RMSNorm → silu(gate) · up → down_proj → +x
/// then the final RMSNorm and the LM head on the rows that sample only (one per sampling chunk).
///
/// Scratch buffers live in the model and grow to the largest step seen, so a steady-state step
/// allocates nothing. A model is therefore not safe to call from two threads at once.
///
/// Tensor parallelism (CPU): loaded from a shard (ModelSource::shard), a rank holds its heads, its share of the
/// MLP and its rows of the vocabulary, and its config() says so (the KV cache the engine sizes from it holds the
/// rank's KV heads). The ranks' o and down products are summed by an all-reduce before each residual add, the
/// embedding rows by one after the lookup (a rank adds the rows of its vocabulary, zeros elsewhere: exact), and
/// the LM head's logits all-gathered, so every rank ends each step with the same logits and samples the same
/// tokens. Every rank's engine runs the same schedule from the same requests; each step checks that against rank
/// 0's (a fingerprint of the step's chunks) and throws DistributedError on every rank if one differs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/dist/communicator.hpp"
#include "infer/kernels/cpu_ops.hpp"
#include "infer/model/forward_batch.hpp"
#include "infer/model/forward_check.hpp"
#include "infer/model/kv_cache.hpp"
#include "infer/model/llama_weights.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"
#include "infer/quant/f32.hpp"

namespace infer {

/// Chosen when no specialisation matches: says which of the three arguments is the problem.
template <class B, class Q, class Attn>
class LlamaModel {
  static_assert(Backend<B>, "LlamaModel<B, Q, Attn>: B must be a backend tag (infer::cpu or infer::cuda)");
  static_assert(!Backend<B> || Quantizer<Q, B>,
                "LlamaModel<B, Q, Attn>: Q is not a Quantizer for backend B (see infer::Quantizer in concepts.hpp)");
  static_assert(!Backend<B> || AttentionKernel<Attn, B>,
                "LlamaModel<B, Q, Attn>: Attn is not an AttentionKernel for backend B (see infer::AttentionKernel)");
  static_assert(!(Backend<B> && Quantizer<Q, B> && AttentionKernel<Attn, B>),
                "LlamaModel<B, Q, Attn>: no decoder for this combination (infer::cuda needs a build with CUDA)");
};

template <class Q, class Attn>
  requires Quantizer<Q, cpu> && AttentionKernel<Attn, cpu>
class LlamaModel<cpu, Q, Attn> {
 public:
  /// Loads every weight (see load_llama_weights). Throws what the loaders throw, naming the tensor.
  /// From a model file, or from an engine file built for this Quantizer (its arrays copied in as they are).
  static LlamaModel load(const ModelSource& src) {
    require_group_for_split(src);
    auto weights = [&] {
      if (const EngineFile* file = src.engine_file()) {
        if constexpr (EngineFileWeights<Q, cpu>) return restore_llama_weights<Q>(*file);
        else throw UnsupportedError(detail::cat("quantizer ", Q::name, " cannot load engine files (its linear layers do not list their parts)"));
      }
      return load_llama_weights<Q, cpu>(src);
    };
    LlamaModel m(src.config(), weights());
    m.group_ = src.group();
    m.tp_ = src.tensor_parallel();
    return m;
  }

  /// Adds the weights to an engine file being written; `out.write()` must run while this model lives.
  void save(EngineFileWriter& out) const
    requires EngineFileWeights<Q, cpu>
  {
    save_llama_weights(w_, out);
  }

  [[nodiscard]] const ModelConfig& config() const noexcept { return config_; }

  /// KV-cache bytes one token occupies across all layers (K and V: f32, or e4m3 codes).
  [[nodiscard]] std::size_t kv_bytes_per_token(KvCacheDtype dtype = KvCacheDtype::automatic) const noexcept {
    return KvCache<cpu>::bytes_per_token(config_.num_layers, config_.num_kv_heads, config_.head_dim, dtype);
  }

  /// Computes every chunk (all chunks' tokens batched through the GEMMs), writes their K/V into
  /// `cache` (block size = cache.block_size()), and fills `logits` with [number of chunks with
  /// samples][vocab] rows in chunk order. With `scores`, also the log-probability of each row's
  /// `score_targets` token (one value per row of the step, in chunk order; NaN where not scored).
  /// InvalidArgument (nothing written) when a chunk is empty, holds a token outside the vocabulary, has
  /// score targets of the wrong count or outside the vocabulary, or reaches past its block table or the
  /// cache; a cache built for another shape; UnsupportedError past Mistral's sliding window (not implemented).
  void forward(std::span<const ForwardChunk> chunks, KvCache<cpu>& cache, std::vector<float>& logits,
               std::vector<float>* scores = nullptr) {
    const std::int64_t T = validate_step(config_, chunks, cache);
    for (const auto& c : chunks) {
      if (c.score_targets.empty()) continue;
      require<InvalidArgument>(c.score_targets.size() == c.tokens.size(), "LlamaModel::forward: ", c.score_targets.size(),
                               " score targets for a chunk of ", c.tokens.size(), " tokens");
      for (const std::int32_t t : c.score_targets)
        require<InvalidArgument>(t >= -1 && t < config_.vocab_size, "LlamaModel::forward: score target ", t,
                                 " is outside the vocabulary of ", config_.vocab_size);
    }
    const std::int64_t H = config_.hidden_size, qs = config_.q_size(), kvs = config_.kv_size();
    const std::int64_t inter = config_.intermediate_size, V = config_.vocab_size;
    grow(T);
    if (group_) check_same_step(*group_, chunks);

    // Embedding rows and positions, in chunk order.
    std::int64_t row = 0, samples = 0;
    for (const auto& c : chunks) {
      for (std::size_t i = 0; i < c.tokens.size(); ++i, ++row) {
        float* dst = &x_[static_cast<std::size_t>(row * H)];
        // A tensor-parallel rank holds rows [first, first + held) of the vocabulary: others are zeros here, and the
        // all-reduce below brings each row from its rank.
        const std::int64_t id = c.tokens[i] - tp_.vocab_first(V);
        if (id < 0 || id >= tp_.vocab_rows(V)) {
          std::fill(dst, dst + H, 0.0f);
        } else if constexpr (EmbeddingQuantizer<Q, cpu>) {
          Q::embed(w_.token_embd, static_cast<std::int32_t>(id), dst);
        } else {
          std::memcpy(dst, w_.token_embd.data() + static_cast<std::size_t>(id) * static_cast<std::size_t>(H),
                      static_cast<std::size_t>(H) * sizeof(float));
        }
        pos_[static_cast<std::size_t>(row)] = c.start + static_cast<std::int32_t>(i);
      }
      if (c.samples) sample_rows_[static_cast<std::size_t>(samples++)] = static_cast<std::int32_t>(row - 1);
    }
    sum_over_ranks(x_.data(), T * H);
    kernels::cpu::rope_table(pos_.data(), T, inv_freq_.data(), config_.head_dim / 2, cos_sin_.data());

    const auto rows = static_cast<std::int32_t>(T);
    for (std::size_t l = 0; l < w_.layers.size(); ++l) {
      const auto& L = w_.layers[l];
      const auto layer = static_cast<std::int32_t>(l);
      // ---- attention
      kernels::cpu::rms_norm(x_.data(), L.attn_norm.data(), xn_.data(), T, H, config_.rms_norm_eps);
      Q::matmul(cpu{}, L.q, xn_.data(), rows, q_.data());
      Q::matmul(cpu{}, L.k, xn_.data(), rows, k_.data());
      Q::matmul(cpu{}, L.v, xn_.data(), rows, v_.data());
      if (config_.attention_bias) {
        kernels::cpu::add_bias(q_.data(), L.q_bias.data(), T, qs);
        kernels::cpu::add_bias(k_.data(), L.k_bias.data(), T, kvs);
        kernels::cpu::add_bias(v_.data(), L.v_bias.data(), T, kvs);
      }
      kernels::cpu::rope(q_.data(), T, config_.num_heads, config_.head_dim, cos_sin_.data(), config_.rope_style);
      kernels::cpu::rope(k_.data(), T, config_.num_kv_heads, config_.head_dim, cos_sin_.data(), config_.rope_style);

      // Every chunk's K/V first, then every chunk's attention: a sequence admitted in this step may reuse
      // (prefix-cache hit) blocks that another chunk of this same step writes.
      if (cache.dtype() == KvCacheDtype::fp8_e4m3) {
        if constexpr (reads_fp8_kv_cache<Attn, cpu>) attend_layer<std::uint8_t>(chunks, cache, layer);
        else require_kv_cache_reader<Attn, cpu>(cache.dtype(), "LlamaModel");  // throws
      } else {
        attend_layer<float>(chunks, cache, layer);
      }
      Q::matmul(cpu{}, L.o, att_.data(), rows, tmp_.data());
      sum_over_ranks(tmp_.data(), T * H);
      kernels::cpu::add(x_.data(), tmp_.data(), static_cast<std::size_t>(T * H));

      // ---- MLP
      kernels::cpu::rms_norm(x_.data(), L.ffn_norm.data(), xn_.data(), T, H, config_.rms_norm_eps);
      Q::matmul(cpu{}, L.gate, xn_.data(), rows, gate_.data());
      Q::matmul(cpu{}, L.up, xn_.data(), rows, up_.data());
      kernels::cpu::swiglu(gate_.data(), up_.data(), static_cast<std::size_t>(T * inter));
      Q::matmul(cpu{}, L.down, gate_.data(), rows, tmp_.data());
      sum_over_ranks(tmp_.data(), T * H);
      kernels::cpu::add(x_.data(), tmp_.data(), static_cast<std::size_t>(T * H));
    }

    if (scores) score_rows(chunks, T, *scores);

    // ---- final norm and LM head, on the sampled rows only
    logits.resize(static_cast<std::size_t>(samples * V));
    if (samples == 0) return;
    for (std::int64_t s = 0; s < samples; ++s)
      std::memcpy(&last_[static_cast<std::size_t>(s * H)], &x_[static_cast<std::size_t>(sample_rows_[s] * H)],
                  static_cast<std::size_t>(H) * sizeof(float));
    kernels::cpu::rms_norm(last_.data(), w_.output_norm.data(), last_.data(), samples, H, config_.rms_norm_eps);
    head_logits(last_.data(), samples, logits.data());
  }

 private:
  /// The ranks' partial products summed in place (nothing without a tensor-parallel group).
  void sum_over_ranks(float* data, std::int64_t n) {
    if (group_) group_->all_reduce_sum(std::span<float>(data, static_cast<std::size_t>(n)));
  }

  /// logits [n][vocab] of n final hidden states (normed): the LM head, then, over a tensor-parallel group, every
  /// rank's block of the vocabulary gathered (TensorParallel::vocab_block columns a rank, padded on the last).
  void head_logits(const float* hidden, std::int64_t n, float* logits) {
    const auto rows = static_cast<std::int32_t>(n);
    if (!group_) {
      Q::matmul(cpu{}, w_.lm_head(), hidden, rows, logits);
      return;
    }
    const std::int64_t V = config_.vocab_size, held = tp_.vocab_rows(V), block = tp_.vocab_block(V);
    const auto nb = static_cast<std::size_t>(n * block);
    head_part_.resize(static_cast<std::size_t>(n * held));
    head_block_.assign(nb, 0.0f);
    if (held > 0) Q::matmul(cpu{}, w_.lm_head(), hidden, rows, head_part_.data());
    for (std::int64_t r = 0; r < n; ++r)
      std::copy_n(&head_part_[static_cast<std::size_t>(r * held)], held, &head_block_[static_cast<std::size_t>(r * block)]);
    head_gathered_.resize(nb * static_cast<std::size_t>(tp_.size));
    group_->all_gather(head_block_, head_gathered_);
    for (int k = 0; k < tp_.size; ++k) {
      const std::int64_t first = k * block, cols = std::min(block, V - first);
      for (std::int64_t r = 0; cols > 0 && r < n; ++r)
        std::copy_n(&head_gathered_[static_cast<std::size_t>(k) * nb + static_cast<std::size_t>(r * block)], cols,
                    logits + r * V + first);
    }
  }

  /// One layer's K/V rows of every chunk into the cache (f32 values, or e4m3 codes of value / scale), then
  /// every chunk's attention over it: q_, k_, v_ in, att_ out.
  template <class T>
  void attend_layer(std::span<const ForwardChunk> chunks, KvCache<cpu>& cache, std::int32_t layer) {
    constexpr bool kCodes = std::is_same_v<T, std::uint8_t>;
    const std::int64_t qs = config_.q_size(), kvs = config_.kv_size();
    const auto D = static_cast<std::size_t>(shape_.head_dim);
    const auto view_of = [&](const ForwardChunk& c) {
      if constexpr (kCodes) {
        auto view = Attn::template make_view<T>(cache.k_codes(layer), cache.v_codes(layer), c.block_table,
                                                cache.block_size(), shape_.num_kv_heads, shape_.head_dim);
        view.k_scale = cache.k_scale(layer);
        view.v_scale = cache.v_scale(layer);
        return view;
      } else {
        return Attn::template make_view<T>(cache.k(layer), cache.v(layer), c.block_table, cache.block_size(),
                                           shape_.num_kv_heads, shape_.head_dim);
      }
    };
    // Codes of value · (1 / scale), as rope_write_kv writes them on the GPU.
    const float ik = kCodes ? 1.0f / cache.k_scale(layer) : 1.0f, iv = kCodes ? 1.0f / cache.v_scale(layer) : 1.0f;
    std::int64_t first = 0;
    for (const auto& c : chunks) {
      const auto view = view_of(c);
      const auto n = static_cast<std::int32_t>(c.tokens.size());
      for (std::int32_t i = 0; i < n; ++i) {
        const auto r = static_cast<std::size_t>(first + i);
        for (std::int32_t h = 0; h < shape_.num_kv_heads; ++h) {
          const std::size_t off = r * static_cast<std::size_t>(kvs) + static_cast<std::size_t>(h) * D;
          if constexpr (kCodes) {
            std::uint8_t* kd = view.k_at(c.start + i, h);
            std::uint8_t* vd = view.v_at(c.start + i, h);
            for (std::size_t d = 0; d < D; ++d) {
              kd[d] = f32_to_e4m3(k_[off + d] * ik);
              vd[d] = f32_to_e4m3(v_[off + d] * iv);
            }
          } else {
            std::memcpy(view.k_at(c.start + i, h), &k_[off], D * sizeof(float));
            std::memcpy(view.v_at(c.start + i, h), &v_[off], D * sizeof(float));
          }
        }
      }
      first += n;
    }
    first = 0;
    for (const auto& c : chunks) {
      const auto n = static_cast<std::int32_t>(c.tokens.size());
      Attn::attend(cpu{}, shape_, &q_[static_cast<std::size_t>(first * qs)], &att_[static_cast<std::size_t>(first * qs)],
                   c.start, n, view_of(c));
      first += n;
    }
  }

  LlamaModel(const ModelConfig& c, LlamaWeights<Q, cpu> w)
      : config_(c), w_(std::move(w)), inv_freq_(rope_inv_freq(c)) {
    shape_.num_heads = static_cast<std::int32_t>(c.num_heads);
    shape_.num_kv_heads = static_cast<std::int32_t>(c.num_kv_heads);
    shape_.head_dim = static_cast<std::int32_t>(c.head_dim);
    shape_.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  }

  /// log p(target | row) for every row with a score target, from the final hidden states in x_: the rows
  /// go through the final norm and the LM head kScoreRows at a time (a whole prompt's logits would be
  /// rows × vocab floats), then a log-sum-exp per row, in double.
  void score_rows(std::span<const ForwardChunk> chunks, std::int64_t T, std::vector<float>& scores) {
    static constexpr std::int64_t kScoreRows = 32;
    const std::int64_t H = config_.hidden_size, V = config_.vocab_size;
    scores.assign(static_cast<std::size_t>(T), std::numeric_limits<float>::quiet_NaN());
    std::vector<std::int64_t> rows;
    std::vector<std::int32_t> targets;
    std::int64_t row = 0;
    for (const auto& c : chunks) {
      for (std::size_t i = 0; i < c.tokens.size(); ++i, ++row)
        if (!c.score_targets.empty() && c.score_targets[i] >= 0) {
          rows.push_back(row);
          targets.push_back(c.score_targets[i]);
        }
    }
    std::vector<float>& hidden = score_hidden_;  // members: a scoring step would otherwise allocate 32 x vocab floats
    std::vector<float>& out = score_logits_;
    hidden.resize(static_cast<std::size_t>(kScoreRows * H));
    out.resize(static_cast<std::size_t>(kScoreRows * V));
    for (std::size_t first = 0; first < rows.size(); first += kScoreRows) {
      const auto n = static_cast<std::int64_t>(std::min<std::size_t>(kScoreRows, rows.size() - first));
      for (std::int64_t r = 0; r < n; ++r)
        std::memcpy(&hidden[static_cast<std::size_t>(r * H)], &x_[static_cast<std::size_t>(rows[first + r] * H)],
                    static_cast<std::size_t>(H) * sizeof(float));
      kernels::cpu::rms_norm(hidden.data(), w_.output_norm.data(), hidden.data(), n, H, config_.rms_norm_eps);
      head_logits(hidden.data(), n, out.data());
      for (std::int64_t r = 0; r < n; ++r) {
        const float* l = &out[static_cast<std::size_t>(r * V)];
        const float top = *std::max_element(l, l + V);
        double sum = 0;
        for (std::int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v]) - top);
        scores[static_cast<std::size_t>(rows[first + r])] =
            static_cast<float>(static_cast<double>(l[targets[first + r]]) - top - std::log(sum));
      }
    }
  }

  /// Grows the scratch buffers to hold `T` token rows (never shrinks them).
  void grow(std::int64_t T) {
    if (T <= capacity_) return;
    const auto n = [&](std::int64_t width) { return static_cast<std::size_t>(T * width); };
    x_.resize(n(config_.hidden_size));
    xn_.resize(n(config_.hidden_size));
    tmp_.resize(n(config_.hidden_size));
    last_.resize(n(config_.hidden_size));
    q_.resize(n(config_.q_size()));
    att_.resize(n(config_.q_size()));
    k_.resize(n(config_.kv_size()));
    v_.resize(n(config_.kv_size()));
    gate_.resize(n(config_.intermediate_size));
    up_.resize(n(config_.intermediate_size));
    cos_sin_.resize(n(config_.head_dim));
    pos_.resize(n(1));
    sample_rows_.resize(n(1));
    capacity_ = T;
  }

  ModelConfig config_;
  LlamaWeights<Q, cpu> w_;
  std::vector<float> inv_freq_;
  AttentionShape shape_;

  std::int64_t capacity_ = 0;  ///< token rows the scratch buffers hold
  std::vector<float> x_, xn_, tmp_, last_, q_, att_, k_, v_, gate_, up_, cos_sin_;
  std::vector<float> score_hidden_, score_logits_;  ///< score_rows' batch of final hidden states and their logits
  dist::Group* group_ = nullptr;  ///< the tensor-parallel group, or none (one process holds the whole model)
  TensorParallel tp_;
  std::vector<float> head_part_, head_block_, head_gathered_;  ///< head_logits' rank-local and gathered logits
  std::vector<std::int32_t> pos_, sample_rows_;
};

}  // namespace infer

#if defined(INFER_HAVE_CUDA)
#include "infer/model/llama_cuda.hpp"
#endif

namespace infer {

/// The Model tag of `Engine<Backend, Model, ...>`: the Llama-family decoder.
struct llama {
  template <class B, class Q, class Attn>
  using decoder = LlamaModel<B, Q, Attn>;
};

}  // namespace infer
