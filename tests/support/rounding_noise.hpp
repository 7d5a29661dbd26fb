#pragma once
/// \file
/// The error bound of whole-model GPU logits, derived from bf16's unit roundoff by Monte Carlo arithmetic
/// over the CPU reference (support/bf16_stages.hpp), and the near-tie rule that follows from it.
///
/// `RoundingNoise` runs a sequence of decoder steps through the exact f32 CPU decoder and through
/// kNoiseRuns perturbed copies (each with its own KV cache, as the GPU's cache holds its own rounded
/// history). For logit j of a step, σ_j = rms over the runs of (perturbed_j − exact_j) estimates the standard
/// deviation of the error the GPU's bf16 rounding puts there. The bound for |gpu_j − cpu_j| is then
///
///   B_j = kSigmas · σ_j + 1e-6 · (1 + |cpu_j|)
///
/// Why kSigmas = 10 with kNoiseRuns = 24: the GPU's error at j is a sum of thousands of small rounding
/// errors (≈ normal, mean 0, sd σ_j); measured against σ_j estimated from 24 runs it follows Student's t
/// with 24 degrees of freedom, and P(|t_24| > 10) = 4.9e-10: over the ~10^6 logits a [cuda] run compares, a
/// correct GPU exceeds a bound with probability ~5e-4. The perturbation overestimates σ (bf16_stages.hpp),
/// which more than covers the few roundings the CPU seam cannot reach (the embedding rows: 1 of the ~8 per
/// layer times the layers). The 1e-6 term is the f32-level difference
/// (summation order, fast exp/rsqrt; ~2^-20 relative), which σ dwarfs. Checked on the CPU, where bf16
/// rounding can be reproduced exactly (tests/unit/model/test_rounding_noise.cpp): the rounded decoder's
/// worst |Δ| is 2.6-3.6 σ over ~10^4 logits, as the largest of that many normal draws would be.
///
/// The near-tie rule from the same bound: the GPU may pick token b where the CPU picked a only if
/// cpu_a − cpu_b ≤ B_a + B_b (both logits may have moved by their bound, towards each other).
/// `replay_greedy` applies both to an engine's greedy outputs, step by step.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "infer/attention/paged_attention.hpp"
#include "infer/core/error.hpp"
#include "infer/engine/request_output.hpp"
#include "infer/model/llama.hpp"
#include "support/bf16_stages.hpp"

namespace infer::test {

inline constexpr int kNoiseRuns = 24;
inline constexpr double kSigmas = 10.0;

/// B_j for a logit with reference value `cpu` and noise estimate `sigma`.
inline double noise_bound(double cpu, double sigma) { return kSigmas * sigma + 1e-6 * (1.0 + std::fabs(cpu)); }

/// Checks every logit of `gpu` ([rows][vocab]) against `cpu` within noise_bound of its σ, failing (the first five
/// named by row and logit) for each outside; returns the largest |gpu − cpu| / σ among those within.
inline double check_within_noise(std::span<const float> gpu, std::span<const float> cpu, std::span<const double> sigma,
                                 std::size_t vocab) {
  REQUIRE(gpu.size() == cpu.size());
  double worst = 0;
  std::size_t bad = 0;
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    const double d = std::fabs(static_cast<double>(gpu[j]) - cpu[j]), bound = noise_bound(cpu[j], sigma[j]);
    if (d <= bound) worst = std::max(worst, d / sigma[j]);
    else if (++bad <= 5)
      FAIL_CHECK("row " << j / vocab << ", logit " << j % vocab << ": gpu " << gpu[j] << ", cpu " << cpu[j] << ", σ "
                        << sigma[j] << " (bound " << bound << ")");
  }
  return worst;
}

class RoundingNoise {
 public:
  using Model = LlamaModel<cpu, Bf16Stages, PagedAttention<>>;

  /// Room for `blocks` blocks of `block_size` per run (the exact one and each perturbed one); `seed`
  /// seeds the perturbations, so an estimate is reproducible.
  RoundingNoise(const ModelSource& src, std::int32_t blocks, std::int32_t block_size, std::uint64_t seed)
      : model_(Model::load(src)), blocks_(blocks), block_size_(block_size), seed_(seed),
        exact_cache_(cache(1)), runs_cache_(cache(kNoiseRuns)) {}

  [[nodiscard]] const ModelConfig& config() const noexcept { return model_.config(); }

