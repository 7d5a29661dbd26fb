// LogitsProcessor and Sampler: each processing step on hand-made logits with the exact survivors and
// values, greedy ties, min_tokens masking, raw logprobs, seeded reproducibility that other sequences'
// draws do not disturb, and a chi-square check of the categorical draw.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "infer/sampling/sampler.hpp"

using infer::InvalidArgument;
using infer::LogitsProcessor;
using infer::SampleResult;
using infer::Sampler;
using infer::SamplingParams;
using infer::SeqRng;
using Catch::Matchers::Contains;
using Ids = std::vector<std::int32_t>;
using Logits = std::vector<float>;

namespace {
constexpr float ninf = -std::numeric_limits<float>::infinity();

/// Ids whose logit survived (is not -inf).
Ids survivors(const Logits& l) {
  Ids out;
  for (std::size_t i = 0; i < l.size(); ++i) {
    if (l[i] != ninf) out.push_back(static_cast<std::int32_t>(i));
  }
  return out;
}

Logits log_of(std::initializer_list<double> probs) {
  Logits l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

/// A fixed, bumpy 1000-token distribution (no library RNG: identical on every platform).
Logits bumpy(std::size_t n = 1000) {
  Logits l(n);
  for (std::size_t i = 0; i < n; ++i) l[i] = 3.0f * static_cast<float>(std::sin(static_cast<double>(i) * 0.7));
  return l;
}

Ids draw_tokens(Sampler& s, const SamplingParams& p, SeqRng& rng, int count) {
  Ids out;
  for (int i = 0; i < count; ++i) {
    Logits l = bumpy();
    out.push_back(s.sample(l, p, {}, {}, rng));
  }
  return out;
}
}  // namespace

TEST_CASE("repetition penalty: HF semantics over prompt and output, once per token", "[sampler][penalty]") {
  LogitsProcessor proc;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Logits l{2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
  const Ids prompt{0, 0};
  const Ids output{1, 1, 1};
  proc.apply_penalties(l, p, prompt, output);
  CHECK(l == Logits{1.0f, -4.0f, 1.0f, 0.5f, 3.0f});  // > 0 divided, <= 0 multiplied, unseen unchanged

  // A repetition penalty < 1 rewards repeats instead.
  p.repetition_penalty = 0.5f;
  Logits r{2.0f, -2.0f};
  proc.apply_penalties(r, p, Ids{0, 1}, {});
  CHECK(r == Logits{4.0f, -1.0f});
}

TEST_CASE("frequency and presence penalties count output tokens only", "[sampler][penalty]") {
  LogitsProcessor proc;
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Logits l{1.0f, 1.0f, 1.0f, 0.5f, 3.0f};
  proc.apply_penalties(l, p, Ids{4, 4}, Ids{2, 2, 2, 3});
  CHECK(l == Logits{1.0f, 1.0f, -0.75f, -0.25f, 3.0f});  // 1 - 3*0.5 - 0.25; 0.5 - 0.5 - 0.25; prompt-only: none

  // Negative values encourage repetition.
  p.frequency_penalty = -1.0f;
  p.presence_penalty = -2.0f;
  Logits m{0.0f, 0.0f};
  proc.apply_penalties(m, p, {}, Ids{1, 1});
  CHECK(m == Logits{0.0f, 4.0f});

  // The scratch is clean between calls: a second call with no output changes nothing.
  p = SamplingParams{};
  p.frequency_penalty = 1.0f;
  Logits n{1.0f, 1.0f};
  proc.apply_penalties(n, p, {}, {});
  CHECK(n == Logits{1.0f, 1.0f});
}

TEST_CASE("repetition penalty comes before frequency penalty", "[sampler][penalty]") {
  LogitsProcessor proc;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 1.0f;
  Logits l{3.0f, 3.0f};
  proc.apply_penalties(l, p, {}, Ids{0});
  CHECK(l[0] == 0.5f);  // 3/2 - 1, not (3 - 1)/2
  CHECK(l[1] == 3.0f);
}

TEST_CASE("temperature divides the logits", "[sampler]") {
  Logits l{1.0f, -2.0f, 0.5f, ninf};
  LogitsProcessor::apply_temperature(l, 0.5f);
  CHECK(l == Logits{2.0f, -4.0f, 1.0f, ninf});
  Logits same{1.5f};
  LogitsProcessor::apply_temperature(same, 1.0f);
  CHECK(same == Logits{1.5f});
  CHECK_THROWS_AS(LogitsProcessor::apply_temperature(same, 0.0f), InvalidArgument);
}

TEST_CASE("top-k keeps the k largest, ties at the boundary included", "[sampler][top_k]") {
  LogitsProcessor proc;
  Logits l{1.0f, 5.0f, 3.0f, 4.0f, 2.0f};
  proc.apply_top_k(l, 2);
  CHECK(survivors(l) == Ids{1, 3});
  CHECK(l[1] == 5.0f);
  CHECK(l[3] == 4.0f);

  Logits tie{1.0f, 5.0f, 4.0f, 4.0f, 2.0f};
  proc.apply_top_k(tie, 2);
  CHECK(survivors(tie) == Ids{1, 2, 3});

  Logits one{1.0f, 5.0f, 3.0f};
  proc.apply_top_k(one, 1);
  CHECK(survivors(one) == Ids{1});

  for (std::int32_t off : {0, -1, 5, 6}) {
    Logits all{1.0f, 5.0f, 3.0f, 4.0f, 2.0f};
    proc.apply_top_k(all, off);
    CHECK(survivors(all) == Ids{0, 1, 2, 3, 4});
  }
}

TEST_CASE("top-p keeps the smallest head whose mass reaches top_p", "[sampler][top_p]") {
  LogitsProcessor proc;
  // Probabilities 0.15, 0.5, 0.1, 0.25 (shuffled so that sorting matters).
  auto run = [&](float top_p) {
    Logits l = log_of({0.15, 0.5, 0.1, 0.25});
    proc.apply_top_p(l, top_p);
    return survivors(l);
  };
  CHECK(run(0.4999f) == Ids{1});
  CHECK(run(0.5f) == Ids{1});           // exactly the top token's mass
  CHECK(run(0.5001f) == Ids{1, 3});
  CHECK(run(0.75f) == Ids{1, 3});       // exactly 0.5 + 0.25
  CHECK(run(0.7501f) == Ids{0, 1, 3});
  CHECK(run(0.9f) == Ids{0, 1, 3});     // exactly 0.5 + 0.25 + 0.15
  CHECK(run(0.9001f) == Ids{0, 1, 2, 3});
  CHECK(run(1.0f) == Ids{0, 1, 2, 3});
  CHECK(run(1e-6f) == Ids{1});          // always at least one token

  // Tied probabilities at the boundary are all kept.
  Logits tie = log_of({0.4, 0.2, 0.2, 0.2});
  proc.apply_top_p(tie, 0.5f);
  CHECK(survivors(tie) == Ids{0, 1, 2, 3});

  // Already-masked tokens stay masked and do not count toward the mass.
  Logits masked = log_of({0.5, 0.5, 0.5});
  masked[2] = ninf;
  proc.apply_top_p(masked, 0.9f);
  CHECK(survivors(masked) == Ids{0, 1});
}

TEST_CASE("boundaries exact in real arithmetic survive float rounding", "[sampler][top_p][min_p]") {
  // Without the 1e-6 tolerance, each of these loses or gains a token to rounding of log/exp/sums.
  const std::vector<std::vector<double>> dists = {
      {0.6, 0.3, 0.1}, {0.35, 0.25, 0.2, 0.15, 0.05}, {0.55, 0.3, 0.15}, {0.8, 0.15, 0.05}, {0.45, 0.35, 0.2}};
  LogitsProcessor proc;
  for (const auto& d : dists) {
    double cum = 0;
    for (std::size_t k = 0; k + 1 < d.size(); ++k) {
      cum += d[k];
      INFO("d[0] = " << d[0] << ", k = " << k);
      Logits l;
      for (double p : d) l.push_back(static_cast<float>(std::log(p)));
      Logits m = l;
      proc.apply_top_p(l, static_cast<float>(cum));
      CHECK(survivors(l).size() == k + 1);  // the first k + 1 reach exactly cum
      LogitsProcessor::apply_min_p(m, static_cast<float>(d[k + 1] / d[0]));
      CHECK(survivors(m).size() == k + 2);  // the token exactly at the ratio is kept
    }
  }
}

TEST_CASE("top-p over a large vocabulary equals a full sort", "[sampler][top_p]") {
  LogitsProcessor proc;
  const Logits base = bumpy(5000);
  for (float top_p : {0.05f, 0.3f, 0.62f, 0.9f, 0.99f}) {
    INFO("top_p = " << top_p);
    // Reference: sort everything, accumulate in double.
    std::vector<std::int32_t> order(base.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return base[a] > base[b]; });
    const float mx = base[static_cast<std::size_t>(order[0])];
    double total = 0;
    for (float v : base) total += std::exp(static_cast<double>(v) - mx);
    double mass = 0;
    float cutoff = mx;
    for (auto id : order) {
      mass += std::exp(static_cast<double>(base[static_cast<std::size_t>(id)]) - mx) / total;
      cutoff = base[static_cast<std::size_t>(id)];
      if (mass >= top_p) break;
    }
    Ids expected;
    for (std::size_t i = 0; i < base.size(); ++i) {
      if (base[i] >= cutoff) expected.push_back(static_cast<std::int32_t>(i));
    }
    Logits l = base;
    proc.apply_top_p(l, top_p);
    CHECK(survivors(l) == expected);
    CHECK(expected.size() > (top_p > 0.5f ? 64u : 0u));  // the large cases span several sorted chunks
  }
}

TEST_CASE("min-p drops tokens below min_p times the top probability", "[sampler][min_p]") {
  auto run = [](float min_p) {
    Logits l = log_of({0.2, 1.0, 0.5, 0.25});  // ratios to the top token
    LogitsProcessor::apply_min_p(l, min_p);
    return survivors(l);
  };
  CHECK(run(0.0f) == Ids{0, 1, 2, 3});
  CHECK(run(0.2f) == Ids{0, 1, 2, 3});   // exactly at the boundary: kept
  CHECK(run(0.2001f) == Ids{1, 2, 3});
  CHECK(run(0.25f) == Ids{1, 2, 3});
  CHECK(run(0.5f) == Ids{1, 2});
  CHECK(run(0.5001f) == Ids{1});
  CHECK(run(1.0f) == Ids{1});
}

TEST_CASE("apply runs every step in order", "[sampler]") {
  LogitsProcessor proc;
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.temperature = 0.5f;
  p.top_k = 3;
  p.min_p = 0.1f;
  // After the penalty: {1, 1, 2, 0.5, 3}; after temperature: {2, 2, 4, 1, 6};
  // top-3 keeps 4 and 6 plus both tied 2s; min-p 0.1 keeps logits >= 6 + ln 0.1 = 3.70: {4, 6}.
  Logits l{2.0f, 1.0f, 2.0f, 0.5f, 6.0f};
  proc.apply(l, p, Ids{0}, Ids{4});
  CHECK(survivors(l) == Ids{2, 4});
  CHECK(l[2] == 4.0f);
  CHECK(l[4] == 6.0f);
}

TEST_CASE("bad logits and token ids are InvalidArgument", "[sampler]") {
  LogitsProcessor proc;
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  Logits l{1.0f, 2.0f};
  CHECK_THROWS_AS(proc.apply(l, p, {}, Ids{7}), InvalidArgument);
  CHECK_THROWS_WITH(proc.apply(l, p, {}, Ids{7}), Contains("output token id 7") && Contains("2 entries"));
  CHECK_THROWS_WITH(proc.apply(l, p, Ids{-1}, {}), Contains("prompt token id -1"));
  CHECK(l == Logits{1.0f, 2.0f});  // nothing applied

  Logits bad{0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_WITH(proc.apply(bad, p, {}, {}), Contains("token 2") && Contains("nan"));
  Logits all_masked{ninf, ninf};
  CHECK_THROWS_WITH(proc.apply(all_masked, p, {}, {}), Contains("every logit is -inf"));
  Logits empty;
  Sampler s;
  SeqRng rng(1);
  CHECK_THROWS_AS(s.sample(empty, p, {}, {}, rng), InvalidArgument);

  p.min_tokens = 2;
  p.stop_token_ids = {9};
  Logits small{1.0f, 2.0f};
  CHECK_THROWS_WITH(proc.apply(small, p, {}, {}), Contains("stop_token_ids token id 9"));
}

TEST_CASE("greedy: argmax, lowest id on ties, penalties applied, no draw", "[sampler][greedy]") {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.0f;
  SeqRng rng(7);
  Logits l{1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(s.sample(l, p, {}, {}, rng) == 1);
  Logits all_equal{0.5f, 0.5f, 0.5f};
  CHECK(s.sample(all_equal, p, {}, {}, rng) == 0);

  p.repetition_penalty = 2.0f;
  Logits pen{1.0f, 3.0f, 2.9f};
  CHECK(s.sample(pen, p, {}, Ids{1}, rng) == 2);  // 3 / 2 = 1.5 < 2.9
  CHECK(rng.draws() == 0);

  // Greedy ignores top-k/top-p/min-p (they never remove the argmax).
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.top_k = 1;
  p.top_p = 0.1f;
  Logits t{0.0f, 1.0f};
  CHECK(s.sample(t, p, {}, {}, rng) == 1);
  CHECK(rng.draws() == 0);

  // Any sampled (non-greedy) call takes exactly one draw, even when top-k leaves one token.
  p.temperature = 1.0f;
  Logits u{0.0f, 1.0f};
  CHECK(s.sample(u, p, {}, {}, rng) == 1);
  CHECK(rng.draws() == 1);
}

TEST_CASE("min_tokens masks EOS and stop ids until enough tokens exist", "[sampler][min_tokens]") {
  Sampler s(/*eos_id=*/4);
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 2;
  p.stop_token_ids = {3};
  SeqRng rng(1);
  auto pick = [&](const Ids& output) {
    Logits l{0.0f, 1.0f, 2.0f, 9.0f, 10.0f};
    return s.sample(l, p, {}, output, rng);
  };
  CHECK(pick({}) == 2);
  CHECK(pick(Ids{2}) == 2);
  CHECK(pick(Ids{2, 2}) == 4);  // two generated: EOS allowed again

  p.ignore_eos = true;  // EOS does not stop, so it is not masked either; the stop id still is
  CHECK(pick({}) == 4);
  p.ignore_eos = false;
  p.min_tokens = 0;
  CHECK(pick({}) == 4);
}

TEST_CASE("logprobs are of the raw distribution", "[sampler][logprobs]") {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 1;
  p.repetition_penalty = 1.3f;
  p.logprobs = 2;
  SeqRng rng(3);
  Logits l = log_of({0.1, 0.2, 0.3, 0.4});
  for (float& v : l) v += 5.0f;  // a shift does not change log-softmax
  SampleResult r;
  s.sample(r, l, p, Ids{0}, {}, rng);
  CHECK(r.token == 3);
  CHECK(r.logprob == Approx(std::log(0.4)).margin(1e-5));
  REQUIRE(r.top_logprobs.size() == 2);
  CHECK(r.top_logprobs[0].first == 3);
  CHECK(r.top_logprobs[0].second == Approx(std::log(0.4)).margin(1e-5));
  CHECK(r.top_logprobs[1].first == 2);
  CHECK(r.top_logprobs[1].second == Approx(std::log(0.3)).margin(1e-5));

  // Ties rank the lower id first; logprobs = 0 gives only the sampled token's.
  Logits tie{1.0f, 2.0f, 2.0f, 2.0f};
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.logprobs = 2;
  s.sample(r, tie, p, {}, {}, rng);
  CHECK(r.token == 1);
  REQUIRE(r.top_logprobs.size() == 2);
  CHECK(r.top_logprobs[0].first == 1);
  CHECK(r.top_logprobs[1].first == 2);
  p.logprobs = 0;
  Logits tie2{1.0f, 2.0f, 2.0f, 2.0f};
  s.sample(r, tie2, p, {}, {}, rng);
  CHECK(r.top_logprobs.empty());
  CHECK(std::isfinite(r.logprob));

  // Asking for more than the vocabulary returns the whole vocabulary.
  p.logprobs = 20;
  Logits small{0.0f, 0.0f};
  s.sample(r, small, p, {}, {}, rng);
  REQUIRE(r.top_logprobs.size() == 2);
  CHECK(r.top_logprobs[0].second == Approx(std::log(0.5)));

  // Not requested: NaN, no list.
  p.logprobs.reset();
  Logits plain{0.0f, 1.0f};
  const SampleResult q = s.sample_with_logprobs(plain, p, {}, {}, rng);
  CHECK(q.token == 1);
  CHECK(std::isnan(q.logprob));
  CHECK(q.top_logprobs.empty());
}

TEST_CASE("seeded streams are reproducible and independent of other sequences", "[sampler][seed]") {
  Sampler s;
  SamplingParams p;
  p.seed = 42;
  p.top_k = 50;

  SeqRng a = SeqRng::for_sample(p, 0);
  const Ids alone = draw_tokens(s, p, a, 40);
  SeqRng again(42);
  CHECK(draw_tokens(s, p, again, 40) == alone);  // for_sample(p, 0) is SeqRng(seed)

  SeqRng other_seed(43);
  CHECK(draw_tokens(s, p, other_seed, 40) != alone);
  SeqRng second_sample = SeqRng::for_sample(p, 1);  // n > 1: sample 1 has its own stream
  CHECK(draw_tokens(s, p, second_sample, 40) != alone);

  // The same sequence sampled between others (seeded, unseeded, different params, same Sampler).
  SamplingParams q;
  q.temperature = 1.7f;
  q.top_p = 0.8f;
  q.repetition_penalty = 1.2f;
  SeqRng mine(42);
  SeqRng unseeded = SeqRng::for_sample(q, 0);
  SeqRng seeded_other(42, 1);
  Ids interleaved;
  const Ids prompt{1, 2, 3};
  for (int i = 0; i < 40; ++i) {
    for (int j = 0; j < i % 3; ++j) {
      Logits o = bumpy();
      (void)s.sample(o, q, prompt, interleaved, unseeded);
    }
    Logits o2 = bumpy();
    (void)s.sample(o2, p, {}, {}, seeded_other);
    Logits l = bumpy();
    interleaved.push_back(s.sample(l, p, {}, {}, mine));
  }
  CHECK(interleaved == alone);
}

TEST_CASE("unseeded streams differ from each other", "[sampler][seed]") {
  SeqRng a = SeqRng::from_entropy();
  SeqRng b = SeqRng::from_entropy();
  CHECK(a.next_u64() != b.next_u64());
  SeqRng c(5), d(5);
  CHECK(c.next_u64() == d.next_u64());
  for (int i = 0; i < 1000; ++i) {
    const double u = c.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
  }
  CHECK(c.draws() == 1001);
}

TEST_CASE("the categorical draw follows the distribution (chi-square)", "[sampler][draw]") {
  Sampler s;
  SamplingParams p;
  SeqRng rng(1234);
  const double probs[4] = {0.1, 0.2, 0.3, 0.4};
  constexpr int draws = 40000;
  int counts[4] = {0, 0, 0, 0};
  for (int i = 0; i < draws; ++i) {
    Logits l = log_of({0.1, 0.2, 0.3, 0.4});
    ++counts[s.sample(l, p, {}, {}, rng)];
  }
  double chi2 = 0;
  for (int k = 0; k < 4; ++k) {
    const double expected = probs[k] * draws;
    chi2 += (counts[k] - expected) * (counts[k] - expected) / expected;
    CHECK(std::abs(counts[k] / double(draws) - probs[k]) < 0.01);
  }
  INFO("counts " << counts[0] << " " << counts[1] << " " << counts[2] << " " << counts[3]);
  CHECK(chi2 < 16.27);  // 3 degrees of freedom, p = 0.001

  // Truncated: top-k 2 leaves ids 2 and 3 in the ratio 3 : 4, and never anything else.
  p.top_k = 2;
  int c2 = 0, c3 = 0;
  for (int i = 0; i < draws; ++i) {
    Logits l = log_of({0.1, 0.2, 0.3, 0.4});
    const auto t = s.sample(l, p, {}, {}, rng);
    REQUIRE((t == 2 || t == 3));
    (t == 2 ? c2 : c3)++;
  }
  CHECK(std::abs(c2 / double(draws) - 3.0 / 7.0) < 0.01);
  (void)c3;

  // Temperature 2 flattens: probabilities proportional to sqrt(p).
  p = SamplingParams{};
  p.temperature = 2.0f;
  int c0 = 0;
  for (int i = 0; i < draws; ++i) {
    Logits l = log_of({0.1, 0.2, 0.3, 0.4});
    if (s.sample(l, p, {}, {}, rng) == 0) ++c0;
  }
  const double z = std::sqrt(0.1) + std::sqrt(0.2) + std::sqrt(0.3) + std::sqrt(0.4);
  CHECK(std::abs(c0 / double(draws) - std::sqrt(0.1) / z) < 0.01);
}
