#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/model/dummy.hpp"
#include "infer/model/hf_config.hpp"
#include "infer/model/model_config.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using Catch::Contains;
using json = nlohmann::json;
using Ids = std::vector<std::int64_t>;

namespace {

ModelConfig fixture_config(const std::string& name) { return load_hf_config(test::fixture("configs/" + name + ".json")); }

json fixture_json(const std::string& name) {
  std::ifstream in(test::fixture("configs/" + name + ".json"));
  return json::parse(in);
}

/// The SmolLM2 config with one key replaced (or removed, when `value` is discarded).
ModelConfig smol_with(const std::string& key, const json& value) {
  json j = fixture_json("SmolLM2-135M-Instruct");
  if (value.is_discarded()) j.erase(key);
  else j[key] = value;
  return from_hf_config(j, "smol/config.json");
}

const json removed = json(json::value_t::discarded);

}  // namespace

TEST_CASE("hf config: Llama-3.1-8B-Instruct", "[model][config]") {
  const auto c = fixture_config("Llama-3.1-8B-Instruct");
  CHECK(c.family == ModelFamily::llama);
  CHECK(c.architecture == "LlamaForCausalLM");
  CHECK(c.vocab_size == 128256);
  CHECK(c.hidden_size == 4096);
  CHECK(c.intermediate_size == 14336);
  CHECK(c.num_layers == 32);
  CHECK(c.num_heads == 32);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.q_size() == 4096);
  CHECK(c.kv_size() == 1024);
  CHECK(c.rope_theta == 500000.0f);
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::llama3);
  CHECK(c.rope_scaling.factor == 8.0f);
  CHECK(c.rope_scaling.low_freq_factor == 1.0f);
  CHECK(c.rope_scaling.high_freq_factor == 4.0f);
  CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK(c.max_position_embeddings == 131072);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK_FALSE(c.sliding_window.has_value());
  CHECK(c.bos_token_id == std::optional<std::int64_t>(128000));
  CHECK(c.eos_token_ids == Ids{128001, 128008, 128009});
}

TEST_CASE("hf config: Mistral-7B-Instruct-v0.3", "[model][config]") {
  const auto c = fixture_config("Mistral-7B-Instruct-v0.3");
  CHECK(c.family == ModelFamily::mistral);
  CHECK(c.architecture == "MistralForCausalLM");
  CHECK(c.vocab_size == 32768);
  CHECK(c.hidden_size == 4096);
  CHECK(c.intermediate_size == 14336);
  CHECK(c.num_layers == 32);
  CHECK(c.num_heads == 32);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.rope_theta == 1e6f);
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::none);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK(c.max_position_embeddings == 32768);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK_FALSE(c.sliding_window.has_value());  // "sliding_window": null in v0.3
  CHECK(c.bos_token_id == std::optional<std::int64_t>(1));
  CHECK(c.eos_token_ids == Ids{2});
}

TEST_CASE("hf config: Qwen2.5-7B-Instruct", "[model][config]") {
  const auto c = fixture_config("Qwen2.5-7B-Instruct");
  CHECK(c.family == ModelFamily::qwen2);
  CHECK(c.architecture == "Qwen2ForCausalLM");
  CHECK(c.vocab_size == 152064);
  CHECK(c.hidden_size == 3584);
  CHECK(c.intermediate_size == 18944);
  CHECK(c.num_layers == 28);
  CHECK(c.num_heads == 28);
  CHECK(c.num_kv_heads == 4);
  CHECK(c.head_dim == 128);
  CHECK(c.rope_theta == 1e6f);
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::none);
  CHECK(c.rms_norm_eps == 1e-6f);
  CHECK(c.max_position_embeddings == 32768);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.attention_bias);                    // implied by qwen2
  CHECK_FALSE(c.sliding_window.has_value());  // sliding_window 131072 but use_sliding_window false
  CHECK(c.bos_token_id == std::optional<std::int64_t>(151643));
  CHECK(c.eos_token_ids == Ids{151645});
}

