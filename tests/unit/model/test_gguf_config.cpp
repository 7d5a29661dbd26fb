#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/gguf_writer.hpp"
#include "infer/model/gguf_config.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using Catch::Contains;

namespace {

using Bytes = std::vector<std::byte>;

/// Fluent shorthands over the shared test writer: metadata entries and one-element F32 tensors, enough
/// to reach every branch of from_gguf without a real model.
class GgufBuilder {
 public:
  GgufBuilder& u32(const std::string& k, std::uint32_t v) { return add(k, gguf::Value{v}); }
  GgufBuilder& f32(const std::string& k, float v) { return add(k, gguf::Value{v}); }
  GgufBuilder& str(const std::string& k, const std::string& v) { return add(k, gguf::Value{v}); }
  GgufBuilder& strings(const std::string& k, const std::vector<std::string>& v) {
    gguf::Array a{gguf::ValueType::string, {}};
    for (const auto& s : v) a.items.push_back(gguf::Value{s});
    return add(k, gguf::Value{std::move(a)});
  }
  GgufBuilder& tensor(const std::string& name) {
    w_.tensor_f32(name, {1}, {0.0f});
    return *this;
  }
  /// The standard keys of a tiny valid llama: 2 layers, hidden 64, 4 heads / 2 kv heads.
  GgufBuilder& tiny(const std::string& arch = "llama") {
    str("general.architecture", arch);
    u32(arch + ".block_count", 2);
    u32(arch + ".context_length", 256);
    u32(arch + ".embedding_length", 64);
    u32(arch + ".feed_forward_length", 128);
    u32(arch + ".attention.head_count", 4);
    u32(arch + ".attention.head_count_kv", 2);
    f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
    return *this;
  }
  [[nodiscard]] Bytes build() const { return w_.build(); }

 private:
  GgufBuilder& add(const std::string& k, gguf::Value v) {
    w_.add(k, std::move(v));
    return *this;
  }
  test::GgufWriter w_;
};

ModelConfig config_of(const GgufBuilder& b) { return from_gguf(gguf::File::from_bytes(b.build())); }

}  // namespace

TEST_CASE("gguf config: the default SmolLM2-135M-Instruct model", "[model][gguf]") {
  const auto f = gguf::File::open(test::default_model());
  const ModelConfig c = from_gguf(f);
  CHECK(c.family == ModelFamily::llama);
  CHECK(c.architecture == "llama");
  CHECK(c.num_layers == 30);
  CHECK(c.hidden_size == 576);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.vocab_size == 49152);
  CHECK(c.rope_theta == 100000.0f);
  CHECK(c.rope_style == RopeStyle::interleaved);  // llama.cpp permuted the q/k rows
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::none);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK(c.max_position_embeddings == 8192);
  CHECK(c.tie_word_embeddings);
  CHECK_FALSE(c.attention_bias);
  CHECK_FALSE(c.sliding_window.has_value());
  CHECK(c.bos_token_id == std::optional<std::int64_t>(1));
  CHECK(c.eos_token_ids == std::vector<std::int64_t>{2});
  CHECK_NOTHROW(c.validate());
}

TEST_CASE("gguf config: a tiny synthetic llama, defaults and derived fields", "[model][gguf]") {
  GgufBuilder b;
  b.tiny().strings("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e"}).tensor("output.weight");
  const auto c = config_of(b);
  CHECK(c.num_layers == 2);
  CHECK(c.hidden_size == 64);
  CHECK(c.head_dim == 16);
  CHECK(c.num_kv_heads == 2);
  CHECK(c.vocab_size == 5);                // counted from tokenizer.ggml.tokens
  CHECK(c.rope_theta == 10000.0f);         // rope.freq_base absent
  CHECK(c.rms_norm_eps == 1e-6f);
  CHECK_FALSE(c.tie_word_embeddings);      // output.weight exists
  CHECK_FALSE(c.attention_bias);
  CHECK_FALSE(c.bos_token_id.has_value());
  CHECK(c.eos_token_ids.empty());

  GgufBuilder v;
  v.tiny().u32("llama.vocab_size", 300).u32("llama.attention.key_length", 32).u32("llama.rope.dimension_count", 32);
  const auto cv = config_of(v);
  CHECK(cv.vocab_size == 300);
  CHECK(cv.head_dim == 32);  // attention.key_length wins over hidden / heads
  CHECK(cv.tie_word_embeddings);
}

