#pragma once
/// \file
/// `ModelConfig`: the hyperparameters of one decoder of the Llama family (Llama 1-3, SmolLM/SmolLM2,
/// Mistral, Qwen2/2.5), whichever file they came from (HF config.json: hf_config.hpp; GGUF metadata:
/// gguf_config.hpp). The decoder, the weight loaders and the KV-cache sizing read only this struct.
///
/// Floating-point fields are `float`, not `double`: GGUF stores them as f32 and the kernels compute in
/// f32, so the same model read from either source gives bit-identical configs (1e-5 in config.json
/// and 1e-5f in GGUF compare equal).

#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"

namespace infer {

/// Which variant of the shared decoder. SmolLM and SmolLM2 are `llama` (their config says so).
enum class ModelFamily : std::uint8_t {
  llama,
  mistral,  ///< Llama layout; may use sliding-window attention
  qwen2,    ///< Llama layout with q/k/v projection biases
};

constexpr std::string_view to_string(ModelFamily f) noexcept {
  switch (f) {
    case ModelFamily::llama: return "llama";
    case ModelFamily::mistral: return "mistral";
    case ModelFamily::qwen2: return "qwen2";
  }
  return "?";
}

/// How positions are rescaled before RoPE. Only the fields of the chosen kind are meaningful.
struct RopeScaling {
  enum class Kind : std::uint8_t {
    none,    ///< plain RoPE
    linear,  ///< position interpolation: every frequency divided by `factor`
    llama3,  ///< Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth ramp between
  };
  Kind kind = Kind::none;
  float factor = 1.0f;                                     ///< linear, llama3
  float low_freq_factor = 1.0f;                            ///< llama3
  float high_freq_factor = 4.0f;                           ///< llama3
  std::int64_t original_max_position_embeddings = 8192;  ///< llama3: context the model was trained at

  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

constexpr std::string_view to_string(RopeScaling::Kind k) noexcept {
  switch (k) {
    case RopeScaling::Kind::none: return "none";
    case RopeScaling::Kind::linear: return "linear";
    case RopeScaling::Kind::llama3: return "llama3";
  }
  return "?";
}

/// Which elements of a head RoPE rotates together. Hugging Face checkpoints rotate element i with
/// i + head_dim/2 (`rotate_half`); llama.cpp's converter permutes Llama's q/k projection rows so that
/// GGUF files of the `llama` architecture rotate adjacent pairs (2i, 2i+1) instead. Both describe the
/// same model; the decoder must use the style its weights were written for.
enum class RopeStyle : std::uint8_t {
  neox,         ///< pairs (i, i + head_dim/2): HF checkpoints, GGUF qwen2
  interleaved,  ///< pairs (2i, 2i+1): GGUF llama
};

constexpr std::string_view to_string(RopeStyle s) noexcept { return s == RopeStyle::neox ? "neox" : "interleaved"; }

/// How a checkpoint's weights are quantized, from config.json's `quantization_config` (what vLLM reads to
/// pick its kernels). Only what infer's Quantizers need to know and check; the layouts themselves are read
/// by the Quantizer from the tensors (quant/int8_weight_only.hpp, fp8.hpp, int4.hpp).
struct QuantizationConfig {
  /// "gptq", "awq", "fp8" (vLLM's / ModelOpt's FP8), or "compressed-tensors" (llm-compressor's).
  std::string method;
  std::int32_t bits = 0;        ///< weight bits (gptq, awq; compressed-tensors' num_bits; 8 for fp8)
  std::int32_t group_size = 0;  ///< inputs per scale group (gptq, awq, compressed-tensors "group"); 0: per channel
  bool act_order = false;       ///< gptq desc_act: groups in activation order (g_idx)
  bool symmetric = true;        ///< gptq sym, awq !zero_point, compressed-tensors symmetric
  std::string weight_type;      ///< "int" or "float" (compressed-tensors' weights.type; "float" for fp8)
  /// The Quantizer that reads this layout, as LlmOptions names it ("int4", "fp8", "int8"), or empty when
  /// infer has none.
  std::string quantizer;

  friend bool operator==(const QuantizationConfig&, const QuantizationConfig&) = default;
};

/// Sizes are signed so that `validate()` can report a negative value read from a file as such,
/// rather than as a huge unsigned number.
struct ModelConfig {
  ModelFamily family = ModelFamily::llama;
  std::string architecture;  ///< e.g. "LlamaForCausalLM" (HF) or "llama" (GGUF); informational

  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;        ///< d_model
  std::int64_t intermediate_size = 0;  ///< SwiGLU inner width
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;     ///< query heads
  std::int64_t num_kv_heads = 0;  ///< key/value heads (grouped-query attention when fewer than num_heads)
  std::int64_t head_dim = 0;      ///< per-head width; hidden_size / num_heads unless a file says otherwise