TEST_CASE("hf config: SmolLM2-135M-Instruct", "[model][config]") {
  const auto c = fixture_config("SmolLM2-135M-Instruct");
  CHECK(c.family == ModelFamily::llama);
  CHECK(c.vocab_size == 49152);
  CHECK(c.hidden_size == 576);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.num_layers == 30);
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.rope_theta == 100000.0f);  // an integer in the JSON
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::none);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK(c.max_position_embeddings == 8192);
  CHECK(c.tie_word_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK(c.bos_token_id == std::optional<std::int64_t>(1));
  CHECK(c.eos_token_ids == Ids{2});

  const auto d = c.describe();
  CHECK_THAT(d, Contains("family: llama\n") && Contains("num_kv_heads: 3\n") && Contains("tie_word_embeddings: true\n") &&
                    Contains("eos_token_ids: [2]\n") && Contains("sliding_window: none\n"));
  CHECK(c.fields().size() == 19);
  CHECK_THAT(d, Contains("rope_style: neox\n"));  // HF checkpoints rotate (i, i + head_dim/2)
  CHECK(c.fields().front() == std::pair<std::string, std::string>{"family", "llama"});
  CHECK_THAT(fixture_config("Llama-3.1-8B-Instruct").describe(),
             Contains("rope_scaling: llama3{factor=8, low_freq_factor=1, high_freq_factor=4, "
                      "original_max_position_embeddings=8192}"));
}

TEST_CASE("hf config: transformers' defaults for absent fields", "[model][config]") {
  const auto l = from_hf_config(json{{"model_type", "llama"}});
  CHECK(l.vocab_size == 32000);
  CHECK(l.hidden_size == 4096);
  CHECK(l.intermediate_size == 11008);
  CHECK(l.num_layers == 32);
  CHECK(l.num_heads == 32);
  CHECK(l.num_kv_heads == 32);
  CHECK(l.head_dim == 128);
  CHECK(l.max_position_embeddings == 2048);
  CHECK(l.rms_norm_eps == 1e-6f);
  CHECK(l.rope_theta == 10000.0f);
  CHECK_FALSE(l.tie_word_embeddings);
  CHECK_FALSE(l.attention_bias);
  CHECK(l.bos_token_id == std::optional<std::int64_t>(1));
  CHECK(l.eos_token_ids == Ids{2});
  CHECK(l.architecture.empty());

  const auto m = from_hf_config(json{{"model_type", "mistral"}});
  CHECK(m.intermediate_size == 14336);
  CHECK(m.num_kv_heads == 8);
  CHECK(m.max_position_embeddings == 131072);
  CHECK(m.sliding_window == std::optional<std::int64_t>(4096));  // absent: the class default

  const auto q = from_hf_config(json{{"model_type", "qwen2"}, {"attention_bias", false}});
  CHECK(q.vocab_size == 151936);
  CHECK(q.intermediate_size == 22016);
  CHECK(q.num_kv_heads == 32);
  CHECK(q.max_position_embeddings == 32768);
  CHECK(q.attention_bias);  // qwen2 always has q/k/v biases, whatever the key says
  CHECK_FALSE(q.bos_token_id.has_value());
  CHECK(q.eos_token_ids.empty());
  CHECK_FALSE(q.sliding_window.has_value());

  // null means None: derive kv heads / head_dim, no token id.
  const auto n = from_hf_config(json{{"model_type", "llama"}, {"num_key_value_heads", nullptr}, {"head_dim", nullptr},
                                     {"bos_token_id", nullptr}, {"eos_token_id", nullptr}, {"num_attention_heads", 16}});
  CHECK(n.num_kv_heads == 16);
  CHECK(n.head_dim == 256);
  CHECK_FALSE(n.bos_token_id.has_value());
  CHECK(n.eos_token_ids.empty());

  // An explicit head_dim (Mistral-Nemo style) is kept even when it is not hidden / heads.
  CHECK(from_hf_config(json{{"model_type", "mistral"}, {"hidden_size", 5120}, {"head_dim", 128}}).head_dim == 128);
  CHECK(smol_with("attention_bias", true).attention_bias);
}

