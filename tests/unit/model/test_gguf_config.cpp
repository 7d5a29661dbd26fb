#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "infer/model/gguf_config.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using Catch::Contains;

namespace {

using Bytes = std::vector<std::byte>;

/// A minimal GGUF v3 writer: metadata entries and F32 tensors of one element, enough to reach every
/// branch of from_gguf without a real model.
class GgufBuilder {
 public:
  GgufBuilder& u32(const std::string& k, std::uint32_t v) { return kv(k, 4, [&] { put(v); }); }
  GgufBuilder& f32(const std::string& k, float v) { return kv(k, 6, [&] { put(v); }); }
  GgufBuilder& str(const std::string& k, const std::string& v) { return kv(k, 8, [&] { put_str(v); }); }
  GgufBuilder& strings(const std::string& k, const std::vector<std::string>& v) {
    return kv(k, 9, [&] {
      put(std::uint32_t{8});
      put(static_cast<std::uint64_t>(v.size()));
      for (const auto& s : v) put_str(s);
    });
  }
  GgufBuilder& tensor(const std::string& name) {
    tensors_.push_back(name);
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

  [[nodiscard]] Bytes build() const {
    Bytes out;
    auto raw = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    };
    auto u32v = [&](std::uint32_t v) { raw(&v, 4); };
    auto u64v = [&](std::uint64_t v) { raw(&v, 8); };
    raw("GGUF", 4);
    u32v(3);
    u64v(tensors_.size());
    u64v(count_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      u64v(tensors_[i].size());
      raw(tensors_[i].data(), tensors_[i].size());
      u32v(1);   // n_dims
      u64v(1);   // shape [1]
      u32v(0);   // F32
      u64v(32 * i);
    }
    out.resize((out.size() + 31) / 32 * 32);
    out.resize(out.size() + 32 * tensors_.size());
    return out;
  }

 private:
  template <class F>
  GgufBuilder& kv(const std::string& k, std::uint32_t type, F&& value) {
    put_str(k);
    put(type);
    value();
    ++count_;
    return *this;
  }
  template <class T>
  void put(T v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    kv_.insert(kv_.end(), b, b + sizeof(T));
  }
  void put_str(const std::string& s) {
    put(static_cast<std::uint64_t>(s.size()));
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    kv_.insert(kv_.end(), b, b + s.size());
  }
  Bytes kv_;
  std::uint64_t count_ = 0;
  std::vector<std::string> tensors_;
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
