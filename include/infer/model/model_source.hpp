#pragma once
/// \file
/// `ModelSource`: a model on disk, whatever the format — one GGUF file, or a Hugging Face folder
/// (config.json + model.safetensors or a sharded index, and tokenizer.json when present). The decoder
/// asks for weights by *canonical role* and never sees a file's own tensor names:
///
///   role                    GGUF name                  HF name
///   token_embd              token_embd.weight          model.embed_tokens.weight
///   output_norm             output_norm.weight         model.norm.weight
///   output                  output.weight              lm_head.weight          (absent when tied)
///   blk.{i}.attn_norm       blk.{i}.attn_norm.weight   model.layers.{i}.input_layernorm.weight
///   blk.{i}.attn_q|k|v      blk.{i}.attn_q.weight ...  model.layers.{i}.self_attn.q_proj.weight ...
///   blk.{i}.attn_output     blk.{i}.attn_output.weight model.layers.{i}.self_attn.o_proj.weight
///   blk.{i}.ffn_norm        blk.{i}.ffn_norm.weight    model.layers.{i}.post_attention_layernorm.weight
///   blk.{i}.ffn_gate|up|down blk.{i}.ffn_gate.weight   model.layers.{i}.mlp.gate_proj.weight ...
///   <linear role>.bias      <GGUF name>.bias           <HF name>.bias
///   <matrix role>.<c>       <GGUF module>.<c>          <HF module>.<c>          (c: a quantized checkpoint's
///                                                       companion: weight_scale, input_scale, qweight,
///                                                       qzeros, scales, g_idx; e.g. model.layers.0.mlp.
///                                                       down_proj.weight_scale. A dummy model has none.)
///
/// WeightTensor shapes are row-major slowest-first ([out, in]); GGUF lists dimensions fastest-first,
/// so they are reversed here, once, and nowhere else.
///
/// The implementation is compiled (kernels/cpu/model_source.cpp, in infer::kernels), so the file
/// readers stay out of every translation unit that uses a model.

#include <filesystem>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "infer/model/model_config.hpp"
#include "infer/model/tensor_parallel.hpp"
#include "infer/quant/weight_tensor.hpp"
#include "infer/tokenizer/tokenizer.hpp"

namespace infer {

namespace gguf {
class File;
}
namespace dist {
class Group;
class DeviceGroup;
}
class EngineFile;

class ModelSource {
 public:
  /// `path` is a .gguf file, a Hugging Face model folder (config.json, model.safetensors or
  /// model.safetensors.index.json, optionally tokenizer.json), or an engine file (io/engine_file.hpp). IoError / FormatError /
  /// UnsupportedError / NotFoundError from the readers, each naming the file concerned.
  static ModelSource open(const std::filesystem::path& path);

  /// A model of `config`'s shape with seeded random weights (model/dummy.hpp): its WeightTensors carry
  /// a DummyFill instead of bytes, which the Quantizer turns into values where it stores them. No
  /// tokenizer unless one is given (vLLM's `--load-format dummy --tokenizer`: a server benchmark sends
  /// text); its vocabulary may be smaller than the model's, and ids beyond it detokenize to nothing.
  /// FormatError when the config does not validate; InvalidArgument when the tokenizer's vocabulary is
  /// larger than the model's (its ids would be outside the embedding).
  static ModelSource dummy(ModelConfig config, std::uint64_t seed = 0, std::string label = "dummy",
                           std::optional<Tokenizer> tokenizer = std::nullopt);