  /// Runs one step through the exact decoder (its logits: exact()) and every perturbed run; returns σ
  /// per logit, [sampled rows][vocab] as forward() lays them out. The perturbed runs go through the
  /// decoder as one batch (run r's chunks on its own blocks, r·blocks onwards), so each weight is read
  /// once per step for all of them, and every row draws its own perturbations.
  const std::vector<double>& step(std::span<const ForwardChunk> chunks) {
    {
      Bf16Stages::Scope exact(Bf16Stages::Mode::exact);
      model_.forward(chunks, exact_cache_, exact_);
    }
    tables_.resize(static_cast<std::size_t>(kNoiseRuns) * chunks.size());
    runs_.clear();
    for (int r = 0; r < kNoiseRuns; ++r)
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        std::vector<std::int32_t>& t = tables_[static_cast<std::size_t>(r) * chunks.size() + c];
        t.assign(chunks[c].block_table.begin(), chunks[c].block_table.end());
        for (auto& b : t) b += r * blocks_;
        runs_.push_back(ForwardChunk{chunks[c].tokens, chunks[c].start, t, chunks[c].samples});
      }
    {
      Bf16Stages::Scope noisy(Bf16Stages::Mode::perturb, seed_ ^ (++steps_ * 0x9E3779B97F4A7C15ull));
      model_.forward(runs_, runs_cache_, run_);
    }
    const std::size_t n = exact_.size();
    sigma_.assign(n, 0.0);
    for (int r = 0; r < kNoiseRuns; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        const double d = static_cast<double>(run_[static_cast<std::size_t>(r) * n + j]) - exact_[j];
        sigma_[j] += d * d;
      }
    for (double& s : sigma_) s = std::sqrt(s / kNoiseRuns);
    return sigma_;
  }

  /// The exact (f32, no rounding) logits of the last step.
  [[nodiscard]] const std::vector<float>& exact() const noexcept { return exact_; }

 private:
  KvCache<cpu> cache(int runs) const {
    const ModelConfig& c = model_.config();
    KvCache<cpu> k(static_cast<std::int32_t>(c.num_layers), runs * blocks_, block_size_, static_cast<std::int32_t>(c.num_kv_heads),
                   static_cast<std::int32_t>(c.head_dim));
    k.poison();
    return k;
  }

  Model model_;
  std::int32_t blocks_;
  std::int32_t block_size_;
  std::uint64_t seed_;
  std::uint64_t steps_ = 0;
  KvCache<cpu> exact_cache_, runs_cache_;
  std::vector<std::vector<std::int32_t>> tables_;
  std::vector<ForwardChunk> runs_;
  std::vector<float> exact_, run_;
  std::vector<double> sigma_;
};

}  // namespace infer::test

namespace infer::test {

/// What an engine under test generated for one greedy request: its prompt, its tokens and, when it asked
/// for logprobs, each step's entry (the chosen token's logprob and the top alternatives).
struct GreedyOutput {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
};

/// The result of checking greedy outputs step by step against the CPU reference.
struct ReplayReport {
  std::size_t steps = 0;             ///< generated tokens checked
  std::size_t reference_ties = 0;    ///< steps whose top two reference logits lie within B_1 + B_2
  std::size_t ties_taken = 0;        ///< steps where the output chose another token of such a tie
  std::size_t logprobs_checked = 0;  ///< logprob values compared
  double worst_logprob = 0;          ///< largest |Δlogprob| / its bound
  std::size_t reused = 0;            ///< requests whose reference steps an earlier replay computed (ReferenceMemo)
  std::vector<std::string> failures;  ///< the first few violations, readable

  [[nodiscard]] bool ok() const { return failures.empty(); }
  [[nodiscard]] std::string summary() const {
    return detail::cat(steps, " tokens checked, ", reference_ties, " at reference near-ties (", ties_taken,
                       " took the other token), ", logprobs_checked, " logprobs within bound (worst at ",
                       worst_logprob, " of it)", reused > 0 ? detail::cat("; ", reused, " requests' reference reused") : "");
  }
};

/// The CPU reference's view of one request, teacher-forced on its own tokens: at step s (the prompt, then
/// tokens[s - 1]) the exact logits z[s] and RoundingNoise's σ[s] (as float: a bound needs no more).
struct ReferenceSteps {
  std::vector<std::int32_t> prompt, tokens;  ///< what was fed: step s follows prompt + tokens[0..s)
  std::vector<std::vector<float>> z, sigma;  ///< [steps][vocab]