TEST_CASE("hf config: rope scaling variants", "[model][config]") {
  const auto lin = smol_with("rope_scaling", json{{"type", "linear"}, {"factor", 2.0}});
  CHECK(lin.rope_scaling.kind == RopeScaling::Kind::linear);
  CHECK(lin.rope_scaling.factor == 2.0f);
  CHECK(smol_with("rope_scaling", json{{"rope_type", "default"}}).rope_scaling.kind == RopeScaling::Kind::none);

  for (const char* t : {"yarn", "dynamic", "longrope", "su"}) {
    CHECK_THROWS_AS(smol_with("rope_scaling", json{{"rope_type", t}, {"factor", 4.0}}), UnsupportedError);
    CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"rope_type", t}, {"factor", 4.0}}),
                      Contains(t) && Contains("rope_scaling") && Contains("llama3"));
  }
  CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"factor", 4.0}}), Contains("rope_type"));
  CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"rope_type", "linear"}}), Contains("'factor' is required"));
  CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0},
                                                   {"original_max_position_embeddings", 8192}}),
                    Contains("'low_freq_factor' is required"));
  CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                                   {"high_freq_factor", 4.0}}),
                    Contains("original_max_position_embeddings"));
  CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"rope_type", "linear"}, {"factor", "2"}}),
                    Contains("'factor'") && Contains("a number"));
  CHECK_THROWS_WITH(smol_with("rope_scaling", 5), Contains("'rope_scaling'"));
  // llama3 with high <= low would divide by zero in the ramp: validate() refuses it.
  CHECK_THROWS_WITH(smol_with("rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                                   {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}),
                    Contains("high_freq_factor"));

  // transformers 5 keeps theta and type together in rope_parameters.
  json j = fixture_json("SmolLM2-135M-Instruct");
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 250000.0}, {"factor", 3.0}};
  const auto p = from_hf_config(j);
  CHECK(p.rope_theta == 250000.0f);
  CHECK(p.rope_scaling.kind == RopeScaling::Kind::linear);
  CHECK(p.rope_scaling.factor == 3.0f);
}

TEST_CASE("hf config: unsupported models", "[model][config]") {
  CHECK_THROWS_AS(from_hf_config(json{{"model_type", "gemma2"}}), UnsupportedError);
  CHECK_THROWS_WITH(from_hf_config(json{{"model_type", "gemma2"}}),
                    Contains("gemma2") && Contains("llama") && Contains("mistral") && Contains("qwen2"));
  CHECK_THROWS_AS(from_hf_config(json{{"hidden_size", 8}}), FormatError);
  CHECK_THROWS_WITH(from_hf_config(json{{"hidden_size", 8}}), Contains("model_type"));
  CHECK_THROWS_AS(smol_with("architectures", json::array({"LlamaForSequenceClassification"})), UnsupportedError);
  CHECK_THROWS_WITH(smol_with("architectures", json::array({"LlamaForSequenceClassification"})), Contains("ForCausalLM"));
  CHECK_THROWS_WITH(smol_with("hidden_act", "gelu"), Contains("gelu"));
  CHECK_THROWS_AS(smol_with("mlp_bias", true), UnsupportedError);
  json q = fixture_json("Qwen2.5-7B-Instruct");
  q["use_sliding_window"] = true;
  CHECK_THROWS_AS(from_hf_config(q), UnsupportedError);
  CHECK_THROWS_WITH(from_hf_config(q), Contains("use_sliding_window"));
}

