#pragma once
/// \file
/// `ModelConfig` from a Hugging Face `config.json` (model_type "llama", "mistral" or "qwen2").
///
/// Fields a file leaves out take the defaults of the corresponding transformers config class
/// (LlamaConfig, MistralConfig, Qwen2Config), so a config.json means here what it means there; each
/// default is listed in `detail::hf::defaults_for`. As in Python, an explicit `null` means None:
/// for head_dim and num_key_value_heads that is "derive it", for sliding_window and the token ids
/// "there is none". A key holding the wrong JSON type throws FormatError naming the key.
/// Things the shared decoder does not implement (other model types, activations, MLP biases, YaRN
/// and dynamic RoPE, Qwen2's per-layer sliding window) throw UnsupportedError instead of loading a
/// model that would compute something else.

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infer/core/error.hpp"
#include "infer/io/mapped_file.hpp"
#include "infer/model/model_config.hpp"

namespace infer {

namespace detail::hf {

using json = nlohmann::json;

/// transformers' constructor defaults, per config class (transformers 4.4x).
struct Defaults {
  std::int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads;
  std::optional<std::int64_t> num_kv_heads;  ///< nullopt: same as num_heads
  std::int64_t max_position_embeddings;
  float rms_norm_eps, rope_theta;
  std::optional<std::int64_t> bos, eos, sliding_window;
};

inline Defaults defaults_for(ModelFamily f) {
  switch (f) {
    // LlamaConfig: vocab 32000, hidden 4096, intermediate 11008, 32 layers, 32 heads, kv heads = heads,
    // context 2048, eps 1e-6, theta 10000, bos 1, eos 2, no sliding window.
    case ModelFamily::llama: return {32000, 4096, 11008, 32, 32, std::nullopt, 2048, 1e-6f, 10000.0f, 1, 2, std::nullopt};
    // MistralConfig: vocab 32000, hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 kv heads,
    // context 4096 * 32, eps 1e-6, theta 10000, bos 1, eos 2, sliding window 4096.
    case ModelFamily::mistral: return {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-6f, 10000.0f, 1, 2, 4096};
    // Qwen2Config: vocab 151936, hidden 4096, intermediate 22016, 32 layers, 32 heads, 32 kv heads,
    // context 32768, eps 1e-6, theta 10000, no bos/eos ids, sliding window off (use_sliding_window false).
    case ModelFamily::qwen2:
      return {151936, 4096, 22016, 32, 32, 32, 32768, 1e-6f, 10000.0f, std::nullopt, std::nullopt, std::nullopt};
  }
  return {};
}

/// Typed access to one JSON object, naming `where` (file and enclosing key) in every error.
struct Reader {
  const json& obj;
  std::string where;