  /// Whether steps [0, n) of `prompt` followed by `fed` are here (fed[0..n-1) are what those steps read).
  [[nodiscard]] bool covers(std::span<const std::int32_t> p, std::span<const std::int32_t> fed, std::size_t n) const {
    return n <= z.size() && std::ranges::equal(p, prompt) && n >= 1 &&
           std::equal(fed.begin(), fed.begin() + static_cast<std::ptrdiff_t>(n - 1), tokens.begin());
  }
};

/// Reference steps already computed in this process, for models read from a file (the key is its path; a
/// dummy model's label does not name its weights). The [cuda] engine tests replay the same nine SmolLM2
/// prompts on the paged engine, the static engine and through infer::LLM; where an engine generated the
/// same tokens as an earlier one, its steps are the same teacher-forced computation, so they are computed
/// once (the σ then comes from the first replay's seed: an estimate as good as any other seed's). This
/// was three quarters of the [cuda] suite's time on the H200 machine.
class ReferenceMemo {
 public:
  using Steps = std::shared_ptr<const ReferenceSteps>;
  static ReferenceMemo& instance() {
    static ReferenceMemo memo;
    return memo;
  }
  [[nodiscard]] Steps find(const std::string& model, std::span<const std::int32_t> prompt,
                           std::span<const std::int32_t> tokens) const {
    for (const auto& [m, r] : entries_)
      if (m == model && r->covers(prompt, tokens, tokens.size())) {
        ++hits_;
        return r;
      }
    return nullptr;
  }
  /// Requests served from the memo so far (the [cuda] logs print it; a test checks a hit happens).
  [[nodiscard]] std::size_t hits() const noexcept { return hits_; }
  /// Keeps `r` for later replays, unless that would take the memo past kMaxBytes.
  void keep(const std::string& model, Steps r) {
    const std::size_t size = r->z.empty() ? 0 : 2 * r->z.size() * r->z.front().size() * sizeof(float);
    if (bytes_ + size > kMaxBytes) return;
    bytes_ += size;
    entries_.emplace_back(model, std::move(r));
  }

 private:
  static constexpr std::size_t kMaxBytes = std::size_t{4} << 30;
  std::size_t bytes_ = 0;
  mutable std::size_t hits_ = 0;
  std::vector<std::pair<std::string, Steps>> entries_;
};

/// Runs `outputs` (every request not already in the memo) through the CPU reference, teacher-forced: each
/// request's prompt, then its own generated tokens one step at a time, all requests batched into one step
/// sequence, with RoundingNoise's σ per logit. Returns each output's steps.
inline std::vector<ReferenceMemo::Steps> reference_steps(const ModelSource& src, const std::vector<GreedyOutput>& outputs,
                                                         std::uint64_t seed) {
  const std::string model = src.path().empty() ? std::string() : src.path().string();
  std::vector<ReferenceMemo::Steps> found(outputs.size());
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!model.empty()) found[i] = ReferenceMemo::instance().find(model, outputs[i].prompt, outputs[i].tokens);
    if (found[i] == nullptr && !outputs[i].tokens.empty()) todo.push_back(i);
  }
  if (todo.empty()) return found;
  constexpr std::int32_t bs = 16;
  const auto V = static_cast<std::size_t>(src.config().vocab_size);
  std::vector<ReferenceSteps> computed(todo.size());
  std::vector<std::vector<std::int32_t>> tables(todo.size());
  std::int32_t blocks = 0;
  for (std::size_t k = 0; k < todo.size(); ++k) {
    const GreedyOutput& o = outputs[todo[k]];
    computed[k].prompt = o.prompt;
    computed[k].tokens = o.tokens;
    const auto len = static_cast<std::int32_t>(o.prompt.size() + o.tokens.size());
    for (std::int32_t b = 0; b < (len + bs - 1) / bs; ++b) tables[k].push_back(blocks++);
  }
  RoundingNoise noise(src, std::max(blocks, 1), bs, seed);
  std::vector<std::int32_t> one(todo.size());
  for (std::size_t s = 0;; ++s) {
    std::vector<ForwardChunk> chunks;
    std::vector<std::size_t> who;
    for (std::size_t k = 0; k < todo.size(); ++k) {
      const GreedyOutput& o = outputs[todo[k]];
      if (o.tokens.size() <= s) continue;
      if (s == 0) {
        chunks.push_back(ForwardChunk{o.prompt, 0, tables[k], true});
      } else {
        one[k] = o.tokens[s - 1];
        chunks.push_back(ForwardChunk{std::span(&one[k], 1), static_cast<std::int32_t>(o.prompt.size() + s - 1),
                                      tables[k], true});
      }
      who.push_back(k);
    }
    if (chunks.empty()) break;
    const std::vector<double>& sigma = noise.step(chunks);
    const std::vector<float>& z = noise.exact();
    for (std::size_t r = 0; r < who.size(); ++r) {
      ReferenceSteps& c = computed[who[r]];
      c.z.emplace_back(z.begin() + static_cast<std::ptrdiff_t>(r * V), z.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
      c.sigma.emplace_back(sigma.begin() + static_cast<std::ptrdiff_t>(r * V),
                           sigma.begin() + static_cast<std::ptrdiff_t>((r + 1) * V));
    }
  }
  for (std::size_t k = 0; k < todo.size(); ++k) {
    found[todo[k]] = std::make_shared<const ReferenceSteps>(std::move(computed[k]));
    if (!model.empty()) ReferenceMemo::instance().keep(model, found[todo[k]]);
  }
  return found;
}

