#pragma once
/// \file
/// Small models for tests: `tiny_model()` is a Llama-shaped `ModelSource` with seeded random weights
/// (model/dummy.hpp) — no file, no download, a few milliseconds per step on the CPU — to run an engine
/// composed with a policy of your own:
///
/// ```cpp
/// infer::Engine<infer::cpu, infer::llama, infer::PagedBlockAllocator<16>, MyScheduler,
///               infer::PagedAttention<>, infer::F32> engine(infer::testing::tiny_model(), {});
/// engine.add_request(std::vector<std::int32_t>{5, 6, 7}, params);   // token ids: it has no tokenizer
/// ```
///
/// `small_llama()` and `small_qwen2()` are its shapes (and a Qwen2 one): big enough to exercise every
/// kernel path of the CUDA decoder (GQA, both head widths it supports, Qwen2's biases and tied
/// embeddings), small enough for the CPU reference to run many steps in a test.
#include <cstdint>
#include <string>
#include <utility>

#include "infer/model/model_config.hpp"
#include "infer/model/model_source.hpp"

namespace infer::testing {

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

/// A model of `config`'s shape (small_llama() unless given: 512 token ids, EOS id 1) with weights drawn
/// from `seed`, and no tokenizer.
inline ModelSource tiny_model(std::uint64_t seed = 0, ModelConfig config = small_llama()) {
  std::string label = "tiny " + config.architecture;
  return ModelSource::dummy(std::move(config), seed, std::move(label));
}

}  // namespace infer::testing