TEST_CASE("gguf config: qwen2 with q/k/v biases", "[model][gguf]") {
  GgufBuilder b;
  b.tiny("qwen2").u32("qwen2.vocab_size", 1000).f32("qwen2.rope.freq_base", 1e6f).tensor("blk.0.attn_q.bias");
  b.u32("tokenizer.ggml.bos_token_id", 7).u32("tokenizer.ggml.eos_token_id", 9);
  const auto c = config_of(b);
  CHECK(c.family == ModelFamily::qwen2);
  CHECK(c.rope_style == RopeStyle::neox);
  CHECK(c.attention_bias);
  CHECK(c.rope_theta == 1e6f);
  CHECK(c.bos_token_id == std::optional<std::int64_t>(7));
  CHECK(c.eos_token_ids == std::vector<std::int64_t>{9});
}

TEST_CASE("gguf config: RoPE scaling", "[model][gguf]") {
  GgufBuilder lin;
  lin.tiny().u32("llama.vocab_size", 10).str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 4.0f);
  const auto c = config_of(lin);
  CHECK(c.rope_scaling.kind == RopeScaling::Kind::linear);
  CHECK(c.rope_scaling.factor == 4.0f);

  GgufBuilder old;
  old.tiny().u32("llama.vocab_size", 10).f32("llama.rope.scale_linear", 2.0f);
  CHECK(config_of(old).rope_scaling.factor == 2.0f);

  GgufBuilder none;
  none.tiny().u32("llama.vocab_size", 10).str("llama.rope.scaling.type", "none");
  CHECK(config_of(none).rope_scaling.kind == RopeScaling::Kind::none);

  GgufBuilder yarn;
  yarn.tiny().u32("llama.vocab_size", 10).str("llama.rope.scaling.type", "yarn");
  CHECK_THROWS_AS(config_of(yarn), UnsupportedError);
  CHECK_THROWS_WITH(config_of(yarn), Contains("yarn") && Contains("llama.rope.scaling.type"));

  GgufBuilder freqs;
  freqs.tiny().u32("llama.vocab_size", 10).tensor("rope_freqs.weight");
  CHECK_THROWS_WITH(config_of(freqs), Contains("rope_freqs.weight"));

  GgufBuilder partial;
  partial.tiny().u32("llama.vocab_size", 10).u32("llama.rope.dimension_count", 8);
  CHECK_THROWS_AS(config_of(partial), UnsupportedError);
  CHECK_THROWS_WITH(config_of(partial), Contains("rope.dimension_count") && Contains("8"));
}

TEST_CASE("gguf config: unsupported, missing and malformed metadata", "[model][gguf]") {
  GgufBuilder gemma;
  gemma.tiny("gemma2").u32("gemma2.vocab_size", 10);
  CHECK_THROWS_AS(config_of(gemma), UnsupportedError);
  CHECK_THROWS_WITH(config_of(gemma), Contains("gemma2") && Contains("llama") && Contains("qwen2"));

  GgufBuilder no_arch;
  no_arch.u32("llama.block_count", 2);
  CHECK_THROWS_AS(config_of(no_arch), NotFoundError);

  GgufBuilder no_layers;
  no_layers.str("general.architecture", "llama").u32("llama.vocab_size", 10);
  CHECK_THROWS_AS(config_of(no_layers), NotFoundError);
  CHECK_THROWS_WITH(config_of(no_layers), Contains("llama.block_count"));

  GgufBuilder no_vocab;
  no_vocab.tiny();
  CHECK_THROWS_AS(config_of(no_vocab), NotFoundError);
  CHECK_THROWS_WITH(config_of(no_vocab), Contains("tokenizer.ggml.tokens") && Contains("llama.vocab_size"));

  GgufBuilder wrong_type;
  wrong_type.tiny().str("llama.vocab_size", "many");
  CHECK_THROWS_AS(config_of(wrong_type), FormatError);
  CHECK_THROWS_WITH(config_of(wrong_type), Contains("llama.vocab_size"));

  GgufBuilder bad_heads;  // 4 heads over 3 kv heads: validate() rejects, naming the field
  bad_heads.str("general.architecture", "llama").u32("llama.block_count", 2).u32("llama.context_length", 256);
  bad_heads.u32("llama.embedding_length", 64).u32("llama.feed_forward_length", 128).u32("llama.attention.head_count", 4);
  bad_heads.u32("llama.attention.head_count_kv", 3).f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  bad_heads.u32("llama.vocab_size", 10);
  CHECK_THROWS_AS(config_of(bad_heads), FormatError);
  CHECK_THROWS_WITH(config_of(bad_heads), Contains("num_kv_heads = 3") && Contains("<memory>"));

  GgufBuilder bad_eos;
  bad_eos.tiny().u32("llama.vocab_size", 10).u32("tokenizer.ggml.eos_token_id", 10);
  CHECK_THROWS_WITH(config_of(bad_eos), Contains("eos_token_id = 10"));
}
