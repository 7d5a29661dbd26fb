#pragma once
// A small GGUF of mixed block types, random blocks, for the GPU decoder's test (tests/cuda/test_cuda_model.cpp)
// and the CPU check that its rounding model holds on it (tests/unit/model/test_rounding_noise.cpp).

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/io/gguf.hpp"
#include "infer/quant/dequantize.hpp"
#include "support/gguf_writer.hpp"
#include "support/random_tensor.hpp"
#include "support/test_seed.hpp"

namespace infer::test {

/// A 2-layer Llama GGUF whose tensors mix every kind of block layout the way llama.cpp's mixes do: q and k in
/// Q4_K beside v in Q6_K (a stack of different types, loaded as parts), o in Q5_0, gate/up in Q4_0 (one
/// stack), down in IQ4_XS (layer 0) and Q5_K (layer 1), the embedding in Q8_0, the head in Q6_K; random
/// blocks with finite scales, norms 1.
inline std::filesystem::path write_mixed_gguf() {
  constexpr std::uint32_t H = 256, I = 512, V = 512, heads = 4, kv_heads = 2, D = H / heads, layers = 2;
  test::GgufWriter g;
  g.add("general.architecture", gguf::Value{std::string("llama")});
  g.add("llama.block_count", gguf::Value{layers});
  g.add("llama.context_length", gguf::Value{std::uint32_t{512}});
  g.add("llama.embedding_length", gguf::Value{H});
  g.add("llama.feed_forward_length", gguf::Value{I});
  g.add("llama.attention.head_count", gguf::Value{heads});
  g.add("llama.attention.head_count_kv", gguf::Value{kv_heads});
  g.add("llama.attention.layer_norm_rms_epsilon", gguf::Value{1e-5f});
  g.add("llama.rope.freq_base", gguf::Value{10000.0f});
  g.add("llama.vocab_size", gguf::Value{V});
  std::mt19937 rng(test_seed("mixed-type GGUF"));
  const auto ggml_id = [](DType t) -> std::uint32_t {
    switch (t) {
      case DType::q4_0: return 2;
      case DType::q5_0: return 6;
      case DType::q8_0: return 8;
      case DType::q4_k: return 12;
      case DType::q5_k: return 13;
      case DType::q6_k: return 14;
      case DType::iq4_xs: return 23;
      default: FAIL("no ggml id for " << name(t)); return 0;
    }
  };
  // Random codes with random scales make weights of every size: Q4_K's d·sc·q reaches tens, Q6_K's and
  // IQ4_XS's too. Through two layers that gave logits in the thousands and attention so peaked that one int8
  // rounding of the prefill's activations moved a decode row by 12-42 σ of the derived bound, on the CPU's
  // exact reproduction of the GPU's roundings as on the GPU (2026-12-06, test_rounding_noise's measure on
  // this file): a discontinuity, not a rounding error. So each tensor's f16 scales are scaled to give its
  // values the size of a trained layer's, RMS 1/√in (1 for the embedding), keeping the random codes.
  const auto blocks = [&](const std::string& n, DType t, std::uint64_t in, std::uint64_t out, double rms) {
    auto b = test::random_tensor(t, static_cast<std::size_t>(in * out), rng);
    std::vector<float> v(static_cast<std::size_t>(in * out));
    kernels::cpu::dequantize(t, b, v);
    double sq = 0;
    for (float x : v) sq += static_cast<double>(x) * x;
    const double scale = rms / std::sqrt(sq / static_cast<double>(v.size()));
    const DTypeInfo ti = info(t);
    for (std::size_t blk = 0; blk < v.size() / ti.block_elems; ++blk)
      for (std::size_t off : test::scale_offsets(t)) {
        std::uint16_t h;
        std::memcpy(&h, b.data() + blk * ti.block_bytes + off, 2);
        h = f32_to_f16(static_cast<float>(f16_to_f32(h) * scale));
        std::memcpy(b.data() + blk * ti.block_bytes + off, &h, 2);
      }
    g.tensor(n, ggml_id(t), {in, out}, b);
  };
  const auto linear = [&](const std::string& n, DType t, std::uint64_t in, std::uint64_t out) {
    blocks(n, t, in, out, 1.0 / std::sqrt(static_cast<double>(in)));
  };
  const std::vector<float> ones(H, 1.0f);
  blocks("token_embd.weight", DType::q8_0, H, V, 1.0);
  g.tensor_f32("output_norm.weight", {H}, ones);
  linear("output.weight", DType::q6_k, H, V);
  for (std::uint32_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    g.tensor_f32(p + "attn_norm.weight", {H}, ones);
    g.tensor_f32(p + "ffn_norm.weight", {H}, ones);
    linear(p + "attn_q.weight", DType::q4_k, H, H);
    linear(p + "attn_k.weight", DType::q4_k, H, kv_heads * D);
    linear(p + "attn_v.weight", DType::q6_k, H, kv_heads * D);
    linear(p + "attn_output.weight", DType::q5_0, H, H);
    linear(p + "ffn_gate.weight", DType::q4_0, H, I);
    linear(p + "ffn_up.weight", DType::q4_0, H, I);
    linear(p + "ffn_down.weight", l == 0 ? DType::iq4_xs : DType::q5_k, I, H);
  }
  const auto bytes = g.build();
  const auto path = std::filesystem::temp_directory_path() / detail::cat("infer-mixed-", ::getpid(), ".gguf");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                               static_cast<std::streamsize>(bytes.size()));
  return path;
}


}  // namespace infer::test
