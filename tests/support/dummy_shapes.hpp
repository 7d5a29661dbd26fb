#pragma once
/// Small model shapes for dummy-weight tests (model/dummy.hpp): big enough to exercise every kernel
/// path of the CUDA decoder (GQA, both head widths it supports, Qwen2's biases and tied embeddings),
/// small enough for the CPU reference to run many steps in a test.
#include "infer/model/model_config.hpp"

namespace infer::test {

inline ModelConfig small_llama() {
  ModelConfig c;
  c.family = ModelFamily::llama;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;  // GQA 2:1
  c.head_dim = 64;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = 512;
  c.eos_token_ids = {1};
  c.validate();
  return c;
}

inline ModelConfig small_qwen2() {
  ModelConfig c = small_llama();
  c.family = ModelFamily::qwen2;
  c.architecture = "Qwen2ForCausalLM";
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 128;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  c.rope_theta = 1000000.0f;
  c.validate();
  return c;
}

}  // namespace infer::test