/// Replays greedy outputs through the CPU reference (reference_steps) and checks them step by step. At
/// every step the output's token must be the reference's argmax, or tie with it under the bound
/// (z_argmax − z_token ≤ B_argmax + B_token); every logprob the output reports must equal the reference's
/// within B_token + max_k B_k (a logprob is z − logsumexp(z), and logsumexp moves by at most the largest
/// shift of any logit). Because the reference follows the output's own tokens, a divergence at a near-tie
/// does not end the comparison: every generated token is checked.
inline ReplayReport replay_greedy(const ModelSource& src, const std::vector<GreedyOutput>& outputs,
                                  std::uint64_t seed) {
  ReplayReport rep;
  const auto V = static_cast<std::size_t>(src.config().vocab_size);
  const std::size_t hits = ReferenceMemo::instance().hits();
  const std::vector<ReferenceMemo::Steps> reference = reference_steps(src, outputs, seed);
  rep.reused = ReferenceMemo::instance().hits() - hits;
  auto fail = [&](std::string message) {
    if (rep.failures.size() < 8) rep.failures.push_back(std::move(message));
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const GreedyOutput& o = outputs[i];
    for (std::size_t s = 0; s < o.tokens.size(); ++s) {
      const float* zr = reference[i]->z[s].data();
      const float* sr = reference[i]->sigma[s].data();
      const auto bound = [&](std::size_t j) { return noise_bound(zr[j], sr[j]); };
      std::size_t a = 0, second = V;
      for (std::size_t j = 1; j < V; ++j)
        if (zr[j] > zr[a]) a = j;
      for (std::size_t j = 0; j < V; ++j)
        if (j != a && (second == V || zr[j] > zr[second])) second = j;
      const bool tie = second < V && static_cast<double>(zr[a]) - zr[second] <= bound(a) + bound(second);
      rep.reference_ties += tie;
      ++rep.steps;
      const auto g = static_cast<std::size_t>(o.tokens[s]);
      const std::string where = detail::cat("request ", i, ", token ", s);
      if (g >= V) {
        fail(detail::cat(where, ": token id ", g, " is outside the vocabulary"));
        continue;
      }
      if (g != a) {
        const double margin = static_cast<double>(zr[a]) - zr[g], allowed = bound(a) + bound(g);
        if (margin <= allowed) {
          ++rep.ties_taken;
        } else {
          fail(detail::cat(where, ": chose ", g, " (reference logit ", zr[g], ") where the reference chose ", a, " (",
                           zr[a], "): margin ", margin, " is beyond the bound ", allowed));
        }
      }
      if (o.logprobs.size() <= s) continue;
      double mx = zr[0], sum = 0, max_bound = 0;
      for (std::size_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(zr[j]));
      for (std::size_t j = 0; j < V; ++j) {
        sum += std::exp(static_cast<double>(zr[j]) - mx);
        max_bound = std::max(max_bound, bound(j));
      }
      const double lse = mx + std::log(sum);
      auto check_logprob = [&](std::int32_t id, float got, const char* what) {
        if (id < 0 || static_cast<std::size_t>(id) >= V) {
          fail(detail::cat(where, ": ", what, " names token ", id, ", outside the vocabulary"));
          return;
        }
        const auto j = static_cast<std::size_t>(id);
        const double want = zr[j] - lse, allowed = bound(j) + max_bound, err = std::fabs(static_cast<double>(got) - want);
        ++rep.logprobs_checked;
        if (err <= allowed) rep.worst_logprob = std::max(rep.worst_logprob, err / allowed);
        else fail(detail::cat(where, ": ", what, " of token ", id, " is ", got, ", the reference's ", want, " ± ", allowed));
      };
      const TokenLogprob& lp = o.logprobs[s];
      if (lp.token != o.tokens[s]) fail(detail::cat(where, ": the logprob entry names token ", lp.token));
      check_logprob(lp.token, lp.logprob, "the logprob");
      for (const auto& [id, v] : lp.top) check_logprob(id, v, "a top logprob");
    }
  }
  return rep;
}

}  // namespace infer::test
