#pragma once
/// \file
/// Choosing the next token: `SeqRng` (one random stream per sequence) and `Sampler` (logits processing
/// and then argmax or a categorical draw).
///
/// Reproducibility: a seeded request draws from its own stream, and every non-greedy sample takes
/// exactly one draw from it (greedy takes none), so its tokens depend only on (seed, sample index, its
/// own logits) — not on which other sequences share the batch, in which order they are sampled, or
/// whether they are seeded. The generator is SplitMix64 and the uniform is built from its top 53 bits,
/// both fully specified here, so a seed gives the same stream with every standard library (the
/// `std::*_distribution` classes are implementation-defined and would not).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sampling/logits_processor.hpp"
#include "infer/sampling/sampling_params.hpp"

namespace infer {

namespace detail {
/// SplitMix64's output function: a bijective 64-bit mixer, also used to derive seeds.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline constexpr std::uint64_t golden_gamma = 0x9E3779B97F4A7C15ull;

/// Seeds for unseeded sequences: a process-wide counter started once from std::random_device and
/// stepped atomically, so concurrent callers never share a stream and the device is read only once.
inline std::uint64_t fresh_seed() {
  static std::atomic<std::uint64_t> counter{[] {
    std::uint64_t s = 0;
    try {
      std::random_device rd;
      s = (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
    } catch (const std::exception&) {
      // No entropy device (some sandboxes): the clock still makes processes differ.
    }
    return s ^ static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }()};
  return mix64(counter.fetch_add(golden_gamma, std::memory_order_relaxed));
}
}  // namespace detail

/// One sequence's random stream. Cheap to copy (8 bytes of state plus a draw count).
class SeqRng {
 public:
  /// The stream for (`seed`, `stream`); sample i of an n > 1 request uses stream i.
  explicit SeqRng(std::uint64_t seed, std::uint64_t stream = 0) noexcept
      : state_(detail::mix64(detail::mix64(seed) ^ detail::mix64((stream + 1) * 0xD1B54A32D192ED03ull))) {}

  /// A stream nobody else gets (seeded from the process-wide entropy counter).
  [[nodiscard]] static SeqRng from_entropy() { return SeqRng(detail::fresh_seed(), 0); }

  /// The stream for sample `sample_index` of a request: derived from (seed, index) when seeded, fresh
  /// entropy otherwise.
  [[nodiscard]] static SeqRng for_sample(const SamplingParams& params, std::uint32_t sample_index) {
    return params.seed ? SeqRng(*params.seed, sample_index) : from_entropy();
  }

  std::uint64_t next_u64() noexcept {
    ++draws_;
    state_ += detail::golden_gamma;
    return detail::mix64(state_);
  }

  /// Uniform in [0, 1), with 53 random bits.
  double uniform() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// How many values have been drawn (tests use it to check greedy draws nothing).
  [[nodiscard]] std::uint64_t draws() const noexcept { return draws_; }

 private:
  std::uint64_t state_;
  std::uint64_t draws_ = 0;
};

/// The sampled token and, when `SamplingParams::logprobs` is set, log-probabilities.
///
/// Logprobs are of the model's raw distribution — log-softmax of the logits as they came in, before
/// penalties, temperature and truncation — which is what vLLM returns by default and what the OpenAI
/// API describes. (Processed logprobs would be -inf for tokens top-k removed and would change with
/// temperature, which makes them useless for scoring.)
struct SampleResult {
  std::int32_t token = -1;
  float logprob = std::numeric_limits<float>::quiet_NaN();  ///< of `token`; NaN when not requested
  /// The `logprobs` most likely tokens, most likely first (ties: lower id first); may include `token`.
  std::vector<std::pair<std::int32_t, float>> top_logprobs;
};

/// Samples one token per call for one sequence at a time. Holds scratch buffers (reused, so no
/// allocation per token after the first call), so use one Sampler per thread. Parameters are trusted:
/// validate them once per request (`SamplingParams::validate`), not per token.
class Sampler {
 public:
  /// `eos_id` is masked while fewer than `min_tokens` tokens have been generated (unless ignore_eos).
  explicit Sampler(std::optional<std::int32_t> eos_id = std::nullopt) : eos_id_(eos_id) {}

  /// Processes `logits` in place (they are overwritten) and returns the chosen token: the argmax, lowest
  /// id on ties, when greedy (penalties still apply; no draw is taken); otherwise one draw from the
  /// processed distribution.
  std::int32_t sample(std::span<float> logits, const SamplingParams& params, std::span<const std::int32_t> prompt,
                      std::span<const std::int32_t> output, SeqRng& rng) {
    processor_.apply(logits, params, prompt, output, eos_id_);
    return params.greedy() ? argmax(logits) : draw(logits, rng);
  }