  float rope_theta = 10000.0f;  ///< RoPE base
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::neox;
  float rms_norm_eps = 1e-6f;
  std::int64_t max_position_embeddings = 0;  ///< context length the model supports

  bool tie_word_embeddings = false;  ///< the LM head reuses the token embedding matrix
  bool attention_bias = false;       ///< q/k/v projections have biases (Qwen2: always)
  std::optional<std::int64_t> sliding_window;  ///< attention window in tokens, when the model uses one

  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  ///< any of these ends generation (HF allows a list)

  /// Set when the checkpoint says its weights are quantized (config.json's quantization_config).
  std::optional<QuantizationConfig> quantization;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;

  /// Width of the query projection's output, and of the key (or value) projection's: the latter is
  /// also the number of elements one layer's K (or V) cache holds per token.
  [[nodiscard]] std::int64_t q_size() const noexcept { return num_heads * head_dim; }
  [[nodiscard]] std::int64_t kv_size() const noexcept { return num_kv_heads * head_dim; }

  /// Throws FormatError naming the first field whose value cannot describe a working model. Every
  /// reader calls this, so code downstream may divide by these values without checking again.
  void validate() const {
    using detail::cat;
    auto positive = [](const char* field, std::int64_t v) {
      if (v <= 0) throw FormatError(cat("model config: ", field, " = ", v, " must be positive"));
    };
    positive("vocab_size", vocab_size);
    positive("hidden_size", hidden_size);
    positive("intermediate_size", intermediate_size);
    positive("num_layers", num_layers);
    positive("num_heads", num_heads);
    positive("num_kv_heads", num_kv_heads);
    positive("head_dim", head_dim);
    positive("max_position_embeddings", max_position_embeddings);
    if (hidden_size % num_heads != 0)
      throw FormatError(cat("model config: num_heads = ", num_heads, " does not divide hidden_size = ", hidden_size));
    if (num_heads % num_kv_heads != 0)
      throw FormatError(cat("model config: num_kv_heads = ", num_kv_heads, " does not divide num_heads = ", num_heads,
                            " (each key/value head must serve a whole group of query heads)"));
    if (head_dim % 2 != 0)
      throw FormatError(cat("model config: head_dim = ", head_dim, " must be even (RoPE rotates pairs)"));
    auto finite_positive = [](const char* field, float v) {
      if (!(std::isfinite(v) && v > 0.0f))
        throw FormatError(cat("model config: ", field, " = ", v, " must be a finite number > 0"));
    };
    finite_positive("rms_norm_eps", rms_norm_eps);
    finite_positive("rope_theta", rope_theta);
    if (rope_scaling.kind != RopeScaling::Kind::none) finite_positive("rope_scaling.factor", rope_scaling.factor);
    if (rope_scaling.kind == RopeScaling::Kind::llama3) {
      finite_positive("rope_scaling.low_freq_factor", rope_scaling.low_freq_factor);
      finite_positive("rope_scaling.high_freq_factor", rope_scaling.high_freq_factor);
      if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))
        throw FormatError(cat("model config: rope_scaling.high_freq_factor = ", rope_scaling.high_freq_factor,
                              " must be greater than low_freq_factor = ", rope_scaling.low_freq_factor));
      positive("rope_scaling.original_max_position_embeddings", rope_scaling.original_max_position_embeddings);
    }
    if (sliding_window) positive("sliding_window", *sliding_window);
    auto token = [&](const char* field, std::int64_t id) {
      if (id < 0 || id >= vocab_size)
        throw FormatError(cat("model config: ", field, " = ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    };
    if (bos_token_id) token("bos_token_id", *bos_token_id);
    for (auto id : eos_token_ids) token("eos_token_id", id);
  }

  /// Every field as (name, value) text, in declaration order, for printing or logging.
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> fields() const {
    using detail::cat;
    std::vector<std::pair<std::string, std::string>> f;
    auto add = [&](const char* k, std::string v) { f.emplace_back(k, std::move(v)); };
    auto opt = [](const std::optional<std::int64_t>& v) { return v ? std::to_string(*v) : std::string("none"); };
    add("family", std::string(to_string(family)));
    add("architecture", architecture);
    add("vocab_size", std::to_string(vocab_size));
    add("hidden_size", std::to_string(hidden_size));
    add("intermediate_size", std::to_string(intermediate_size));
    add("num_layers", std::to_string(num_layers));
    add("num_heads", std::to_string(num_heads));
    add("num_kv_heads", std::to_string(num_kv_heads));
    add("head_dim", std::to_string(head_dim));
    add("rope_theta", cat(rope_theta));
    switch (rope_scaling.kind) {
      case RopeScaling::Kind::none: add("rope_scaling", "none"); break;
      case RopeScaling::Kind::linear: add("rope_scaling", cat("linear{factor=", rope_scaling.factor, "}")); break;
      case RopeScaling::Kind::llama3:
        add("rope_scaling", cat("llama3{factor=", rope_scaling.factor, ", low_freq_factor=", rope_scaling.low_freq_factor,
                                ", high_freq_factor=", rope_scaling.high_freq_factor,
                                ", original_max_position_embeddings=", rope_scaling.original_max_position_embeddings,
                                "}"));
        break;
    }
    add("rope_style", std::string(to_string(rope_style)));
    add("rms_norm_eps", cat(rms_norm_eps));
    add("max_position_embeddings", std::to_string(max_position_embeddings));
    add("tie_word_embeddings", tie_word_embeddings ? "true" : "false");
    add("attention_bias", attention_bias ? "true" : "false");
    add("sliding_window", opt(sliding_window));
    add("bos_token_id", opt(bos_token_id));
    std::string eos = "[";
    for (std::size_t i = 0; i < eos_token_ids.size(); ++i) eos += (i ? ", " : "") + std::to_string(eos_token_ids[i]);
    add("eos_token_ids", eos + "]");
    return f;
  }

  /// One "name: value" line per field.
  [[nodiscard]] std::string describe() const {
    std::string s;
    for (const auto& [k, v] : fields()) s += k + ": " + v + "\n";
    return s;
  }
};

/// RoPE inverse frequencies, one per rotated pair (head_dim / 2 values), with the config's scaling
/// applied: inv_freq[i] = rope_theta^(-2i / head_dim), then
///   linear: inv_freq / factor (the same as dividing positions by factor);
///   llama3: with wavelength w = 2*pi / inv_freq, w_lo = original / low_freq_factor and
///           w_hi = original / high_freq_factor: w < w_hi keeps inv_freq (high frequencies carry
///           local order and need no stretching), w > w_lo gives inv_freq / factor, and in between
///           s = (original / w - low_freq_factor) / (high_freq_factor - low_freq_factor) blends
///           (1 - s) * inv_freq / factor + s * inv_freq.
/// Computed in double and rounded once, so every backend that takes these values agrees exactly.
/// Call on a validated config (head_dim even and positive, factors as validate() requires).
[[nodiscard]] inline std::vector<float> rope_inv_freq(const ModelConfig& c) {
  require<InvalidArgument>(c.head_dim > 0 && c.head_dim % 2 == 0, "rope_inv_freq: head_dim = ", c.head_dim,
                           " must be positive and even");
  const auto half = static_cast<std::size_t>(c.head_dim / 2);
  const auto& rs = c.rope_scaling;
  std::vector<float> out(half);
  for (std::size_t i = 0; i < half; ++i) {
    const double exponent = static_cast<double>(2 * i) / static_cast<double>(c.head_dim);
    double f = 1.0 / std::pow(static_cast<double>(c.rope_theta), exponent);
    if (rs.kind == RopeScaling::Kind::linear) {
      f /= rs.factor;
    } else if (rs.kind == RopeScaling::Kind::llama3) {
      const double original = static_cast<double>(rs.original_max_position_embeddings);
      const double wavelen = 2.0 * std::numbers::pi / f;
      const double lo_wavelen = original / rs.low_freq_factor;
      const double hi_wavelen = original / rs.high_freq_factor;
      if (wavelen > lo_wavelen) {
        f /= rs.factor;
      } else if (wavelen >= hi_wavelen) {
        const double s = (original / wavelen - rs.low_freq_factor) /
                         (static_cast<double>(rs.high_freq_factor) - rs.low_freq_factor);
        f = (1.0 - s) * f / rs.factor + s * f;
      }
    }
    out[i] = static_cast<float>(f);
  }
  return out;
}

}  // namespace infer