  /// The value of `key`, or nullptr when the key is absent.
  [[nodiscard]] const json* raw(std::string_view key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  /// True when `key` is present and not null.
  [[nodiscard]] bool has(std::string_view key) const {
    const json* v = raw(key);
    return v && !v->is_null();
  }
  [[noreturn]] void wrong(std::string_view key, std::string_view want, const json& v) const {
    throw FormatError(cat(where, ": key '", key, "' must be ", want, ", found ", v.dump()));
  }
  [[nodiscard]] std::int64_t as_int(std::string_view key, const json& v) const {
    if (!v.is_number_integer()) wrong(key, "an integer", v);
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      wrong(key, "an integer below 2^63", v);
    return v.get<std::int64_t>();
  }
  /// Integer fields: absent → `fallback`; null is an error (transformers would fail on it too).
  [[nodiscard]] std::int64_t integer(std::string_view key, std::int64_t fallback) const {
    const json* v = raw(key);
    return v ? as_int(key, *v) : fallback;
  }
  /// Integer-or-None fields: absent → `fallback`, null → nullopt.
  [[nodiscard]] std::optional<std::int64_t> optional_integer(std::string_view key,
                                                             std::optional<std::int64_t> fallback) const {
    const json* v = raw(key);
    if (!v) return fallback;
    if (v->is_null()) return std::nullopt;
    return as_int(key, *v);
  }
  [[nodiscard]] float number(std::string_view key, float fallback) const {
    const json* v = raw(key);
    if (!v) return fallback;
    if (!v->is_number()) wrong(key, "a number", *v);
    return static_cast<float>(v->get<double>());
  }
  [[nodiscard]] bool boolean(std::string_view key, bool fallback) const {
    const json* v = raw(key);
    if (!v) return fallback;
    if (!v->is_boolean()) wrong(key, "true or false", *v);
    return v->get<bool>();
  }
  [[nodiscard]] std::optional<std::string> string(std::string_view key) const {
    const json* v = raw(key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_string()) wrong(key, "a string", *v);
    return v->get<std::string>();
  }
  /// A number that must be present (inside rope_scaling, where transformers requires them).
  [[nodiscard]] float required_number(std::string_view key) const {
    if (!has(key)) throw FormatError(cat(where, ": key '", key, "' is required"));
    return number(key, 0.0f);
  }
};

/// quantization_config: {"quant_method", ...} → QuantizationConfig. The layouts infer reads: GPTQ 4-bit in
/// the v1 checkpoint format (act-order or not), AWQ 4-bit GEMM packing, FP8 (vLLM / ModelOpt, dynamic
/// activation scales), compressed-tensors INT8 channel-wise and FP8; anything else is UnsupportedError
/// naming the key and value, rather than weights read in the wrong layout.
inline QuantizationConfig parse_quantization_config(const Reader& r) {
  QuantizationConfig q;
  const auto method = r.string("quant_method");
  if (!method) throw FormatError(cat(r.where, ": has no 'quant_method'"));
  q.method = *method;
  auto unsupported = [&](const std::string& what) {
    throw UnsupportedError(cat(r.where, ": ", what, " is not supported"));
  };
  if (q.method == "gptq") {
    q.bits = static_cast<std::int32_t>(r.integer("bits", 4));
    q.group_size = static_cast<std::int32_t>(r.integer("group_size", 128));
    q.act_order = r.boolean("desc_act", false);
    q.symmetric = r.boolean("sym", true);
    q.weight_type = "int";
    if (q.bits != 4) unsupported(cat("GPTQ with bits = ", q.bits, " (infer's Int4 reads 4-bit)"));
    if (const auto fmt = r.string("checkpoint_format"); fmt && *fmt != "gptq")
      unsupported(cat("GPTQ checkpoint_format '", *fmt, "' (infer reads the v1 'gptq' format)"));
    q.quantizer = "int4";
  } else if (q.method == "awq") {
    q.bits = static_cast<std::int32_t>(r.integer("bits", r.integer("w_bit", 4)));
    q.group_size = static_cast<std::int32_t>(r.integer("group_size", r.integer("q_group_size", 128)));
    q.symmetric = !r.boolean("zero_point", true);
    q.weight_type = "int";
    if (q.bits != 4) unsupported(cat("AWQ with bits = ", q.bits, " (infer's Int4 reads 4-bit)"));
    if (const auto v = r.string("version"); v && *v != "gemm" && *v != "GEMM")
      unsupported(cat("AWQ version '", *v, "' (infer reads the GEMM packing)"));
    q.quantizer = "int4";
  } else if (q.method == "fp8") {
    q.bits = 8;
    q.weight_type = "float";
    if (const auto a = r.string("activation_scheme"); a && *a != "dynamic")
      unsupported(cat("FP8 activation_scheme '", *a, "' (infer scales activations per token, dynamically)"));
    q.quantizer = "fp8";
  } else if (q.method == "compressed-tensors") {
    // {"config_groups": {"group_0": {"weights": {"num_bits", "type", "strategy", "group_size", "symmetric"}}}}
    const json* groups = r.raw("config_groups");
    if (!groups || !groups->is_object() || groups->size() != 1)
      unsupported("compressed-tensors without exactly one entry in config_groups");
    const json& group = groups->begin().value();
    const json* weights = group.is_object() && group.contains("weights") ? &group.at("weights") : nullptr;
    if (!weights || !weights->is_object()) throw FormatError(cat(r.where, ": config_groups has no 'weights' scheme"));
    const Reader w{*weights, cat(r.where, ": config_groups weights")};
    q.bits = static_cast<std::int32_t>(w.integer("num_bits", 8));
    q.weight_type = w.string("type").value_or("int");
    q.symmetric = w.boolean("symmetric", true);
    const std::string strategy = w.string("strategy").value_or("channel");
    q.group_size = strategy == "group" ? static_cast<std::int32_t>(w.integer("group_size", 128)) : 0;
    if (q.bits == 8 && q.weight_type == "int" && strategy == "channel" && q.symmetric) q.quantizer = "int8";
    else if (q.bits == 8 && q.weight_type == "float" && (strategy == "channel" || strategy == "tensor")) q.quantizer = "fp8";
    else
      unsupported(cat("compressed-tensors weights of ", q.bits, "-bit ", q.weight_type, ", strategy '", strategy, "'",
                      q.symmetric ? "" : ", asymmetric", " (infer reads int8 channel-wise and fp8)"));
  } else {
    unsupported(cat("quant_method '", q.method, "' (infer reads gptq, awq, fp8 and compressed-tensors)"));
  }
  return q;
}

/// rope_scaling (transformers 4.x) or rope_parameters (5.x): {"rope_type" (or older "type"), ...}.
inline RopeScaling parse_rope_scaling(const Reader& r) {
  RopeScaling rs;
  auto type = r.string("rope_type");
  if (!type) type = r.string("type");
  if (!type) throw FormatError(cat(r.where, ": has no 'rope_type' (or 'type')"));
  if (*type == "default") return rs;
  if (*type == "linear") {
    rs.kind = RopeScaling::Kind::linear;
    rs.factor = r.required_number("factor");
  } else if (*type == "llama3") {
    rs.kind = RopeScaling::Kind::llama3;
    rs.factor = r.required_number("factor");
    rs.low_freq_factor = r.required_number("low_freq_factor");
    rs.high_freq_factor = r.required_number("high_freq_factor");
    if (!r.has("original_max_position_embeddings"))
      throw FormatError(cat(r.where, ": key 'original_max_position_embeddings' is required"));
    rs.original_max_position_embeddings = r.integer("original_max_position_embeddings", 0);
  } else {
    throw UnsupportedError(cat(r.where, ": rope type '", *type,
                               "' is not supported (supported: default, linear, llama3)"));
  }
  return rs;
}

inline void read_token_ids(const Reader& r, const Defaults& d, ModelConfig& c) {
  c.bos_token_id = r.optional_integer("bos_token_id", d.bos);
  const json* eos = r.raw("eos_token_id");
  if (!eos) {
    if (d.eos) c.eos_token_ids = {*d.eos};
  } else if (eos->is_array()) {
    for (const auto& id : *eos) c.eos_token_ids.push_back(r.as_int("eos_token_id", id));
  } else if (!eos->is_null()) {
    if (!eos->is_number_integer()) r.wrong("eos_token_id", "an integer or a list of integers", *eos);
    c.eos_token_ids = {r.as_int("eos_token_id", *eos)};
  }
}

}  // namespace detail::hf

/// Reads a parsed config.json. `source` (the file's path) prefixes every message. The result is
/// validated (`ModelConfig::validate`).
[[nodiscard]] inline ModelConfig from_hf_config(const nlohmann::json& j, std::string_view source = "config.json") {
  using detail::cat;
  const std::string src(source);
  if (!j.is_object()) throw FormatError(cat(src, ": must be a JSON object, found ", j.type_name()));
  const detail::hf::Reader r{j, src};

  ModelConfig c;
  const auto model_type = r.string("model_type");
  if (!model_type) throw FormatError(cat(src, ": has no 'model_type' (expected llama, mistral or qwen2)"));
  if (*model_type == "llama") c.family = ModelFamily::llama;
  else if (*model_type == "mistral") c.family = ModelFamily::mistral;
  else if (*model_type == "qwen2") c.family = ModelFamily::qwen2;
  else
    throw UnsupportedError(cat(src, ": model_type '", *model_type, "' is not supported (supported: llama, mistral, qwen2)"));
  const auto d = detail::hf::defaults_for(c.family);

  // architectures: the head class; only causal-LM heads produce next-token logits.
  if (const auto* arch = r.raw("architectures"); arch && !arch->is_null()) {
    if (!arch->is_array()) r.wrong("architectures", "a list of strings", *arch);
    bool causal = arch->empty();
    for (const auto& a : *arch) {
      if (!a.is_string()) r.wrong("architectures", "a list of strings", *arch);
      const auto& s = a.get_ref<const std::string&>();
      if (c.architecture.empty()) c.architecture = s;
      causal = causal || (s.size() >= 11 && s.compare(s.size() - 11, 11, "ForCausalLM") == 0);
    }
    if (!causal)
      throw UnsupportedError(cat(src, ": architectures ", arch->dump(),
                                 " has no *ForCausalLM head; only causal language models are supported"));
  }

  if (auto act = r.string("hidden_act"); act && *act != "silu")
    throw UnsupportedError(cat(src, ": hidden_act '", *act, "' is not supported (the decoder's MLP is SwiGLU: silu)"));
  if (c.family == ModelFamily::llama && r.boolean("mlp_bias", false))
    throw UnsupportedError(cat(src, ": mlp_bias true is not supported (the decoder's MLP has no biases)"));

  c.vocab_size = r.integer("vocab_size", d.vocab_size);
  c.hidden_size = r.integer("hidden_size", d.hidden_size);
  c.intermediate_size = r.integer("intermediate_size", d.intermediate_size);
  c.num_layers = r.integer("num_hidden_layers", d.num_layers);
  c.num_heads = r.integer("num_attention_heads", d.num_heads);
  // num_key_value_heads: absent → the class default; None → num_attention_heads (multi-head attention).
  c.num_kv_heads = r.optional_integer("num_key_value_heads", d.num_kv_heads).value_or(c.num_heads);
  if (c.num_heads <= 0)
    throw FormatError(cat(src, ": key 'num_attention_heads' must be positive, found ", c.num_heads));
  // head_dim: absent or None → hidden_size / num_attention_heads.
  c.head_dim = r.optional_integer("head_dim", std::nullopt).value_or(c.hidden_size / c.num_heads);
  c.max_position_embeddings = r.integer("max_position_embeddings", d.max_position_embeddings);
  c.rms_norm_eps = r.number("rms_norm_eps", d.rms_norm_eps);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);  // PretrainedConfig's default