TEST_CASE("hf config: quantization_config names the layout and the quantizer that reads it", "[model][config][quant]") {
  // As published: a GPTQ (AutoGPTQ / GPTQModel), an AWQ (AutoAWQ), an FP8 (vLLM / ModelOpt) and two
  // compressed-tensors (llm-compressor) checkpoints' quantization_config.
  const auto gptq = smol_with("quantization_config", json{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128},
                                                           {"desc_act", true}, {"sym", true}, {"checkpoint_format", "gptq"}});
  REQUIRE(gptq.quantization);
  CHECK(gptq.quantization->quantizer == "int4");
  CHECK(gptq.quantization->group_size == 128);
  CHECK(gptq.quantization->act_order);
  const auto awq = smol_with("quantization_config", json{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 64},
                                                          {"zero_point", true}, {"version", "gemm"}});
  REQUIRE(awq.quantization);
  CHECK((awq.quantization->quantizer == "int4" && awq.quantization->group_size == 64 && !awq.quantization->symmetric));
  const auto fp8 = smol_with("quantization_config", json{{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}});
  CHECK((fp8.quantization && fp8.quantization->quantizer == "fp8" && fp8.quantization->weight_type == "float"));
  auto ct = [](json weights) {
    return json{{"quant_method", "compressed-tensors"}, {"format", "int-quantized"},
                {"config_groups", {{"group_0", {{"targets", json::array({"Linear"})}, {"weights", std::move(weights)}}}}}};
  };
  const auto ct8 = smol_with("quantization_config", ct({{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}, {"symmetric", true}}));
  CHECK((ct8.quantization && ct8.quantization->quantizer == "int8"));
  const auto ctf = smol_with("quantization_config", ct({{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}}));
  CHECK((ctf.quantization && ctf.quantization->quantizer == "fp8"));
  CHECK_FALSE(smol_with("quantization_config", nullptr).quantization);

  // Layouts infer does not read are refused by name, never loaded as something else.
  const std::vector<std::pair<json, std::string>> refused = {
      {{{"quant_method", "gptq"}, {"bits", 8}}, "bits = 8"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "gptq_v2"}}, "gptq_v2"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"version", "gemv"}}, "gemv"},
      {{{"quant_method", "fp8"}, {"activation_scheme", "static"}}, "static"},
      {ct({{"num_bits", 4}, {"type", "int"}, {"strategy", "group"}, {"group_size", 128}}), "4-bit int"},
      {{{"quant_method", "bitsandbytes"}}, "bitsandbytes"},
  };
  for (const auto& [qc, what] : refused) {
    INFO(qc.dump());
    CHECK_THROWS_AS(smol_with("quantization_config", qc), UnsupportedError);
    CHECK_THROWS_WITH(smol_with("quantization_config", qc), Contains("quantization_config") && Contains(what));
  }
  CHECK_THROWS_AS(smol_with("quantization_config", json{{"bits", 4}}), FormatError);
  CHECK_THROWS_AS(smol_with("quantization_config", 4), FormatError);
}

TEST_CASE("hf config: wrongly typed keys are FormatErrors naming the key", "[model][config]") {
  const std::vector<std::pair<std::string, json>> bad = {
      {"hidden_size", "576"},        {"hidden_size", 576.0},     {"vocab_size", nullptr},
      {"num_hidden_layers", true},   {"rms_norm_eps", "1e-5"},   {"rope_theta", json::array()},
      {"tie_word_embeddings", 1},    {"attention_bias", "no"},   {"bos_token_id", "1"},
      {"eos_token_id", "2"},         {"eos_token_id", json::array({1, "2"})}, {"architectures", "LlamaForCausalLM"},
      {"architectures", json::array({1})},    {"head_dim", 64.5},         {"max_position_embeddings", 18446744073709551615ull},
      {"num_key_value_heads", "3"},  {"model_type", 3},          {"rope_parameters", 1},
  };
  for (const auto& [key, value] : bad) {
    INFO(key << " = " << value.dump());
    CHECK_THROWS_AS(smol_with(key, value), FormatError);
    CHECK_THROWS_WITH(smol_with(key, value), Contains("'" + key + "'") && Contains("smol/config.json"));
  }
  CHECK_THROWS_WITH(from_hf_config(json::array(), "x.json"), Contains("x.json") && Contains("object"));
}

