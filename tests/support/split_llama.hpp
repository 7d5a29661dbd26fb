#pragma once
// A small Llama shape for the tensor-parallel tests: heads, KV heads and MLP split over 2 and 4 ranks, the
// vocabulary does not (101: blocks of 51 and 26, the last rank's fewer), and the context holds a prompt long enough
// to cross the lockstep engine's inline broadcast.
#include "infer/engine/presets.hpp"
#include "infer/model/dummy.hpp"

namespace infer::test {

inline ModelConfig split_llama() {
  ModelConfig c = dummy_preset("smollm2-135m");
  c.vocab_size = 101;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = false;
  c.bos_token_id.reset();
  c.eos_token_ids.clear();
  return c;
}

}  // namespace infer::test
