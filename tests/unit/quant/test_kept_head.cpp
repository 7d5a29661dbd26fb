// The LM head kept out of the low-precision formats (quant/kept_head.hpp): Int8WeightOnly, Fp8 and Int4 hold
// it, tied or not, in f32 exactly as F32 does, multiply it as F32 does, quantize the same tensor when it is
// not the head, and a linear with a kept head and format arrays beside it is not consistent (what an engine
// file's parts are checked against).
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "infer/quant/fp8.hpp"
#include "infer/quant/int4.hpp"
#include "infer/quant/int8_weight_only.hpp"
#include "support/fixtures.hpp"

using namespace infer;
using namespace infer::test;

TEMPLATE_TEST_CASE("A low-precision quantizer keeps the LM head as F32 holds it, tied or not", "[quant][kept-head]",
                   Int8WeightOnly, Fp8, Int4) {
  using Q = TestType;
  // tiny_llama has its own head ("output"); tiny_qwen2's is tied to the embedding (loaded as "token_embd").
  for (const std::string fix : {"tiny_llama", "tiny_qwen2"}) {
    INFO(Q::name << " on " << fix);
    const ModelSource src = ModelSource::open(fixture(fix));
    const ModelConfig& c = src.config();
    const std::string role = c.tie_word_embeddings ? "token_embd" : "output";
    const auto head = Q::template load<cpu>(LinearRequest{src, role, c.vocab_size, c.hidden_size, /*lm_head=*/true});
    const auto want = F32::load<cpu>(src.get(role));
    CHECK(head.is_dense());
    CHECK(head.consistent());
    CHECK(head.dense == want.w);
    CHECK(head.value(3, 5) == want.w[static_cast<std::size_t>(3 * c.hidden_size + 5)]);
    // The same tensor as any other layer is quantized.
    const auto as_layer = Q::template load<cpu>(LinearRequest{src, role, c.vocab_size, c.hidden_size});
    CHECK_FALSE(as_layer.is_dense());
    CHECK(as_layer.consistent());
    // The head's matmul is F32's, bit for bit.
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(3 * c.hidden_size));
    std::vector<float> a(static_cast<std::size_t>(3 * c.vocab_size)), b(a.size());
    for (float& v : x) v = n(rng);
    Q::matmul(cpu{}, head, x.data(), 3, a.data());
    F32::matmul(cpu{}, want, x.data(), 3, b.data());
    CHECK(a == b);
    // A kept head with the format's arrays beside it, or of the wrong size, is not consistent.
    auto mixed = head;
    mixed.scale.assign(1, 1.0f);
    CHECK_FALSE(mixed.consistent());
    auto short_head = head;
    short_head.dense.pop_back();
    CHECK_FALSE(short_head.consistent());
  }
}