  /// As above, filling `out` (whose vector keeps its capacity between calls) with the token and, when
  /// `params.logprobs` is set, its raw logprob and the top `*params.logprobs` raw logprobs.
  void sample(SampleResult& out, std::span<float> logits, const SamplingParams& params,
              std::span<const std::int32_t> prompt, std::span<const std::int32_t> output, SeqRng& rng) {
    out.top_logprobs.clear();
    out.logprob = std::numeric_limits<float>::quiet_NaN();
    if (!params.logprobs) {
      out.token = sample(logits, params, prompt, output, rng);
      return;
    }
    // Keep the raw logits: processing overwrites them, and the sampled token is not known yet.
    const float mx = detail::checked_max(logits, "Sampler");
    raw_.assign(logits.begin(), logits.end());
    double sum = 0.0;
    for (float l : raw_) sum += std::exp(static_cast<double>(l) - mx);
    const double lse = static_cast<double>(mx) + std::log(sum);
    top_raw(raw_, static_cast<std::size_t>(std::max(*params.logprobs, 0)), out.top_logprobs);
    for (auto& [id, v] : out.top_logprobs) v = static_cast<float>(static_cast<double>(v) - lse);
    out.token = sample(logits, params, prompt, output, rng);
    out.logprob = static_cast<float>(static_cast<double>(raw_[static_cast<std::size_t>(out.token)]) - lse);
  }

  /// Convenience: returns a fresh SampleResult (allocates; prefer the out-parameter form in a loop).
  SampleResult sample_with_logprobs(std::span<float> logits, const SamplingParams& params,
                                    std::span<const std::int32_t> prompt, std::span<const std::int32_t> output,
                                    SeqRng& rng) {
    SampleResult r;
    sample(r, logits, params, prompt, output, rng);
    return r;
  }

  [[nodiscard]] LogitsProcessor& processor() noexcept { return processor_; }

  /// The first index of the largest value.
  [[nodiscard]] static std::int32_t argmax(std::span<const float> logits) {
    if (logits.empty()) throw InvalidArgument("Sampler::argmax: logits are empty; pass the vocabulary's logits");
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return static_cast<std::int32_t>(best);
  }

 private:
  /// Inverse-CDF draw over exp(l - max): one uniform, one pass to weigh, one to find the token. The sum
  /// is in double so 150k small weights do not lose the tail; the fallback covers u·sum rounding past
  /// the last weight.
  std::int32_t draw(std::span<const float> logits, SeqRng& rng) {
    const float mx = detail::checked_max(logits, "Sampler");
    weights_.resize(logits.size());
    double total = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      const float w = logits[i] == detail::neg_inf ? 0.0f : std::exp(logits[i] - mx);
      weights_[i] = w;
      total += w;
    }
    const double target = rng.uniform() * total;
    double cum = 0.0;
    std::size_t last_positive = 0;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      if (weights_[i] <= 0.0f) continue;
      cum += weights_[i];
      last_positive = i;
      if (cum > target) return static_cast<std::int32_t>(i);
    }
    return static_cast<std::int32_t>(last_positive);
  }

  /// The `k` largest raw logits as (id, logit), largest first, ties to the lower id: a min-heap of k
  /// entries over one pass, so no vocabulary-sized index array is needed.
  static void top_raw(std::span<const float> raw, std::size_t k, std::vector<std::pair<std::int32_t, float>>& out) {
    out.clear();
    k = std::min(k, raw.size());
    if (k == 0) return;
    // "a ranks above b": larger value, or equal value and lower id.
    auto above = [](const std::pair<std::int32_t, float>& a, const std::pair<std::int32_t, float>& b) {
      return a.second > b.second || (a.second == b.second && a.first < b.first);
    };
    for (std::size_t i = 0; i < raw.size(); ++i) {
      const std::pair<std::int32_t, float> c{static_cast<std::int32_t>(i), raw[i]};
      if (out.size() < k) {
        out.push_back(c);
        std::push_heap(out.begin(), out.end(), above);  // heap front = the lowest-ranked kept entry
      } else if (above(c, out.front())) {
        std::pop_heap(out.begin(), out.end(), above);
        out.back() = c;
        std::push_heap(out.begin(), out.end(), above);
      }
    }
    std::sort(out.begin(), out.end(), above);
  }

  std::optional<std::int32_t> eos_id_;
  LogitsProcessor processor_;
  std::vector<float> raw_;
  std::vector<float> weights_;
};

}  // namespace infer
