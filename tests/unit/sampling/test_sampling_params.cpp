// SamplingParams: vLLM's defaults, and every validation rule rejecting its first bad value with a message
// that names the field, the value and the range; accepted boundary values pass.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "infer/sampling/sampling_params.hpp"

using infer::InvalidArgument;
using infer::SamplingParams;
using Catch::Matchers::Contains;

namespace {
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

template <class F>
SamplingParams with(F&& change) {
  SamplingParams p;
  change(p);
  return p;
}
}  // namespace

TEST_CASE("defaults are vLLM's and valid", "[sampling_params]") {
  const SamplingParams p;
  CHECK(p.n == 1);
  CHECK(p.temperature == 1.0f);
  CHECK(p.top_p == 1.0f);
  CHECK(p.top_k == 0);
  CHECK(p.min_p == 0.0f);
  CHECK(p.repetition_penalty == 1.0f);
  CHECK(p.presence_penalty == 0.0f);
  CHECK(p.frequency_penalty == 0.0f);
  CHECK_FALSE(p.seed.has_value());
  CHECK(p.stop.empty());
  CHECK(p.stop_token_ids.empty());
  CHECK_FALSE(p.ignore_eos);
  CHECK(p.max_tokens == 16);
  CHECK(p.min_tokens == 0);
  CHECK_FALSE(p.logprobs.has_value());
  CHECK(p.skip_special_tokens);
  CHECK_FALSE(p.include_stop_str_in_output);
  CHECK_FALSE(p.greedy());
  CHECK_NOTHROW(p.validate());
  CHECK_NOTHROW(p.validate(49152));
}

TEST_CASE("greedy below the epsilon temperature", "[sampling_params]") {
  CHECK(with([](auto& p) { p.temperature = 0.0f; }).greedy());
  CHECK(with([](auto& p) { p.temperature = 1e-6f; }).greedy());
  CHECK_FALSE(with([](auto& p) { p.temperature = 1e-4f; }).greedy());
}

TEST_CASE("boundary values are accepted", "[sampling_params]") {
  auto ok = [](auto change) { CHECK_NOTHROW(with(change).validate(100)); };
  ok([](auto& p) { p.temperature = 0.0f; });
  ok([](auto& p) { p.temperature = 2.0f; });
  ok([](auto& p) { p.top_p = 1e-6f; });
  ok([](auto& p) { p.top_k = -1; });
  ok([](auto& p) { p.top_k = 1; });
  ok([](auto& p) { p.top_k = 1000000; });  // larger than the vocabulary: off
  ok([](auto& p) { p.min_p = 1.0f; });
  ok([](auto& p) { p.presence_penalty = -2.0f; });
  ok([](auto& p) { p.frequency_penalty = 2.0f; });
  ok([](auto& p) { p.repetition_penalty = 0.01f; });
  ok([](auto& p) { p.max_tokens = 1; });
  ok([](auto& p) { p.min_tokens = 16; });
  ok([](auto& p) { p.n = 128; });
  ok([](auto& p) { p.stop = std::vector<std::string>(16, "x"); });
  ok([](auto& p) { p.stop = {std::string(256, 'a'), "é"}; });
  ok([](auto& p) { p.stop_token_ids = {0, 99}; });
  ok([](auto& p) { p.logprobs = 0; });
  ok([](auto& p) { p.logprobs = 20; });
  ok([](auto& p) { p.seed = std::numeric_limits<std::uint64_t>::max(); });
}

