#pragma once
/// Greedy workloads run through an engine and checked step by step against the CPU reference
/// (rounding_noise.hpp's replay_greedy): what the [cuda] engine tests of both engines share.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "support/rounding_noise.hpp"
#include "support/test_seed.hpp"
#include "unit/engine/engine_test_support.hpp"

namespace infer::test {

inline Tokens random_tokens(std::size_t n, std::int64_t vocab, std::mt19937& rng) {
  Tokens t(n);
  for (auto& v : t) v = std::uniform_int_distribution<std::int32_t>(2, static_cast<std::int32_t>(vocab - 1))(rng);
  return t;
}

/// Greedy parameters of request i: plain (the device argmax), the sampled token's logprob (the device
/// sampler) or the top 5 (logits to the host) — the three ways a greedy token is chosen.
inline SamplingParams greedy_kind(std::size_t i, std::int32_t max_tokens) {
  SamplingParams p = greedy_params(max_tokens);
  if (i % 3 == 1) p.logprobs = 0;
  if (i % 3 == 2) p.logprobs = 5;
  return p;
}

struct Workload {
  std::vector<Tokens> prompts;
  std::vector<std::int32_t> max_tokens;
};

/// `n` requests: prompts of 1..`max_prompt` random tokens, 1..`max_new` new tokens each.
inline Workload mixed_workload(std::size_t n, std::int64_t vocab, std::mt19937& rng, std::size_t max_prompt = 90,
                               std::int32_t max_new = 40) {
  Workload w;
  for (std::size_t i = 0; i < n; ++i) {
    w.prompts.push_back(random_tokens(std::uniform_int_distribution<std::size_t>(1, max_prompt)(rng), vocab, rng));
    w.max_tokens.push_back(std::uniform_int_distribution<std::int32_t>(1, max_new)(rng));
  }
  return w;
}

/// Adds every request of `w` (parameters by greedy_kind), runs to completion, returns the outputs in order.
template <class E>
std::vector<GreedyOutput> run_together(E& engine, const Workload& w) {
  for (std::size_t i = 0; i < w.prompts.size(); ++i) engine.add_request(w.prompts[i], greedy_kind(i, w.max_tokens[i]));
  const auto done = engine.run_to_completion();
  REQUIRE(done.size() == w.prompts.size());
  std::vector<GreedyOutput> out;
  for (std::size_t i = 0; i < done.size(); ++i)
    out.push_back({w.prompts[i], done[i].outputs.at(0).token_ids, done[i].outputs.at(0).logprobs});
  return out;
}

/// Every output checked step by step against the CPU reference (replay_greedy); prints the summary.
inline void check_replay(const ModelSource& src, const std::vector<GreedyOutput>& outputs, const char* what) {
  const ReplayReport r = replay_greedy(src, outputs, test_seed(detail::cat("replay ", what)));
  std::printf("  %s: %s\n", what, r.summary().c_str());
  for (const auto& f : r.failures) UNSCOPED_INFO(f);
  CHECK(r.ok());
  for (const auto& o : outputs) CHECK(o.tokens.size() > 0);
}

/// How far two runs of one workload are apart where they are comparable: requests identical in full, and
/// the largest difference of the chosen token's logprob over the steps before their first divergence.
inline std::string spread(const std::vector<GreedyOutput>& a, const std::vector<GreedyOutput>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t same = 0;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::size_t d = first_difference(a[i].tokens, b[i].tokens);
    same += d == a[i].tokens.size() && d == b[i].tokens.size();
    for (std::size_t s = 0; s < d && s < a[i].logprobs.size() && s < b[i].logprobs.size(); ++s)
      worst = std::max(worst, static_cast<double>(std::fabs(a[i].logprobs[s].logprob - b[i].logprobs[s].logprob)));
  }
  return detail::cat(same, " of ", a.size(), " requests identical; chosen-token logprobs differ by up to ", worst,
                     " before a divergence");
}

}  // namespace infer::test
