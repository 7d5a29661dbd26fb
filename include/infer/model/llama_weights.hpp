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
#include "infer/io/engine_file.hpp"
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

/// A linear layer [out, in] of `role` through the Quantizer (load_linear: by role, or its checked tensor);
/// `lm_head` tells a role-loading Quantizer that this is the LM head (LinearRequest::lm_head).
template <class Q, class B>
typename Q::template linear<B> load_linear(const ModelSource& src, const std::string& role, std::int64_t out,
                                           std::int64_t in, typename BackendTraits<B>::weight_store& store,
                                           bool lm_head = false) {
  return infer::load_linear<Q, B>(LinearRequest{src, role, out, in, lm_head}, store);
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
  // A tensor-parallel shard holds its rows of the vocabulary (ModelSource::shard); a whole model all of them.
  const std::int64_t vocab = src.tensor_parallel().vocab_rows(c.vocab_size);
  LlamaWeights<Q, B> w;
  if constexpr (EmbeddingQuantizer<Q, B>) w.token_embd = detail::load_linear<Q, B>(src, "token_embd", vocab, hidden, store);
  else w.token_embd = detail::load_linear<F32, cpu>(src, "token_embd", vocab, hidden, store);
  w.output_norm = detail::load_vector(src, "output_norm", hidden);
  if (!c.tie_word_embeddings) w.output.emplace(detail::load_linear<Q, B>(src, "output", vocab, hidden, store, true));
  else if constexpr (!EmbeddingQuantizer<Q, B>)  // tied, and Q cannot serve the embedding: the head alone through Q
    w.output.emplace(detail::load_linear<Q, B>(src, "token_embd", vocab, hidden, store, true));
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

/// Calls `visit(role, x)` for every array of `w` in a fixed order: each linear layer (the embedding and the
/// LM head included) as its Quantizer's linear, each norm and bias as a `std::vector<float>`. `W` is
/// LlamaWeights or const LlamaWeights. The engine file saves and restores weights through it.
template <class W, class Visit>
void visit_llama_weights(W& w, Visit&& visit) {
  using detail::cat;
  visit(std::string("token_embd"), w.token_embd);
  visit(std::string("output_norm"), w.output_norm);
  if (w.output) visit(std::string("output"), *w.output);
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    auto& L = w.layers[i];
    const auto role = [&](const char* name) { return cat("blk.", i, ".", name); };
    visit(role("attn_norm"), L.attn_norm);
    visit(role("attn_q"), L.q);
    visit(role("attn_k"), L.k);
    visit(role("attn_v"), L.v);
    visit(role("attn_output"), L.o);
    visit(role("attn_q.bias"), L.q_bias);
    visit(role("attn_k.bias"), L.k_bias);
    visit(role("attn_v.bias"), L.v_bias);
    visit(role("ffn_norm"), L.ffn_norm);
    visit(role("ffn_gate"), L.gate);
    visit(role("ffn_up"), L.up);
    visit(role("ffn_down"), L.down);
  }
}

/// Whether every array of the decoder's weights in Quantizer Q can go into an engine file.
template <class Q, class B>
concept EngineFileWeights = requires(const embedding_linear_t<Q, B>& e, const typename Q::template linear<B>& l,
                                     EnginePartSaver& s) {
  embedding_linear_t<Q, B>::visit_parts(e, s);
  Q::template linear<B>::visit_parts(l, s);
  { l.consistent() } -> std::convertible_to<bool>;
};

/// Adds every array of `w` to `out` as parts named `<role>.<member>` (a norm or bias: `<role>.values`).
/// The arrays are borrowed: `w` must outlive out.write().
template <class Q>
  requires EngineFileWeights<Q, cpu>
void save_llama_weights(const LlamaWeights<Q, cpu>& w, EngineFileWriter& out) {
  visit_llama_weights(w, [&](const std::string& role, const auto& x) {
    EnginePartSaver saver{out, role + "."};
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::vector<float>>) saver("values", x);
    else std::decay_t<decltype(x)>::visit_parts(x, saver);
  });
}

/// The weights an engine file holds, for Quantizer Q on the CPU: its arrays copied out of the file as they
/// are (no decoding, no quantization), then every size checked against the file's ModelConfig.
/// FormatError naming the file when it was built for another Quantizer, or a part is missing, of another
/// type or of a size the config does not imply.
template <class Q>
  requires EngineFileWeights<Q, cpu>
LlamaWeights<Q, cpu> restore_llama_weights(const EngineFile& file) {
  using detail::cat;
  const EngineFileInfo& info = file.info();
  const std::string where = cat("engine file '", file.path().string(), "'");
  file.require_quantizer_layout(Q::name);
  const ModelConfig& c = info.config;
  LlamaWeights<Q, cpu> w;
  const bool tied_in_embedding = c.tie_word_embeddings && EmbeddingQuantizer<Q, cpu>;
  if (!tied_in_embedding) w.output.emplace();
  w.layers.resize(static_cast<std::size_t>(c.num_layers));
  visit_llama_weights(w, [&](const std::string& role, auto& x) {
    EnginePartLoader loader{file, role + "."};
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::vector<float>>) loader("values", x);
    else std::decay_t<decltype(x)>::visit_parts(x, loader);
  });
  // Every size the forward pass trusts, checked once.
  // A rank's file (EngineFileInfo::tensor_parallel): its block of the vocabulary.
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = info.tensor_parallel.vocab_rows(c.vocab_size),
                     qs = c.q_size(), kvs = c.kv_size();
  auto linear = [&](const std::string& role, const auto& l, std::int64_t out, std::int64_t in) {
    if (!l.consistent() || l.out() != out || l.in() != in)
      throw FormatError(cat(where, ": weight '", role, "' is [", l.out(), ", ", l.in(), "] with arrays that ",
                            l.consistent() ? "agree" : "do not agree", "; the config implies [", out, ", ", in, "]"));
  };
  auto vec = [&](const std::string& role, const std::vector<float>& v, std::int64_t n) {
    if (static_cast<std::int64_t>(v.size()) != n)
      throw FormatError(cat(where, ": '", role, "' holds ", v.size(), " values; the config implies ", n));
  };
  linear("token_embd", w.token_embd, V, H);
  vec("output_norm", w.output_norm, H);
  if (w.output) linear("output", *w.output, V, H);
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const auto& L = w.layers[i];
    const auto role = [&](const char* name) { return cat("blk.", i, ".", name); };
    vec(role("attn_norm"), L.attn_norm, H);
    vec(role("ffn_norm"), L.ffn_norm, H);
    linear(role("attn_q"), L.q, qs, H);
    linear(role("attn_k"), L.k, kvs, H);
    linear(role("attn_v"), L.v, kvs, H);
    linear(role("attn_output"), L.o, H, qs);
    linear(role("ffn_gate"), L.gate, I, H);
    linear(role("ffn_up"), L.up, I, H);
    linear(role("ffn_down"), L.down, H, I);
    vec(role("attn_q.bias"), L.q_bias, c.attention_bias ? qs : 0);
    vec(role("attn_k.bias"), L.k_bias, c.attention_bias ? kvs : 0);
    vec(role("attn_v.bias"), L.v_bias, c.attention_bias ? kvs : 0);
  }
  return w;
}

}  // namespace infer