TEST_CASE("model config: validate() names the field and value", "[model][config]") {
  const auto base = fixture_config("SmolLM2-135M-Instruct");
  CHECK_NOTHROW(base.validate());
  auto fails = [&](auto mutate, const std::string& what) {
    ModelConfig c = base;
    mutate(c);
    CHECK_THROWS_AS(c.validate(), FormatError);
    CHECK_THROWS_WITH(c.validate(), Contains(what));
  };
  fails([](ModelConfig& c) { c.vocab_size = 0; }, "vocab_size = 0");
  fails([](ModelConfig& c) { c.hidden_size = -576; }, "hidden_size = -576");
  fails([](ModelConfig& c) { c.intermediate_size = 0; }, "intermediate_size = 0");
  fails([](ModelConfig& c) { c.num_layers = 0; }, "num_layers = 0");
  fails([](ModelConfig& c) { c.num_heads = 0; }, "num_heads = 0");
  fails([](ModelConfig& c) { c.num_kv_heads = -1; }, "num_kv_heads = -1");
  fails([](ModelConfig& c) { c.head_dim = 0; }, "head_dim = 0");
  fails([](ModelConfig& c) { c.max_position_embeddings = 0; }, "max_position_embeddings = 0");
  fails([](ModelConfig& c) { c.num_heads = 7; }, "num_heads = 7 does not divide hidden_size = 576");
  fails([](ModelConfig& c) { c.num_kv_heads = 2; }, "num_kv_heads = 2 does not divide num_heads = 9");
  fails([](ModelConfig& c) { c.head_dim = 63; }, "head_dim = 63 must be even");
  fails([](ModelConfig& c) { c.rms_norm_eps = 0.0f; }, "rms_norm_eps = 0");
  fails([](ModelConfig& c) { c.rms_norm_eps = std::nanf(""); }, "rms_norm_eps");
  fails([](ModelConfig& c) { c.rope_theta = -1.0f; }, "rope_theta = -1");
  fails([](ModelConfig& c) { c.rope_theta = INFINITY; }, "rope_theta");
  fails([](ModelConfig& c) { c.rope_scaling = {RopeScaling::Kind::linear, 0.0f}; }, "rope_scaling.factor = 0");
  fails([](ModelConfig& c) { c.rope_scaling = {RopeScaling::Kind::llama3, 8.0f, 1.0f, 4.0f, 0}; },
        "rope_scaling.original_max_position_embeddings = 0");
  fails([](ModelConfig& c) { c.sliding_window = 0; }, "sliding_window = 0");
  fails([](ModelConfig& c) { c.bos_token_id = 49152; }, "bos_token_id = 49152 is outside the vocabulary [0, 49152)");
  fails([](ModelConfig& c) { c.eos_token_ids = {2, -1}; }, "eos_token_id = -1");
  // The last valid token id passes.
  ModelConfig edge = base;
  edge.eos_token_ids = {49151};
  CHECK_NOTHROW(edge.validate());
  // Through the reader the file is named too.
  CHECK_THROWS_WITH(smol_with("num_key_value_heads", 2), Contains("smol/config.json") && Contains("num_kv_heads = 2"));
  CHECK_THROWS_WITH(smol_with("num_attention_heads", 0), Contains("num_attention_heads"));
}

