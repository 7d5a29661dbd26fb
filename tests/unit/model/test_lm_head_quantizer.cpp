// The LM head goes through the Quantizer, tied or not (llama_weights.hpp): a Quantizer with `embed` holds
// the embedding once and a tied head is that weight; one without `embed` gets the tied head as a second
// load of the embedding's tensor. Either way the logits are F32's, bit for bit.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "infer/attention/paged_attention.hpp"
#include "infer/model/llama.hpp"
#include "infer/quant/f32.hpp"
#include "infer/testing/tiny_model.hpp"

using namespace infer;

namespace {

// F32's storage and matmul, counting, with (`Embeds`) or without an `embed` of its own.
template <bool Embeds>
struct Counting {
  static constexpr std::string_view name = "counting";
  template <class B>
  using linear = F32::linear<B>;
  static inline std::vector<std::string> loaded;
  static inline std::int64_t matmuls = 0, embeds = 0;
  template <class B>
  static linear<B> load(const WeightTensor& t, cpu = {}) {
    loaded.push_back(t.name);
    return F32::load<B>(t);
  }
  static void matmul(cpu, const linear<cpu>& w, const float* x, std::int32_t rows, float* y) {
    ++matmuls;
    F32::matmul(cpu{}, w, x, rows, y);
  }
  static void embed(const linear<cpu>& w, std::int32_t id, float* row)
    requires Embeds
  {
    ++embeds;
    F32::embed(w, id, row);
  }
};
using WithEmbed = Counting<true>;
using WithoutEmbed = Counting<false>;
static_assert(EmbeddingQuantizer<WithEmbed, cpu>);
static_assert(Quantizer<WithoutEmbed, cpu> && !EmbeddingQuantizer<WithoutEmbed, cpu>);

template <class Q>
std::vector<float> logits_of(const ModelSource& src, std::span<const std::int32_t> tokens) {
  auto model = LlamaModel<cpu, Q, PagedAttention<>>::load(src);
  const ModelConfig& c = model.config();
  KvCache<cpu> cache(static_cast<std::int32_t>(c.num_layers), 4, 16, static_cast<std::int32_t>(c.num_kv_heads),
                     static_cast<std::int32_t>(c.head_dim));
  const std::vector<std::int32_t> table = {0, 1, 2, 3};
  const ForwardChunk chunk{tokens, 0, table, true};
  std::vector<float> z;
  model.forward(std::span(&chunk, 1), cache, z);
  return z;
}

template <class Q>
void reset() {
  Q::loaded.clear();
  Q::matmuls = 0;
  Q::embeds = 0;
}

// A tensor's name in GGUF's spelling or HF's (dummy weights take HF's).
bool is_embedding(const std::string& t) {
  return t.find("token_embd") != std::string::npos || t.find("embed_tokens") != std::string::npos;
}
bool is_head(const std::string& t) { return t.find("output.weight") != std::string::npos || t.find("lm_head") != std::string::npos; }

}  // namespace

TEST_CASE("the LM head goes through the Quantizer, tied or not, with or without embed", "[model][quant]") {
  const std::vector<std::int32_t> tokens = {5, 17, 42, 7, 300};
  for (const bool tied : {true, false}) {
    ModelConfig config = testing::small_llama();
    config.tie_word_embeddings = tied;
    const ModelSource src = testing::tiny_model(3, config);
    INFO((tied ? "tied" : "untied"));
    const auto want = logits_of<F32>(src, tokens);
    const auto layers = static_cast<std::size_t>(config.num_layers);

    reset<WithEmbed>();
    CHECK(logits_of<WithEmbed>(src, tokens) == want);
    // 7 per layer, the embedding, and the head when it has its own weight.
    CHECK(WithEmbed::loaded.size() == 7 * layers + 1 + (tied ? 0 : 1));
    CHECK(is_embedding(WithEmbed::loaded.front()));
    if (!tied) CHECK(is_head(WithEmbed::loaded.at(1)));
    CHECK(WithEmbed::embeds == static_cast<std::int64_t>(tokens.size()));
    CHECK(WithEmbed::matmuls == static_cast<std::int64_t>(7 * layers + 1));  // one step: 7 per layer + the head

    reset<WithoutEmbed>();
    CHECK(logits_of<WithoutEmbed>(src, tokens) == want);
    // No embed: the embedding is f32 outside the Quantizer; the head is loaded through it, tied or not.
    CHECK(WithoutEmbed::loaded.size() == 7 * layers + 1);
    CHECK((tied ? is_embedding(WithoutEmbed::loaded.front()) : is_head(WithoutEmbed::loaded.front())));
    CHECK(WithoutEmbed::matmuls == static_cast<std::int64_t>(7 * layers + 1));
  }
}
