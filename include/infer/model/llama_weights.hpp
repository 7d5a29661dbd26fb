#pragma once
/// \file
/// The weights of the Llama-family decoder, loaded from a ModelSource by canonical role. Every linear
/// layer goes through the Quantizer (`Q::load<B>`), which decides its storage — the LM head too, tied or
/// not. The token embedding goes through it as well when the Quantizer can look rows up
/// (EmbeddingQuantizer: `Q::embed`), and a tied LM head is then that same weight; otherwise the embedding
/// is decoded to f32 once (it may be quantized in the file, e.g. Q8_0 in SmolLM2) and a tied head is a
/// second load of the same tensor through Q. Norms and biases are decoded to f32. Every shape is checked (by the
/// Quantizer itself for one that loads by role, quant/linear_request.hpp)
/// against the ModelConfig here, so the forward pass can trust them.

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/linear_request.hpp"
#include "infer/quant/weight_tensor.hpp"

namespace infer {

/// One decoder layer. Biases are empty unless the config has attention_bias (Qwen2).
template <class Q, class B>
struct LlamaLayerWeights {
  std::vector<float> attn_norm;  ///< [hidden]
  typename Q::template linear<B> q, k, v, o;
  std::vector<float> q_bias, k_bias, v_bias;  ///< [q_size], [kv_size], [kv_size]
  std::vector<float> ffn_norm;                ///< [hidden]
  typename Q::template linear<B> gate, up, down;
};

/// The token embedding's storage: the Quantizer's when it can look rows up, else dense f32.
template <class Q, class B>
using embedding_linear_t = std::conditional_t<EmbeddingQuantizer<Q, B>, typename Q::template linear<B>, F32::linear<cpu>>;

/// Host-side (B = cpu) weights. The embedding is a linear [vocab][hidden] whose rows are gathered for the
/// input.
template <class Q, class B>
struct LlamaWeights {
  embedding_linear_t<Q, B> token_embd;
  std::vector<float> output_norm;                       ///< [hidden]
  std::optional<typename Q::template linear<B>> output;  ///< the LM head; nullopt: tied to a token_embd Q holds
  std::vector<LlamaLayerWeights<Q, B>> layers;

  /// The LM head [vocab][hidden], through the Quantizer in every case.
  [[nodiscard]] const typename Q::template linear<B>& lm_head() const {
    if constexpr (EmbeddingQuantizer<Q, B>) return output ? *output : token_embd;
    else return *output;
  }
};

namespace detail {

inline std::string shape_text(const std::vector<std::uint64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// FormatError naming the model, the tensor, and both shapes.
[[noreturn]] inline void wrong_shape(const ModelSource& src, const WeightTensor& t, std::string_view role,
                                     const std::string& expected) {
  throw FormatError(cat(src.describe(), ": tensor '", t.name, "' (", role, ") has shape ", shape_text(t.shape),
                        ", expected ", expected, " from the model config"));
}

/// A 1-D f32 vector of `n` values (a norm weight or a bias).
inline std::vector<float> load_vector(const ModelSource& src, const std::string& role, std::int64_t n) {
  const WeightTensor t = src.get(role);
  if (t.elements() != static_cast<std::uint64_t>(n) || t.shape.size() != 1)
    wrong_shape(src, t, role, cat("[", n, "]"));
  std::vector<float> v(static_cast<std::size_t>(n));
  dequantize_to_f32(t, v);
  return v;
}

/// A linear layer [out, in] of `role` through the Quantizer (load_linear: by role, or its checked tensor).
template <class Q, class B>
typename Q::template linear<B> load_linear(const ModelSource& src, const std::string& role, std::int64_t out,
                                           std::int64_t in, typename BackendTraits<B>::weight_store& store) {
  return infer::load_linear<Q, B>(LinearRequest{src, role, out, in}, store);
}

}  // namespace detail

/// Loads every weight of the decoder described by `src.config()` on the CPU. NotFoundError names a
/// missing tensor, FormatError one of the wrong shape; InvalidArgument/UnsupportedError come from Q::load.
/// (The GPU decoder has its own loader, model/llama_cuda_weights.hpp: it stores fused projections in one arena.)
template <class Q, class B>
  requires Quantizer<Q, B> && std::same_as<B, cpu>
LlamaWeights<Q, B> load_llama_weights(const ModelSource& src) {
  using detail::cat;
  cpu store;
  const ModelConfig& c = src.config();
  const std::int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  LlamaWeights<Q, B> w;
  if constexpr (EmbeddingQuantizer<Q, B>) w.token_embd = detail::load_linear<Q, B>(src, "token_embd", c.vocab_size, hidden, store);
  else w.token_embd = detail::load_linear<F32, cpu>(src, "token_embd", c.vocab_size, hidden, store);
  w.output_norm = detail::load_vector(src, "output_norm", hidden);
  if (!c.tie_word_embeddings) w.output.emplace(detail::load_linear<Q, B>(src, "output", c.vocab_size, hidden, store));
  else if constexpr (!EmbeddingQuantizer<Q, B>)  // tied, and Q cannot serve the embedding: the head alone through Q
    w.output.emplace(detail::load_linear<Q, B>(src, "token_embd", c.vocab_size, hidden, store));
  w.layers.reserve(static_cast<std::size_t>(c.num_layers));
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const auto role = [&](const char* name) { return cat("blk.", i, ".", name); };
    auto bias = [&](const char* name, std::int64_t n) {
      return c.attention_bias ? detail::load_vector(src, role(name), n) : std::vector<float>{};
    };
    w.layers.push_back(LlamaLayerWeights<Q, B>{
        .attn_norm = detail::load_vector(src, role("attn_norm"), hidden),
        .q = detail::load_linear<Q, B>(src, role("attn_q"), c.q_size(), hidden, store),
        .k = detail::load_linear<Q, B>(src, role("attn_k"), c.kv_size(), hidden, store),
        .v = detail::load_linear<Q, B>(src, role("attn_v"), c.kv_size(), hidden, store),
        .o = detail::load_linear<Q, B>(src, role("attn_output"), hidden, c.q_size(), store),
        .q_bias = bias("attn_q.bias", c.q_size()),
        .k_bias = bias("attn_k.bias", c.kv_size()),
        .v_bias = bias("attn_v.bias", c.kv_size()),
        .ffn_norm = detail::load_vector(src, role("ffn_norm"), hidden),
        .gate = detail::load_linear<Q, B>(src, role("ffn_gate"), inter, hidden, store),
        .up = detail::load_linear<Q, B>(src, role("ffn_up"), inter, hidden, store),
        .down = detail::load_linear<Q, B>(src, role("ffn_down"), hidden, inter, store),
    });
  }
  return w;
}

}  // namespace infer
