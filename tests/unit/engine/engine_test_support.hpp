#pragma once
/// Helpers shared by the engine tests: greedy runs, reference files, KV-accounting checks.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "infer/engine/presets.hpp"
#include "support/fixtures.hpp"

namespace infer::test {

using Tokens = std::vector<std::int32_t>;

inline nlohmann::json read_json(const std::string& fixture_path) {
  std::ifstream in(fixture(fixture_path));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

inline SamplingParams greedy_params(std::int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

/// Adds every prompt at once, runs to completion, returns each request's tokens in prompt order.
template <class E>
std::vector<Tokens> run_batch(E& engine, const std::vector<Tokens>& prompts, const SamplingParams& params) {
  for (const auto& p : prompts) engine.add_request(p, params);
  std::vector<Tokens> out;
  for (const auto& r : engine.run_to_completion()) out.push_back(r.outputs.at(0).token_ids);
  REQUIRE(out.size() == prompts.size());
  return out;
}

/// Every block is back in the pool and no sequence holds any.
template <class E>
void check_all_blocks_free(const E& engine) {
  const KvStats kv = engine.kv_stats();
  CHECK(kv.free_blocks == kv.total_blocks);
  CHECK(kv.used_blocks == 0);
  CHECK(kv.live_sequences == 0);
  CHECK(kv.tokens_stored == 0);
  CHECK_FALSE(engine.has_unfinished());
}

/// The first position where two token lists differ (their length when one is a prefix of the other).
inline std::size_t first_difference(const Tokens& a, const Tokens& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace infer::test