  /// This rank's part of `whole` for tensor parallelism over `group` (Megatron-LM's split of a Llama-family
  /// decoder); it keeps `whole`, and the group must outlive it. Its config() has num_heads, num_kv_heads and
  /// intermediate_size divided by the group's size (a rank's heads and share of the MLP; every other field as
  /// here, the vocabulary whole); find() gives this rank's
  /// - rows of attn_q, attn_k, attn_v, ffn_gate, ffn_up and their biases (its heads, its share of the MLP: q head h
  ///   and KV head h / (heads / kv_heads) stay on one rank);
  /// - columns of attn_output and ffn_down (the inputs its heads and MLP share feed; the ranks' products add up);
  /// - rows of token_embd and output: TensorParallel::vocab_rows;
  /// - norms whole;
  /// - an FP8 or INT8 checkpoint's scales: a per-tensor one whole, a per-channel weight_scale the rows its weight
  ///   keeps (whole for attn_output and ffn_down, whose rows every rank keeps).
  /// Slices of file tensors are views where they are rows and copies (held by the view) where they are columns;
  /// a dummy weight's slice is the same values as the whole's (DummyFill's slice).
  /// UnsupportedError, naming the numbers, when the size does not divide the heads, the KV heads or the MLP width;
  /// and at find() for a block-quantized tensor whose columns do not split on block boundaries, for GPTQ and AWQ
  /// checkpoints' packed tensors (qweight, qzeros, scales, g_idx), and for biases of attn_output or ffn_down.
  /// An engine file built from a shard (EngineFileInfo::tensor_parallel) is already this rank's part: its
  /// config and weights are kept as they are; UnsupportedError naming both when it was built for another place
  /// (another rank, another size, or the whole model).
  /// `device`: the same group's collectives over device memory (dist/device_group.hpp), for the CUDA decoder; the
  /// CPU decoder uses `group`.
  [[nodiscard]] static ModelSource shard(ModelSource whole, dist::Group& group, dist::DeviceGroup* device = nullptr);
  /// The split alone, at `place`, with no group: what an engine file of one rank is built from (infer-build
  /// --tensor-parallel-size builds every rank's in one process). The decoders refuse to run it (they need the
  /// group's collectives).
  [[nodiscard]] static ModelSource shard(ModelSource whole, TensorParallel place);
  /// This source's place in its tensor-parallel group ({0, 1} unless it is a shard, or an engine file of one).
  [[nodiscard]] TensorParallel tensor_parallel() const noexcept;
  /// The group a shard was made for (nullptr unless it is a shard): the decoder's collectives go through it.
  [[nodiscard]] dist::Group* group() const noexcept;
  /// The device collectives a shard was given (nullptr when none: the CUDA decoder then refuses the shard).
  [[nodiscard]] dist::DeviceGroup* device_group() const noexcept;

  ModelSource(ModelSource&&) noexcept;
  ModelSource& operator=(ModelSource&&) noexcept;
  ~ModelSource();

  [[nodiscard]] const ModelConfig& config() const noexcept;

  /// The weight of canonical `role`, or nullopt when the file has none ("output" of a tied model is
  /// always absent, even where a checkpoint also stores lm_head.weight). Its bytes are views into the
  /// mapped file: valid while this ModelSource lives. InvalidArgument for a name that is not a
  /// canonical role (a typo is the caller's bug, not a missing tensor).
  [[nodiscard]] std::optional<WeightTensor> find(std::string_view role) const;

  /// As find(), but NotFoundError naming the role, the file's own name for it and the model.
  [[nodiscard]] WeightTensor get(std::string_view role) const;

  /// The file's own name for canonical `role` (e.g. "model.layers.3.self_attn.q_proj.weight").
  [[nodiscard]] std::string file_name(std::string_view role) const;

  /// The FP8 KV-cache scales a checkpoint ships for `layer` (value = e4m3 code · scale): ModelOpt's
  /// `self_attn.k_proj.k_scale` / `self_attn.v_proj.v_scale`, or compressed-tensors' (and vLLM's)
  /// `self_attn.k_scale` / `self_attn.v_scale`, or an engine file's record of them; nullopt when it ships none
  /// (GGUF files and dummy models never do). FormatError for a malformed one: not a single positive finite
  /// value, or K's without V's.
  struct KvScales {
    float k = 1.0f, v = 1.0f;
  };
  [[nodiscard]] std::optional<KvScales> kv_cache_scales(std::int64_t layer) const;

  /// The tokenizer the model ships with; nullptr when it has none.
  [[nodiscard]] const Tokenizer* tokenizer() const noexcept;

  /// "GGUF 'path'", "safetensors folder 'path'" or "dummy model 'label'", for messages.
  [[nodiscard]] std::string describe() const;

  [[nodiscard]] const std::filesystem::path& path() const noexcept;
  /// The underlying GGUF file (nullptr for an HF folder), for metadata beyond the config. Using it
  /// needs infer/io/gguf.hpp.
  [[nodiscard]] const gguf::File* gguf_file() const noexcept;
  /// The engine file (infer-build's output) this source is, else nullptr. Its config and tokenizer are
  /// the file's; its weights are loaded by the decoder from the file's parts (find() refuses roles).
  /// Using it needs infer/io/engine_file.hpp.
  [[nodiscard]] const EngineFile* engine_file() const noexcept;

 private:
  struct Impl;
  explicit ModelSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// UnsupportedError when `src` is one rank's part of a tensor-parallel split with no group for its decoder's
/// collectives (an engine file of one rank opened alone, or a shard made from a place only); the decoders call it.
void require_group_for_split(const ModelSource& src);

}  // namespace infer
