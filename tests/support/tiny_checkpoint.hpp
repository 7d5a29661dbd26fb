#pragma once
/// The tiny Llama fixture rewritten as another checkpoint (its linear layers in a quantized layout, or
/// dequantized to f32), FP8 and INT8 checkpoints' layouts of a weight, and a model's logits over a prompt: what the
/// quantizer and tensor-parallel tests compare.
#include <algorithm>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "infer/attention/paged_attention.hpp"
#include "infer/core/fp8.hpp"
#include "infer/model/llama.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/fp8.hpp"
#include "infer/quant/int8_weight_only.hpp"
#include "support/fixtures.hpp"
#include "support/safetensors_writer.hpp"
#include "unit/engine/engine_test_support.hpp"

namespace infer::test {

/// A copy of the tiny Llama fixture's folder whose linear layers are given by `linear(name, f32 values,
/// out, in)` (returning the entries to write for that weight); every other tensor as f32. The LM head is
/// written as f32 too, as quantized checkpoints ship it (GPTQ, AWQ, ModelOpt and compressed-tensors leave
/// `lm_head` out), unless `quantized_head`. `extra`: more tensors to write (e.g. KV-cache scales).
template <class F>
std::filesystem::path rewrite_tiny_llama(const std::string& dir_name, F&& linear, bool quantized_head = false,
                                         std::vector<SafetensorsEntry> extra = {}) {
  const ModelSource src = ModelSource::open(fixture("tiny_llama"));
  const ModelConfig& c = src.config();
  const auto dir = std::filesystem::temp_directory_path() / dir_name;
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture("tiny_llama") / "config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<SafetensorsEntry> entries;
  auto add = [&](const std::string& role, bool is_linear) {
    const WeightTensor t = src.get(role);
    std::vector<float> v(static_cast<std::size_t>(t.elements()));
    dequantize_to_f32(t, v);
    const std::string name = src.file_name(role);
    if (is_linear) {
      for (auto& e : linear(name, v, static_cast<std::int64_t>(t.shape[0]), static_cast<std::int64_t>(t.shape[1])))
        entries.push_back(std::move(e));
    } else {
      entries.push_back(SafetensorsEntry::of<float>(name, "F32", t.shape, v));
    }
  };
  add("token_embd", false);
  add("output_norm", false);
  add("output", quantized_head);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const auto role = [&](const char* n) { return detail::cat("blk.", i, ".", n); };
    for (const char* n : {"attn_norm", "ffn_norm"}) add(role(n), false);
    for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) add(role(n), true);
  }
  for (auto& e : extra) entries.push_back(std::move(e));
  write_safetensors(dir / "model.safetensors", entries);
  return dir;
}

/// The logits of every position of `prompt` (one decode step each) from `model` loaded through Q.
template <class Q>
std::vector<float> prompt_logits(const std::filesystem::path& model, const Tokens& prompt) {
  auto m = LlamaModel<cpu, Q, PagedAttention<>>::load(ModelSource::open(model));
  const ModelConfig& c = m.config();
  KvCache<cpu> cache(static_cast<std::int32_t>(c.num_layers), 8, 16, static_cast<std::int32_t>(c.num_kv_heads),
                     static_cast<std::int32_t>(c.head_dim));
  const Tokens table = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<ForwardChunk> chunks;
  for (std::size_t i = 0; i < prompt.size(); ++i)  // every position samples: the logits of the whole prompt
    chunks.push_back(ForwardChunk{std::span(&prompt[i], 1), static_cast<std::int32_t>(i), table, true});
  std::vector<float> all, step;
  for (const auto& chunk : chunks) {
    m.forward(std::span(&chunk, 1), cache, step);
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}


/// An FP8 checkpoint's layout of a weight: F8_E4M3 [out, in] and an f32 weight_scale, per channel ([out]) or,
/// with `per_tensor`, one value (the row scales' largest, the codes re-rounded to it).
inline std::vector<SafetensorsEntry> fp8_entries(const std::string& name, const std::vector<float>& w,
                                                 std::int64_t out, std::int64_t in, bool per_tensor) {
  auto q = Fp8::quantize(w, out, in);
  std::vector<float> scale = q.scale;
  if (per_tensor) {
    const float s = *std::max_element(scale.begin(), scale.end());
    for (std::size_t k = 0; k < w.size(); ++k) q.q[k] = f32_to_e4m3(w[k] / s);
    scale = {s};
  }
  const std::string module = name.substr(0, name.size() - std::string(".weight").size());
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  return {SafetensorsEntry::of<std::uint8_t>(name, "F8_E4M3", {u(out), u(in)}, q.q),
          per_tensor ? SafetensorsEntry::of<float>(module + ".weight_scale", "F32", {}, scale)
                     : SafetensorsEntry::of<float>(module + ".weight_scale", "F32", {u(out)}, scale)};
}

/// The INT8 checkpoint layout of a weight: I8 [out, in] and an f32 weight_scale [out, 1].
inline std::vector<SafetensorsEntry> int8_entries(const std::string& name, const std::vector<float>& w,
                                                  std::int64_t out, std::int64_t in) {
  const auto q = Int8WeightOnly::quantize(w, out, in);
  const std::string module = name.substr(0, name.size() - std::string(".weight").size());
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  return {SafetensorsEntry::of<std::int8_t>(name, "I8", {u(out), u(in)}, q.q),
          SafetensorsEntry::of<float>(module + ".weight_scale", "F32", {u(out), 1}, q.scale)};
}

}  // namespace infer::test