  // Qwen2's attention always has q/k/v biases (the modeling code hard-codes them, whatever the
  // config says); Llama reads attention_bias (default false); Mistral has none.
  c.attention_bias = c.family == ModelFamily::qwen2 || (c.family == ModelFamily::llama && r.boolean("attention_bias", false));

  // RoPE: rope_theta and rope_scaling at top level (4.x), or both inside rope_parameters (5.x).
  const auto* params = r.raw("rope_parameters");
  if (params && !params->is_null() && !params->is_object()) r.wrong("rope_parameters", "an object", *params);
  const bool have_params = params && params->is_object();
  const detail::hf::Reader pr{have_params ? *params : j, cat(src, ": rope_parameters")};
  c.rope_theta = r.has("rope_theta") ? r.number("rope_theta", d.rope_theta)
                 : have_params       ? pr.number("rope_theta", d.rope_theta)
                                     : d.rope_theta;
  if (const auto* rs = r.raw("rope_scaling"); rs && !rs->is_null()) {
    if (!rs->is_object()) r.wrong("rope_scaling", "an object or null", *rs);
    c.rope_scaling = detail::hf::parse_rope_scaling(detail::hf::Reader{*rs, cat(src, ": rope_scaling")});
  } else if (have_params && pr.has("rope_type")) {
    c.rope_scaling = detail::hf::parse_rope_scaling(pr);
  }