TEST_CASE("rope_inv_freq: plain, linear and llama3 against hand-computed values", "[model][rope]") {
  ModelConfig c = fixture_config("SmolLM2-135M-Instruct");
  c.head_dim = 8;
  c.rope_theta = 10000.0f;  // inv_freq[i] = 10000^(-i/4) = 1, 0.1, 0.01, 0.001
  auto f = rope_inv_freq(c);
  REQUIRE(f.size() == 4);
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == Approx(0.1).epsilon(1e-7));
  CHECK(f[2] == Approx(0.01).epsilon(1e-7));
  CHECK(f[3] == Approx(0.001).epsilon(1e-7));

  c.rope_scaling = {RopeScaling::Kind::linear, 4.0f};
  f = rope_inv_freq(c);
  CHECK(f[0] == 0.25f);
  CHECK(f[3] == Approx(0.00025).epsilon(1e-7));

  // llama3, factor 8, low 1, high 4, original 64: wavelengths 2*pi/f = 6.28, 62.8, 628, 6283 against
  // w_hi = 64/4 = 16 and w_lo = 64/1 = 64.
  //   6.28 < 16            -> kept:    1
  //   16 <= 62.8 <= 64     -> ramp:    s = (64/62.83 - 1)/3 = 0.00619721; 0.0125(1-s) + 0.1 s = 0.01304226
  //   628, 6283 > 64       -> divided: 0.00125, 0.000125
  c.rope_scaling = {RopeScaling::Kind::llama3, 8.0f, 1.0f, 4.0f, 64};
  f = rope_inv_freq(c);
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == Approx(0.0130422562).epsilon(1e-6));
  CHECK(f[2] == Approx(0.00125).epsilon(1e-7));
  CHECK(f[3] == Approx(0.000125).epsilon(1e-7));

  // The real Llama-3.1 config: 64 frequencies, the first kept, the last divided by 8.
  const auto l = rope_inv_freq(fixture_config("Llama-3.1-8B-Instruct"));
  REQUIRE(l.size() == 64);
  CHECK(l[0] == 1.0f);
  CHECK(l[63] == Approx(std::pow(500000.0, -126.0 / 128.0) / 8.0).epsilon(1e-6));
  for (std::size_t i = 1; i < l.size(); ++i) CHECK(l[i] < l[i - 1]);  // monotone across the ramp

  ModelConfig odd = c;
  odd.head_dim = 7;
  CHECK_THROWS_AS(rope_inv_freq(odd), InvalidArgument);
}

TEST_CASE("load_hf_config: files, folders and read errors", "[model][config]") {
  const auto dir = std::filesystem::temp_directory_path() / ("infer_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(test::fixture("configs/Mistral-7B-Instruct-v0.3.json"), dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  CHECK(load_hf_config(dir).family == ModelFamily::mistral);  // a folder means its config.json
  std::ofstream(dir / "broken.json") << "{\"model_type\": ";
  CHECK_THROWS_AS(load_hf_config(dir / "broken.json"), FormatError);
  CHECK_THROWS_WITH(load_hf_config(dir / "broken.json"), Contains("broken.json") && Contains("not valid JSON"));
  std::ofstream(dir / "typed.json") << R"({"model_type": "llama", "hidden_size": "big"})";
  CHECK_THROWS_WITH(load_hf_config(dir / "typed.json"), Contains("typed.json") && Contains("'hidden_size'"));
  CHECK_THROWS_AS(load_hf_config(dir / "absent.json"), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("dummy presets: Llama-3-70B's shape for the multi-GPU runs", "[model][config]") {
  // 80 layers, hidden 8,192, 64 query and 8 KV heads of 128, FFN 28,672: Llama-3-70B's published config.json.
  const ModelConfig c = dummy_preset("llama3-70b");
  CHECK(c.num_layers == 80);
  CHECK(c.hidden_size == 8192);
  CHECK(c.intermediate_size == 28672);
  CHECK(c.num_heads == 64);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.vocab_size == 128256);
  CHECK_FALSE(c.tie_word_embeddings);
  // Its weights: 70.6 billion values (the embedding and the head untied), what FP8 at TP = 2 splits in two.
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, kv = c.num_kv_heads * c.head_dim;
  const std::int64_t per_layer = H * (H + 2 * kv) + H * H + 3 * H * I + 2 * H;
  const std::int64_t total = c.num_layers * per_layer + 2 * V * H + H;
  CHECK(total == 70553706496);
  CHECK_THROWS_WITH(dummy_preset("llama3-405b"), Catch::Contains("llama3-70b"));
}