TEST_CASE("each bad field is named with its value and range", "[sampling_params]") {
  auto bad = [](auto change, const std::string& field, const std::string& value, const std::string& range) {
    INFO(field << " = " << value);
    const SamplingParams p = with(change);
    CHECK_THROWS_AS(p.validate(), InvalidArgument);
    CHECK_THROWS_WITH(p.validate(), Contains(field + " = " + value) && Contains(range));
  };
  bad([](auto& p) { p.n = 0; }, "n", "0", "[1, 128]");
  bad([](auto& p) { p.n = 129; }, "n", "129", "[1, 128]");
  bad([](auto& p) { p.temperature = -0.5f; }, "temperature", "-0.5", "[0, 2]");
  bad([](auto& p) { p.temperature = 2.5f; }, "temperature", "2.5", "[0, 2]");
  bad([](auto& p) { p.top_p = 0.0f; }, "top_p", "0", "(0, 1]");
  bad([](auto& p) { p.top_p = 1.5f; }, "top_p", "1.5", "(0, 1]");
  bad([](auto& p) { p.top_k = -2; }, "top_k", "-2", ">= 1");
  bad([](auto& p) { p.min_p = -0.1f; }, "min_p", "-0.1", "[0, 1]");
  bad([](auto& p) { p.min_p = 1.5f; }, "min_p", "1.5", "[0, 1]");
  bad([](auto& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty", "0", "> 0");
  bad([](auto& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty", "-1", "> 0");
  bad([](auto& p) { p.presence_penalty = 2.5f; }, "presence_penalty", "2.5", "[-2, 2]");
  bad([](auto& p) { p.presence_penalty = -3.0f; }, "presence_penalty", "-3", "[-2, 2]");
  bad([](auto& p) { p.frequency_penalty = -2.5f; }, "frequency_penalty", "-2.5", "[-2, 2]");
  bad([](auto& p) { p.max_tokens = 0; }, "max_tokens", "0", ">= 1");
  bad([](auto& p) { p.min_tokens = -1; }, "min_tokens", "-1", "[0, max_tokens]");
  bad([](auto& p) { p.min_tokens = 17; }, "min_tokens", "17", "max_tokens = 16");
  bad([](auto& p) { p.logprobs = -1; }, "logprobs", "-1", "[0, 20]");
  bad([](auto& p) { p.logprobs = 21; }, "logprobs", "21", "[0, 20]");
  bad([](auto& p) { p.stop_token_ids = {5, -3}; }, "stop_token_ids[1]", "-3", "[0, ");
}

TEST_CASE("NaN and infinities are rejected in every float field", "[sampling_params]") {
  using Setter = void (*)(SamplingParams&, float);
  const std::pair<const char*, Setter> fields[] = {
      {"temperature", [](SamplingParams& p, float v) { p.temperature = v; }},
      {"top_p", [](SamplingParams& p, float v) { p.top_p = v; }},
      {"min_p", [](SamplingParams& p, float v) { p.min_p = v; }},
      {"repetition_penalty", [](SamplingParams& p, float v) { p.repetition_penalty = v; }},
      {"presence_penalty", [](SamplingParams& p, float v) { p.presence_penalty = v; }},
      {"frequency_penalty", [](SamplingParams& p, float v) { p.frequency_penalty = v; }},
  };
  for (const auto& [name, set] : fields) {
    for (float v : {nan_f, inf_f, -inf_f}) {
      INFO(name << " = " << v);
      SamplingParams p;
      set(p, v);
      CHECK_THROWS_AS(p.validate(), InvalidArgument);
      CHECK_THROWS_WITH(p.validate(), Contains(std::string(name) + " = "));
    }
  }
  SamplingParams p;
  p.temperature = nan_f;
  CHECK_THROWS_WITH(p.validate(), Contains("not a finite number"));
}

TEST_CASE("stop strings: count, emptiness, length, UTF-8", "[sampling_params]") {
  SamplingParams p;
  p.stop = std::vector<std::string>(17, "x");
  CHECK_THROWS_AS(p.validate(), InvalidArgument);
  CHECK_THROWS_WITH(p.validate(), Contains("stop has 17 strings") && Contains("at most 16"));

  p.stop = {"ok", ""};
  CHECK_THROWS_WITH(p.validate(), Contains("stop[1] is empty"));

  p.stop = {std::string(257, 'a')};
  CHECK_THROWS_WITH(p.validate(), Contains("stop[0] is 257 bytes") && Contains("at most 256"));

  p.stop = {"fine", "bad\xff"};
  CHECK_THROWS_AS(p.validate(), InvalidArgument);
  CHECK_THROWS_WITH(p.validate(), Contains("stop[1] is not valid UTF-8") && Contains("offset 3"));
}

TEST_CASE("stop_token_ids are checked against the vocabulary", "[sampling_params]") {
  SamplingParams p;
  p.stop_token_ids = {2, 49152};
  CHECK_NOTHROW(p.validate());  // without a vocabulary only negatives are known to be wrong
  CHECK_THROWS_AS(p.validate(49152), InvalidArgument);
  CHECK_THROWS_WITH(p.validate(49152), Contains("stop_token_ids[1] = 49152") && Contains("[0, 49152)") &&
                                           Contains("49152 tokens"));
  CHECK_NOTHROW(p.validate(49153));
  CHECK_THROWS_WITH(SamplingParams{}.validate(0), Contains("vocab_size = 0"));
}