  // Sliding window. Mistral: the value (absent → 4096, null → none). Qwen2: only when
  // use_sliding_window is true, and then only for layers from max_window_layers on — a per-layer
  // window the decoder does not implement.
  if (c.family == ModelFamily::mistral) {
    c.sliding_window = r.optional_integer("sliding_window", d.sliding_window);
  } else if (c.family == ModelFamily::qwen2) {
    (void)r.optional_integer("sliding_window", std::nullopt);  // type-check even when unused
    if (r.boolean("use_sliding_window", false))
      throw UnsupportedError(cat(src, ": use_sliding_window true is not supported (Qwen2 applies the window to ",
                                 "layers from max_window_layers on; the decoder has one window for all layers)"));
  }

  detail::hf::read_token_ids(r, d, c);

  if (const auto* qc = r.raw("quantization_config"); qc && !qc->is_null()) {
    if (!qc->is_object()) r.wrong("quantization_config", "an object or null", *qc);
    c.quantization = detail::hf::parse_quantization_config(detail::hf::Reader{*qc, cat(src, ": quantization_config")});
  }

  try {
    c.validate();
  } catch (const FormatError& e) {
    throw FormatError(cat(src, ": ", e.what()));
  }
  return c;
}

/// Reads `path`: a config.json, or a model folder holding one. IoError when it cannot be read,
/// FormatError when it is not JSON, then as `from_hf_config`.
[[nodiscard]] inline ModelConfig load_hf_config(const std::filesystem::path& path) {
  std::error_code ec;
  const auto file = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  const auto mapped = io::MappedFile::open(file);
  const char* b = reinterpret_cast<const char*>(mapped.bytes().data());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(b, b + mapped.size());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(detail::cat(file.string(), ": not valid JSON: ", e.what()));
  }
  return from_hf_config(j, file.string());
}

}  // namespace infer
