#pragma once
/// \file
/// Dummy models: the exact shape of a real model with seeded random weights, so that large shapes
/// (Llama-3-8B, Qwen2.5-7B) can be measured with no download — vLLM's `load_format=dummy`. Same bytes
/// moved and FLOPs done as the real model; the tokens are meaningless.
///
/// Weight i of a tensor is `dummy_value(seed, i, center, spread)`: a counter-based hash, so any backend
/// computes any element independently (the GPU fills 16 GB in well under a second) and the CPU and the
/// GPU build bit-identical models from the same seed (both round the value to bf16), which is what the
/// [cuda] tests compare. The spreads keep activations of a deep random model in a sane range: a linear
/// layer's weights are uniform in ±sqrt(3 / in) (unit gain), norms are 1 ± 0.05, biases ±0.02.

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "infer/core/error.hpp"
#include "infer/core/macros.hpp"
#include "infer/model/model_config.hpp"

namespace infer {

/// Element `i` of a dummy weight: center + spread · u with u uniform in [-1, 1) (24 random bits).
INFER_HD float dummy_value(std::uint64_t seed, std::uint64_t i, float center, float spread) {
  std::uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(static_cast<std::uint32_t>(z >> 40)) * (1.0f / 8388608.0f) - 1.0f;
  return center + spread * u;
}

/// The index in the whole tensor of element j of a slice of it, `cols` values a row (DummyFill's row0, col0 and
/// full_cols; full_cols 0: j itself).
INFER_HD std::uint64_t dummy_index(std::uint64_t j, std::uint64_t cols, std::uint64_t row0, std::uint64_t col0,
                                   std::uint64_t full_cols) {
  if (full_cols == 0) return j;
  return (row0 + j / cols) * full_cols + col0 + j % cols;
}

/// The names `dummy_preset` knows, for messages and --help.
inline constexpr std::string_view kDummyPresets = "llama3-8b, llama3-70b, qwen2.5-7b, smollm2-135m";

/// The shape of a known model. InvalidArgument listing the presets for an unknown name.
inline ModelConfig dummy_preset(std::string_view name) {
  ModelConfig c;
  if (name == "llama3-8b") {
    c.family = ModelFamily::llama;
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 500000.0f;
    c.rms_norm_eps = 1e-5f;
    c.max_position_embeddings = 8192;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001, 128009};
  } else if (name == "llama3-70b") {  // the multi-GPU runs' shape: 70.6 GB of weights in FP8, 141 in bf16
    c = dummy_preset("llama3-8b");       // the same family, vocabulary, RoPE and tokens; wider and deeper
    c.hidden_size = 8192;
    c.intermediate_size = 28672;
    c.num_layers = 80;
    c.num_heads = 64;
  } else if (name == "qwen2.5-7b") {
    c.family = ModelFamily::qwen2;
    c.architecture = "Qwen2ForCausalLM";
    c.vocab_size = 152064;
    c.hidden_size = 3584;
    c.intermediate_size = 18944;
    c.num_layers = 28;
    c.num_heads = 28;
    c.num_kv_heads = 4;
    c.head_dim = 128;
    c.rope_theta = 1000000.0f;
    c.rms_norm_eps = 1e-6f;
    c.max_position_embeddings = 32768;
    c.attention_bias = true;
    c.eos_token_ids = {151645, 151643};
  } else if (name == "smollm2-135m") {
    c.family = ModelFamily::llama;
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_layers = 30;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.head_dim = 64;
    c.rope_theta = 100000.0f;
    c.rms_norm_eps = 1e-5f;
    c.max_position_embeddings = 8192;
    c.tie_word_embeddings = true;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else {
    throw InvalidArgument(detail::cat("unknown dummy model '", name, "': use one of ", kDummyPresets,
                                      ", or the path of a Hugging Face config.json"));
  }
  c.rope_style = RopeStyle::neox;
  c.validate();
  return c;
}

/// A preset name, or the path of a Hugging Face config.json (a file ending in .json) describing any
/// Llama-family shape. Errors as dummy_preset / the config reader.
ModelConfig dummy_config(std::string_view name_or_json);

}  // namespace infer
