#pragma once
/// \file
/// `ModelConfig` from a GGUF file's metadata (general.architecture "llama" or "qwen2"; llama.cpp
/// converts Mistral and SmolLM checkpoints to "llama", so those arrive as family llama).
///
/// Keys are `<arch>.<name>` as llama.cpp writes them. What GGUF does not store as metadata is read
/// from the tensor list, the way llama.cpp itself decides it: the embeddings are tied when there is
/// no `output.weight`, and the attention has q/k/v biases when `blk.0.attn_q.bias` exists.
/// Missing required keys throw NotFoundError and wrongly typed ones FormatError (both from
/// gguf::File, naming file and key); an architecture or RoPE variant the decoder does not implement
/// throws UnsupportedError.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "infer/core/error.hpp"
#include "infer/io/gguf.hpp"
#include "infer/model/model_config.hpp"

namespace infer {

/// Reads and validates the config of a GGUF model.
[[nodiscard]] inline ModelConfig from_gguf(const gguf::File& f) {
  using detail::cat;
  const std::string src = cat("GGUF '", f.source(), "'");
  const std::string arch(f.architecture());
  ModelConfig c;
  // llama.cpp's converter permutes llama q/k rows to adjacent-pair RoPE; qwen2 keeps HF's layout.
  if (arch == "llama") {
    c.family = ModelFamily::llama;
    c.rope_style = RopeStyle::interleaved;
  } else if (arch == "qwen2") {
    c.family = ModelFamily::qwen2;
    c.rope_style = RopeStyle::neox;
  } else {
    throw UnsupportedError(cat(src, ": general.architecture '", arch, "' is not supported (supported: llama, qwen2)"));
  }
  c.architecture = arch;
  const auto key = [&](std::string_view k) { return cat(arch, ".", k); };
  const auto get_int = [&](std::string_view k) { return f.get<std::int64_t>(key(k)); };
  const auto opt_int = [&](std::string_view k) { return f.get_optional<std::int64_t>(key(k)); };

  c.num_layers = get_int("block_count");
  c.max_position_embeddings = get_int("context_length");
  c.hidden_size = get_int("embedding_length");
  c.intermediate_size = get_int("feed_forward_length");
  c.num_heads = get_int("attention.head_count");
  c.num_kv_heads = opt_int("attention.head_count_kv").value_or(c.num_heads);  // absent: no GQA (as llama.cpp)
  // head_dim: attention.key_length when the converter wrote it, else hidden / heads.
  if (c.num_heads <= 0)
    throw FormatError(cat(src, ": ", key("attention.head_count"), " = ", c.num_heads, " must be positive"));
  c.head_dim = opt_int("attention.key_length").value_or(c.hidden_size / c.num_heads);
  if (auto rope_dim = opt_int("rope.dimension_count"); rope_dim && *rope_dim != c.head_dim)
    throw UnsupportedError(cat(src, ": ", key("rope.dimension_count"), " = ", *rope_dim, " differs from head_dim ",
                               c.head_dim, "; partial rotary embeddings are not supported"));
  c.rope_theta = f.get_optional<float>(key("rope.freq_base")).value_or(10000.0f);  // llama.cpp's default
  c.rms_norm_eps = f.get<float>(key("attention.layer_norm_rms_epsilon"));

  // Vocabulary: <arch>.vocab_size when present, else the tokenizer's token list (counted, not copied).
  if (auto v = opt_int("vocab_size")) {
    c.vocab_size = *v;
  } else if (const gguf::Value* tokens = f.find("tokenizer.ggml.tokens")) {
    const gguf::Array* a = tokens->as_array();
    if (!a) throw FormatError(cat(src, ": tokenizer.ggml.tokens must be an array of strings"));
    c.vocab_size = static_cast<std::int64_t>(a->items.size());
  } else {
    throw NotFoundError(cat(src, ": neither ", key("vocab_size"), " nor tokenizer.ggml.tokens gives the vocabulary size"));
  }

  // RoPE scaling: rope.scaling.type + rope.scaling.factor, or the older rope.scale_linear.
  const auto scaling = f.get_optional<std::string>(key("rope.scaling.type"));
  if (scaling && *scaling == "linear") {
    c.rope_scaling.kind = RopeScaling::Kind::linear;
    c.rope_scaling.factor = f.get<float>(key("rope.scaling.factor"));
  } else if (scaling && *scaling != "none") {
    throw UnsupportedError(cat(src, ": ", key("rope.scaling.type"), " '", *scaling,
                               "' is not supported (supported: none, linear)"));
  } else if (auto lin = f.get_optional<float>(key("rope.scale_linear")); !scaling && lin && *lin != 1.0f) {
    c.rope_scaling.kind = RopeScaling::Kind::linear;
    c.rope_scaling.factor = *lin;
  }
  // Llama 3.1 GGUFs carry their RoPE scaling as precomputed per-frequency divisors in a tensor,
  // not as metadata; ignoring it would change every position's rotation.
  if (f.find_tensor("rope_freqs.weight"))
    throw UnsupportedError(cat(src, ": has a rope_freqs.weight tensor (per-frequency RoPE factors, as converted ",
                               "from Llama 3.1 rope_scaling); this is not supported yet"));

  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;

  c.bos_token_id = f.get_optional<std::int64_t>("tokenizer.ggml.bos_token_id");
  if (auto eos = f.get_optional<std::int64_t>("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {*eos};

  try {
    c.validate();
  } catch (const FormatError& e) {
    throw FormatError(cat(src, ": ", e.what()));
  }
  return c;
}

}  // namespace infer
