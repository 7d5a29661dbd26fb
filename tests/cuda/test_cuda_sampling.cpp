// GPU sampling (kernels/cuda/sampling.hpp) against the CPU Sampler, the oracle: the same logits, the
// same parameters and the same uniform u (drawn on the host from a copy of the same SeqRng), so the
// two must choose the same token. Random logits from printed seeds (support/test_seed.hpp), outputs poisoned
// (ids 0xABABABAB, logprobs NaN) and the workspace poisoned with NaN before every call.
//
// Exactness. Greedy rows, penalties, temperature and top-k are computed with the CPU's f32 operations
// in the CPU's order, so greedy tokens must match on every row. A draw may differ only where the CPU's
// choice is within rounding of a boundary:
// - the CDF: each GPU weight is exp(l - max) correctly rounded to f32, glibc's expf is within 0.502
//   ulp, so a weight differs by at most one ulp (<= 2^-23 relative); prefix sums therefore differ by
//   <= 2^-23 of the total, the target u * total by as much again, and double summation order adds
//   ~vocab * 2^-53 (1.7e-11 at 152k). A mismatch is accepted as a boundary case only when u * total
//   lies within 2^-21 * total (twice that bound) of the GPU token's CDF interval.
// - top-p / min-p: the GPU's top-p masses are fixed-point (within ~1e-9 of the total) and its min-p
//   log threshold is within an ulp; a mismatch on a token the CPU removed is accepted only when the
//   row has a top-p group boundary within 1e-9 of the target mass or a value within 1e-9 of the min-p
//   threshold.
// Accepted boundary cases are counted and printed; they must stay under 1% of the drawn rows (they
// are expected at ~1e-5). Anything else fails.
//
// The CPU's frequency penalty `l -= freq * count + pres` can be contracted into an FMA by the host
// compiler on some targets; the tests use frequency penalties that are multiples of 1/4, for which the
// product is exact and the CPU result is the same either way.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/cuda_test_support.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/sampling.hpp"
#include "infer/sampling/logits_processor.hpp"
#include "infer/sampling/sampler.hpp"
#include "infer/sampling/sampling_params.hpp"

using namespace infer;
using namespace infer::test;
namespace kc = infer::kernels::cuda;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::uint32_t kIdPoison = 0xABABABABu;

using Ids = std::vector<std::int32_t>;

/// One row's request state, as the engine would hold it.
struct RowSpec {
  SamplingParams params;
  Ids prompt, output;
};

// ------------------------------------------------------------------------------------------------
// Random logits

/// Logit rows of several shapes: continuous normals (various widths), coarse values with many exact
/// ties (k-th-largest and top-p groups of equal values), LLM-like peaked rows; with probability 1/2
/// the maximum is planted at 2-4 random positions with exactly the same value (argmax ties).
std::vector<float> random_row(int vocab, std::mt19937& rng) {
  std::vector<float> row(static_cast<std::size_t>(vocab));
  const int kind = static_cast<int>(rng() % 4);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  const float sigma = std::array<float, 4>{0.5f, 1.0f, 2.0f, 4.0f}[rng() % 4];
  for (auto& x : row) {
    switch (kind) {
      case 0: x = sigma * n01(rng); break;
      case 1: x = std::round(2.0f * n01(rng) * 4.0f) / 4.0f; break;  // multiples of 1/4: ties everywhere
      case 2: x = 3.0f * n01(rng) - 2.0f; break;
      default: x = std::round(sigma * n01(rng) * 2.0f) / 2.0f; break;
    }
  }
  if (kind == 2) {  // a few dominant tokens, as real LM heads give
    for (int j = 0; j < 6 && j < vocab; ++j) row[rng() % row.size()] = 8.0f + 4.0f * n01(rng);
  }
  if (rng() % 2 == 0) {
    const float mx = *std::max_element(row.begin(), row.end()) + 0.5f;
    const int copies = 2 + static_cast<int>(rng() % 3);
    for (int j = 0; j < copies; ++j) row[rng() % row.size()] = mx;
  }
  return row;
}

/// Ids of the `n` largest values of `row` (the ones penalties and bans should hit to matter).
Ids top_ids(const std::vector<float>& row, int n) {
  Ids idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  n = std::min<int>(n, static_cast<int>(row.size()));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int a, int b) { return row[a] > row[b]; });
  idx.resize(static_cast<std::size_t>(n));
  return idx;
}

/// A random sampling configuration of family `family` (0..7, see the switch), with prompt/output ids
/// drawn partly from the row's top tokens so that penalties and bans change the outcome.
RowSpec random_spec(int family, const std::vector<float>& row, std::optional<std::int32_t> eos, std::mt19937& rng) {
  RowSpec s;
  SamplingParams& p = s.params;
  const int vocab = static_cast<int>(row.size());
  auto pick = [&](auto const& options) { return options[rng() % options.size()]; };
  const std::vector<float> temps = {0.3f, 0.7f, 1.0f, 1.3f, 2.0f};
  const std::vector<std::int32_t> ks = {1, 2, 5, 40, 1000, vocab - 1, vocab, vocab + 5};
  const std::vector<float> ps = {0.05f, 0.3f, 0.5f, 0.8f, 0.9f, 0.95f, 0.999f};
  const std::vector<float> minps = {0.001f, 0.01f, 0.05f, 0.2f, 0.6f};
  auto add_penalties = [&] {
    p.repetition_penalty = pick(std::vector<float>{1.0f, 0.8f, 1.2f, 1.5f, 2.0f});
    p.frequency_penalty = pick(std::vector<float>{0.0f, 0.25f, 0.5f, -0.5f, 1.0f, 1.75f});  // exact products
    p.presence_penalty = pick(std::vector<float>{0.0f, 0.3f, -0.2f, 1.1f});
    const Ids top = top_ids(row, 8);
    const int np = static_cast<int>(rng() % 40), no = static_cast<int>(rng() % 30);
    for (int i = 0; i < np; ++i)
      s.prompt.push_back(rng() % 3 == 0 ? top[rng() % top.size()] : static_cast<std::int32_t>(rng() % vocab));
    for (int i = 0; i < no; ++i)
      s.output.push_back(rng() % 2 == 0 ? top[rng() % top.size()] : static_cast<std::int32_t>(rng() % vocab));
  };
  switch (family) {
    case 0:  // greedy, sometimes with penalties
      p.temperature = rng() % 2 ? 0.0f : 5e-6f;
      if (rng() % 2) add_penalties();
      break;
    case 1: p.temperature = pick(temps); break;
    case 2:
      p.temperature = pick(temps);
      p.top_k = pick(ks);
      break;
    case 3:
      p.temperature = pick(temps);
      p.top_p = pick(ps);
      break;
    case 4:
      p.temperature = pick(temps);
      p.min_p = pick(minps);
      break;
    case 5:  // everything at once
      p.temperature = pick(temps);
      p.top_k = pick(ks);
      p.top_p = pick(ps);
      p.min_p = rng() % 2 ? pick(minps) : 0.0f;
      add_penalties();
      break;
    case 6:  // penalties with a draw
      p.temperature = pick(temps);
      if (rng() % 2) p.top_k = pick(ks);
      add_penalties();
      break;
    default: {  // min_tokens: EOS and stop ids (some of them the top tokens) are banned
      p.temperature = rng() % 3 == 0 ? 0.0f : pick(temps);
      p.min_tokens = 1 + static_cast<int>(rng() % 4);
      p.max_tokens = 16;
      const Ids top = top_ids(row, 4);
      p.stop_token_ids = {top[rng() % top.size()], static_cast<std::int32_t>(rng() % vocab)};
      p.ignore_eos = rng() % 4 == 0;
      for (int i = 0, n = static_cast<int>(rng() % (p.min_tokens + 2)); i < n; ++i)
        s.output.push_back(static_cast<std::int32_t>(rng() % vocab));
      if (rng() % 2) add_penalties();
      break;
    }
  }
  (void)eos;
  return s;
}

// ------------------------------------------------------------------------------------------------
// The CPU oracle and the boundary analysis

struct Choice {
  std::int32_t token = -1;
  float logprob = kNaN;
};

/// Sampler::sample with logprobs on; -1 where it throws InvalidArgument (what the GPU reports as -1).
Choice cpu_choice(std::span<const float> row, const RowSpec& s, std::optional<std::int32_t> eos, SeqRng rng) {
  Sampler sampler(eos);
  std::vector<float> l(row.begin(), row.end());
  SamplingParams p = s.params;
  p.logprobs = 0;
  SampleResult r;
  try {
    sampler.sample(r, l, p, s.prompt, s.output, rng);
  } catch (const InvalidArgument&) {
    return {};
  }
  return {r.token, r.logprob};
}

/// Whether the GPU's `gpu` (!= the CPU's choice) is explained by rounding at a boundary (see the file
/// comment). `why` says which.
bool within_rounding(std::span<const float> row, const RowSpec& s, std::optional<std::int32_t> eos, double u,
                     std::int32_t gpu, std::string& why) {
  const SamplingParams& p = s.params;
  if (p.greedy() || gpu < 0 || gpu >= static_cast<std::int32_t>(row.size())) return false;
  LogitsProcessor proc;
  std::vector<float> l(row.begin(), row.end());
  LogitsProcessor::apply_min_tokens(l, p, s.output.size(), eos);
  proc.apply_penalties(l, p, s.prompt, s.output);
  LogitsProcessor::apply_temperature(l, p.temperature);
  proc.apply_top_k(l, p.top_k);
  const std::vector<float> after_k = l;
  proc.apply_top_p(l, p.top_p);
  const std::vector<float> after_p = l;
  LogitsProcessor::apply_min_p(l, p.min_p);
  const float mx = *std::max_element(l.begin(), l.end());

  bool near_truncation = false;
  if (p.top_p < 1.0f) {
    std::vector<float> cand;
    for (float v : after_k)
      if (v != kNegInf) cand.push_back(v);
    std::sort(cand.begin(), cand.end(), std::greater<float>());
    long double total = 0;
    for (float v : cand) total += std::exp(static_cast<long double>(v) - mx);
    const long double target = static_cast<long double>(p.top_p) * total * (1.0L - 1e-6L);
    long double mass = 0, margin = std::numeric_limits<long double>::infinity();
    for (std::size_t j = 0; j < cand.size(); ++j) {
      mass += std::exp(static_cast<long double>(cand[j]) - mx);
      if (j + 1 == cand.size() || cand[j + 1] != cand[j]) margin = std::min(margin, std::fabs(mass - target) / total);
    }
    if (margin < 1e-9L) {
      near_truncation = true;
      why = "top-p mass boundary";
    }
  }
  if (p.min_p > 0.0f) {
    const double log_thr = std::log(static_cast<double>(p.min_p)) + std::log1p(-1e-6);
    for (float v : after_p) {
      if (v != kNegInf && std::fabs(static_cast<double>(v) - static_cast<double>(mx) - log_thr) < 1e-9) {
        near_truncation = true;
        why = "min-p ratio boundary";
      }
    }
  }
  std::vector<float> w(l.size());
  long double total = 0;
  for (std::size_t i = 0; i < l.size(); ++i) {
    w[i] = l[i] == kNegInf ? 0.0f : std::exp(l[i] - mx);
    total += w[i];
  }
  if (w[static_cast<std::size_t>(gpu)] == 0.0f) return near_truncation;
  long double before = 0;
  for (std::int32_t i = 0; i < gpu; ++i) before += w[static_cast<std::size_t>(i)];
  const long double after = before + w[static_cast<std::size_t>(gpu)];
  const long double target = static_cast<long double>(u) * total;
  const long double tol = std::ldexp(1.0L, -21) * total;
  if (target >= before - tol && target <= after + tol) {
    why = "CDF boundary";
    return true;
  }
  return near_truncation;
}

/// The bound on |GPU logprob - CPU logprob|: the GPU's f32 online softmax sums ~vocab / threads terms
/// per thread (each exp within 2 ulp, each rescale another exp) and a tree over the threads; the final
/// f32 subtractions add half an ulp each of their operands.
float logprob_bound(int vocab, int threads, float cpu_lp, float raw_gap) {
  const double terms = std::ceil(static_cast<double>(vocab) / threads) + 4.0;
  const double sum_rel = 6.0 * (terms + 12.0) * std::ldexp(1.0, -24);
  return static_cast<float>(sum_rel + (std::fabs(cpu_lp) + std::fabs(raw_gap)) * std::ldexp(1.0, -23) + 1e-7);
}

// ------------------------------------------------------------------------------------------------
// Running the GPU

struct GpuOut {
  Ids ids;
  std::vector<float> lp;
};

/// A device copy of `host` placed `pad` floats into its buffer (pad 1: a logits pointer that is not
/// 16-byte aligned, the scalar path).
struct DevLogits {
  DeviceMem mem;
  std::size_t pad;
  DevLogits(const std::vector<float>& host, std::size_t pad_floats)
      : mem((host.size() + pad_floats) * sizeof(float)), pad(pad_floats) {
    CUDA_REQUIRE(cudaMemcpy(mem.as<float>() + pad, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  const float* ptr() const { return mem.as<float>() + pad; }
};

template <class T>
void upload_or_empty(DeviceMem& m, const std::vector<T>& v) {
  if (!v.empty()) upload(m, v);
}

/// Device copies of a SamplingBatch.
struct DevBatch {
  DeviceMem params, indptr, ids, counts;
  explicit DevBatch(const kc::SamplingBatch& b)
      : params(b.params().size() * sizeof(kc::SamplingRowParams)),
        indptr(b.indptr().size() * sizeof(std::int32_t)),
        ids(b.ids().size() * sizeof(std::int32_t)),
        counts(b.counts().size() * sizeof(std::int32_t)) {
    upload_or_empty(params, b.params());
    upload_or_empty(indptr, b.indptr());
    upload_or_empty(ids, b.ids());
    upload_or_empty(counts, b.counts());
  }
  kc::SamplingTokenLists lists() const {
    return {indptr.as<std::int32_t>(), ids.as<std::int32_t>(), counts.as<std::int32_t>()};
  }
};

GpuOut gpu_sample(const std::vector<float>& logits, int vocab, const kc::SamplingBatch& batch, std::size_t pad = 0) {
  const int rows = batch.rows();
  DevLogits d_logits(logits, pad);
  DevBatch d_batch(batch);
  const std::size_t ws_bytes = kc::sampling_workspace_bytes(rows, vocab);
  DeviceMem ws(ws_bytes);
  CUDA_REQUIRE(cudaMemset(ws.p, 0xff, ws_bytes));  // NaN everywhere: nothing may be read before written
  DeviceMem d_ids(static_cast<std::size_t>(rows) * 4), d_lp(static_cast<std::size_t>(rows) * 4);
  CUDA_REQUIRE(cudaMemset(d_ids.p, 0xab, static_cast<std::size_t>(rows) * 4));
  CUDA_REQUIRE(cudaMemset(d_lp.p, 0xff, static_cast<std::size_t>(rows) * 4));
  kc::sample_rows(d_logits.ptr(), rows, vocab, d_batch.params.as<kc::SamplingRowParams>(), d_batch.lists(), ws.p,
                  ws_bytes, d_ids.as<std::int32_t>(), d_lp.as<float>(), nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  GpuOut out{download<std::int32_t>(d_ids.p, static_cast<std::size_t>(rows)),
             download<float>(d_lp.p, static_cast<std::size_t>(rows))};
  // The logits are an input only.
  const auto after = download<float>(d_logits.ptr(), logits.size());
  CHECK(std::memcmp(after.data(), logits.data(), logits.size() * sizeof(float)) == 0);
  return out;
}

GpuOut gpu_argmax(const std::vector<float>& logits, int rows, int vocab, std::size_t pad = 0) {
  DevLogits d_logits(logits, pad);
  DeviceMem d_ids(static_cast<std::size_t>(rows) * 4), d_lp(static_cast<std::size_t>(rows) * 4);
  CUDA_REQUIRE(cudaMemset(d_ids.p, 0xab, static_cast<std::size_t>(rows) * 4));
  CUDA_REQUIRE(cudaMemset(d_lp.p, 0xff, static_cast<std::size_t>(rows) * 4));
  kc::argmax_rows(d_logits.ptr(), rows, vocab, d_ids.as<std::int32_t>(), d_lp.as<float>(), nullptr);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  return {download<std::int32_t>(d_ids.p, static_cast<std::size_t>(rows)),
          download<float>(d_lp.p, static_cast<std::size_t>(rows))};
}

/// Tallies of one comparison run.
struct Tally {
  int rows = 0, drawn = 0, exact = 0, boundary = 0, bad = 0;
};

/// Compares GPU and CPU on every row: token (exact, or a boundary case for drawn rows) and logprob.
void compare_rows(const std::vector<float>& logits, int vocab, const std::vector<RowSpec>& specs,
                  const std::vector<SeqRng>& rngs_before, std::optional<std::int32_t> eos, const kc::SamplingBatch& batch,
                  const GpuOut& g, Tally& t, const char* what) {
  for (std::size_t r = 0; r < specs.size(); ++r) {
    const std::span<const float> row(logits.data() + r * static_cast<std::size_t>(vocab), static_cast<std::size_t>(vocab));
    const Choice c = cpu_choice(row, specs[r], eos, rngs_before[r]);
    const std::int32_t gt = g.ids[r];
    const bool drawn = !specs[r].params.greedy() && c.token >= 0;
    ++t.rows;
    t.drawn += drawn;
    INFO(what << " row " << r << ": vocab " << vocab << ", temperature " << specs[r].params.temperature << ", top_k "
              << specs[r].params.top_k << ", top_p " << specs[r].params.top_p << ", min_p " << specs[r].params.min_p
              << ", rep " << specs[r].params.repetition_penalty << ", freq " << specs[r].params.frequency_penalty
              << ", pres " << specs[r].params.presence_penalty << ", min_tokens " << specs[r].params.min_tokens
              << ", u " << batch.params()[r].u << "; CPU token " << c.token << ", GPU token " << gt);
    if (gt == c.token) {
      ++t.exact;
      if (c.token >= 0) {
        const float gap = row[static_cast<std::size_t>(c.token)] - *std::max_element(row.begin(), row.end());
        const float bound = logprob_bound(vocab, 512, c.logprob, gap);
        if (!(g.lp[r] == c.logprob || std::fabs(g.lp[r] - c.logprob) <= bound)) {  // equal covers -inf
          ++t.bad;
          FAIL_CHECK("logprob " << g.lp[r] << " vs CPU " << c.logprob << " (bound " << bound << ")");
        }
      } else if (!std::isnan(g.lp[r])) {
        ++t.bad;
        FAIL_CHECK("a -1 row's logprob is " << g.lp[r] << ", expected NaN");
      }
      continue;
    }
    std::string why;
    if (drawn && within_rounding(row, specs[r], eos, batch.params()[r].u, gt, why)) {
      ++t.boundary;
      std::printf("  %s row %zu: boundary case (%s): CPU %d, GPU %d, u %.17g\n", what, r, why.c_str(), c.token, gt,
                  batch.params()[r].u);
      continue;
    }
    ++t.bad;
    FAIL_CHECK("token mismatch not explained by rounding");
  }
}

}  // namespace

// ==================================================================================================

TEST_CASE("cuda::argmax_rows matches Sampler's greedy choice: first index of the max, -1 where it throws",
          "[cuda][sampling]") {
  const auto seed = test::test_seed("test_cuda_sampling argmax");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int vocab : {1, 7, 1000, 50257, 49152, 128256, 152064}) {
    for (std::size_t pad : {0, 1}) {
      const int rows = 1 + static_cast<int>(rng() % 64);
      INFO("vocab " << vocab << ", rows " << rows << ", logits shifted by " << pad);
      std::vector<float> logits;
      for (int r = 0; r < rows; ++r) {
        auto row = random_row(vocab, rng);
        logits.insert(logits.end(), row.begin(), row.end());
      }
      auto at = [&](int r, int i) -> float& { return logits[static_cast<std::size_t>(r) * vocab + i]; };
      // Special rows: all equal (the answer is 0), the max only at the end, -inf except one, a NaN,
      // a +inf, all -inf (the last three: -1).
      std::vector<int> special(static_cast<std::size_t>(rows), -1);
      for (int r = 0; r < rows && r < 6; ++r) special[static_cast<std::size_t>(rng() % rows)] = r;
      for (int r = 0; r < rows; ++r) {
        const int k = special[static_cast<std::size_t>(r)];
        if (k < 0) continue;
        for (int i = 0; i < vocab; ++i) {
          switch (k) {
            case 0: at(r, i) = 1.25f; break;
            case 1: at(r, i) = static_cast<float>(i % 97) * 0.01f; break;
            case 2: at(r, i) = kNegInf; break;
            case 5: at(r, i) = kNegInf; break;
            default: break;
          }
        }
        if (k == 1) at(r, vocab - 1) = 5.0f;
        if (k == 2) at(r, static_cast<int>(rng() % vocab)) = -3.0f;
        if (k == 3) at(r, static_cast<int>(rng() % vocab)) = kNaN;
        if (k == 4) at(r, static_cast<int>(rng() % vocab)) = std::numeric_limits<float>::infinity();
      }
      const GpuOut g = gpu_argmax(logits, rows, vocab, pad);
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        const std::span<const float> row(&at(r, 0), static_cast<std::size_t>(vocab));
        RowSpec greedy;
        greedy.params.temperature = 0.0f;
        const Choice c = cpu_choice(row, greedy, std::nullopt, SeqRng(1));
        if (g.ids[r] != c.token) {
          if (++bad <= 5) FAIL_CHECK("row " << r << " (special " << special[r] << "): GPU " << g.ids[r] << ", CPU " << c.token);
          continue;
        }
        if (c.token < 0) {
          CHECK(std::isnan(g.lp[r]));
          continue;
        }
        const float bound = logprob_bound(vocab, 2048, c.logprob, 0.0f);  // 8 blocks of 256 threads per row
        if (!(std::fabs(g.lp[r] - c.logprob) <= bound) && ++bad <= 5)
          FAIL_CHECK("row " << r << ": logprob " << g.lp[r] << " vs CPU " << c.logprob << ", bound " << bound);
      }
      CHECK(bad == 0);
    }
  }
  CHECK_THROWS_AS(kc::argmax_rows(nullptr, 2, 10, nullptr, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::argmax_rows(nullptr, -1, 10, nullptr, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::argmax_rows(nullptr, 1, 0, nullptr, nullptr, nullptr), InvalidArgument);
  CHECK_NOTHROW(kc::argmax_rows(nullptr, 0, 10, nullptr, nullptr, nullptr));
}

TEST_CASE("cuda::sample_rows picks the CPU Sampler's token for the same logits and u", "[cuda][sampling]") {
  const auto seed = test::test_seed("test_cuda_sampling sample");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  Tally t;
  struct Shape {
    int vocab, rounds;
    std::size_t pad;
  };
  for (const Shape sh : {Shape{1, 2, 0}, Shape{7, 4, 1}, Shape{1000, 12, 0}, Shape{32001, 4, 1}, Shape{49152, 6, 0},
                         Shape{128256, 4, 0}, Shape{152064, 4, 0}}) {
    const int vocab = sh.vocab;
    for (int round = 0; round < sh.rounds; ++round) {
      const int rows = 1 + static_cast<int>(rng() % 64);
      const std::optional<std::int32_t> eos = rng() % 4 ? std::optional<std::int32_t>(static_cast<std::int32_t>(rng() % vocab))
                                                         : std::nullopt;
      kc::SamplingBatch batch(vocab, eos);
      std::vector<float> logits;
      std::vector<RowSpec> specs;
      std::vector<SeqRng> before;
      for (int r = 0; r < rows; ++r) {
        auto row = random_row(vocab, rng);
        const int family = static_cast<int>(rng() % 8);
        specs.push_back(random_spec(family, row, eos, rng));
        logits.insert(logits.end(), row.begin(), row.end());
        SeqRng s(rng(), static_cast<std::uint64_t>(r));
        before.push_back(s);
        batch.add(specs.back().params, specs.back().prompt, specs.back().output, s);
        CHECK(s.draws() == (specs.back().params.greedy() ? 0u : 1u));  // one draw exactly when the CPU takes one
      }
      const GpuOut g = gpu_sample(logits, vocab, batch, sh.pad);
      compare_rows(logits, vocab, specs, before, eos, batch, g, t, "sample");
    }
  }
  std::printf("sample_rows vs Sampler: %d rows (%d drawn), %d identical, %d boundary cases, %d failures\n", t.rows,
              t.drawn, t.exact, t.boundary, t.bad);
  CHECK(t.bad == 0);
  CHECK(t.boundary * 100 <= t.drawn);
}

TEST_CASE("cuda::sample_rows: greedy with penalties and bans, error rows, argmax agreement", "[cuda][sampling]") {
  const auto seed = test::test_seed("test_cuda_sampling greedy");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int vocab = 49152, rows = 48;
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) {
    auto row = random_row(vocab, rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  auto at = [&](int r, int i) -> float& { return logits[static_cast<std::size_t>(r) * vocab + i]; };
  // Rows 0-2 invalid (NaN, +inf, all -inf); rows 3-5: a non-greedy row whose every token gets banned
  // or -inf (CPU throws), its greedy twin (CPU returns 0), and a row whose argmax is banned.
  at(0, 17) = kNaN;
  at(1, vocab - 1) = std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) at(2, i) = kNegInf;
  for (int r : {3, 4}) {
    for (int i = 0; i < vocab; ++i) at(r, i) = kNegInf;
    at(r, 5) = 1.0f;
  }
  const std::int32_t eos = 5;
  kc::SamplingBatch batch(vocab, eos);
  std::vector<RowSpec> specs(static_cast<std::size_t>(rows));
  std::vector<SeqRng> before;
  for (int r = 0; r < rows; ++r) {
    RowSpec& s = specs[static_cast<std::size_t>(r)];
    s.params.temperature = r == 3 ? 1.0f : 0.0f;
    if (r == 3 || r == 4) s.params.min_tokens = 2;  // bans EOS = the only finite token
    if (r >= 5) {
      const std::vector<float> row(&at(r, 0), &at(r, 0) + vocab);
      const Ids top = top_ids(row, 6);
      if (r % 3 == 0) {  // ban the argmax (and its ties) through min_tokens
        s.params.min_tokens = 3;
        s.params.stop_token_ids = {top[0], top[1]};
      }
      if (r % 2 == 0) {
        s.params.repetition_penalty = 1.3f;
        s.params.frequency_penalty = 0.5f;
        s.params.presence_penalty = 0.4f;
        s.prompt = {top[0], top[2], top[2], static_cast<std::int32_t>(rng() % vocab)};
        s.output = {top[1], top[1], top[3]};
      }
    }
    SeqRng sr(rng());
    before.push_back(sr);
    batch.add(s.params, s.prompt, s.output, sr);
  }
  const GpuOut g = gpu_sample(logits, vocab, batch);
  Tally t;
  compare_rows(logits, vocab, specs, before, eos, batch, g, t, "greedy");
  CHECK(t.bad == 0);
  CHECK(t.boundary == 0);  // greedy is exact
  CHECK(g.ids[0] == -1);
  CHECK(g.ids[1] == -1);
  CHECK(g.ids[2] == -1);
  CHECK(g.ids[3] == -1);
  CHECK(g.ids[4] == 0);
  // Without penalties or bans, greedy sample_rows and argmax_rows agree on every valid row.
  const GpuOut a = gpu_argmax(logits, rows, vocab);
  for (int r = 5; r < rows; ++r) {
    if (specs[static_cast<std::size_t>(r)].params.min_tokens == 0 && specs[static_cast<std::size_t>(r)].output.empty())
      CHECK(a.ids[r] == g.ids[r]);
  }
}

TEST_CASE("cuda::sample_rows: token frequencies over many draws follow the CPU's distribution", "[cuda][sampling]") {
  const auto seed = test::test_seed("test_cuda_sampling frequencies");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int vocab = 3000, rows = 256, launches = 40;
  std::vector<float> row(static_cast<std::size_t>(vocab));
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (auto& x : row) x = 2.0f * n01(rng);
  for (int j = 0; j < 10; ++j) row[rng() % vocab] = 6.0f + n01(rng);
  struct Config {
    float temperature, top_p, min_p;
    std::int32_t top_k;
  };
  for (const Config cfg : {Config{1.0f, 1.0f, 0.0f, 0}, Config{0.8f, 0.95f, 0.0f, 300}, Config{1.3f, 0.9f, 0.002f, 0}}) {
    SamplingParams p;
    p.temperature = cfg.temperature;
    p.top_p = cfg.top_p;
    p.min_p = cfg.min_p;
    p.top_k = cfg.top_k;
    INFO("temperature " << p.temperature << ", top_k " << p.top_k << ", top_p " << p.top_p << ", min_p " << p.min_p);
    // The CPU's processed distribution.
    std::vector<float> l = row;
    LogitsProcessor proc;
    proc.apply(l, p, {}, {});
    const float mx = *std::max_element(l.begin(), l.end());
    std::vector<double> prob(static_cast<std::size_t>(vocab));
    double total = 0;
    for (int i = 0; i < vocab; ++i) total += prob[i] = l[i] == kNegInf ? 0.0 : std::exp(l[i] - mx);
    for (auto& x : prob) x /= total;

    std::vector<long> freq(static_cast<std::size_t>(vocab), 0);
    std::vector<float> logits;
    for (int r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
    Tally t;
    const std::vector<RowSpec> specs(static_cast<std::size_t>(rows), RowSpec{p, {}, {}});
    for (int launch = 0; launch < launches; ++launch) {
      kc::SamplingBatch batch(vocab);
      std::vector<SeqRng> before;
      for (int r = 0; r < rows; ++r) {
        SeqRng s(seed, static_cast<std::uint64_t>(launch * rows + r));
        before.push_back(s);
        batch.add(p, {}, {}, s);
      }
      const GpuOut g = gpu_sample(logits, vocab, batch);
      compare_rows(logits, vocab, specs, before, std::nullopt, batch, g, t, "frequencies");
      for (std::int32_t id : g.ids) {
        REQUIRE(id >= 0);
        REQUIRE(id < vocab);
        ++freq[static_cast<std::size_t>(id)];
      }
    }
    CHECK(t.bad == 0);
    CHECK(t.boundary * 100 <= t.drawn);
    // Chi-square over bins with expected count >= 5 (the rest pooled), against the 1e-6 quantile
    // (Wilson-Hilferty): a correct sampler fails with probability 1e-6.
    const double n = static_cast<double>(rows) * launches;
    double chi2 = 0, pooled_e = 0, pooled_o = 0;
    int bins = 0;
    long impossible = 0;
    for (int i = 0; i < vocab; ++i) {
      const double e = n * prob[i];
      if (prob[i] == 0.0) {
        impossible += freq[i];
        continue;
      }
      if (e >= 5.0) {
        const double o = static_cast<double>(freq[i]);
        chi2 += (o - e) * (o - e) / e;
        ++bins;
      } else {
        pooled_e += e;
        pooled_o += static_cast<double>(freq[i]);
      }
    }
    if (pooled_e > 0) {
      chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
      ++bins;
    }
    CHECK(impossible == 0);  // tokens the CPU removed are never drawn
    const double df = bins - 1, z = 4.7534;
    const double crit = df * std::pow(1.0 - 2.0 / (9.0 * df) + z * std::sqrt(2.0 / (9.0 * df)), 3.0);
    std::printf("frequencies (T %.2f, k %d, p %.2f, min_p %.3f): chi2 %.1f over %d bins, critical %.1f\n",
                p.temperature, p.top_k, p.top_p, p.min_p, chi2, bins, crit);
    CHECK(bins >= 3);
    CHECK(chi2 < crit);
  }
}

TEST_CASE("cuda::sample_rows: seeded rows are reproducible and independent of the batch", "[cuda][sampling]") {
  const auto seed = test::test_seed("test_cuda_sampling seeds");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int vocab = 49152, rows = 32;
  std::vector<float> logits;
  for (int r = 0; r < rows; ++r) {
    auto row = random_row(vocab, rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.seed = rng();
  auto run = [&](bool reversed) {
    kc::SamplingBatch batch(vocab);
    std::vector<float> l;
    for (int k = 0; k < rows; ++k) {
      const int r = reversed ? rows - 1 - k : k;
      SeqRng s = SeqRng::for_sample(p, static_cast<std::uint32_t>(r));
      batch.add(p, {}, {}, s);
      l.insert(l.end(), logits.begin() + static_cast<std::ptrdiff_t>(r) * vocab,
               logits.begin() + static_cast<std::ptrdiff_t>(r + 1) * vocab);
    }
    GpuOut g = gpu_sample(l, vocab, batch);
    if (reversed) std::reverse(g.ids.begin(), g.ids.end());
    return g.ids;
  };
  const Ids a = run(false), b = run(false), c = run(true);
  CHECK(a == b);  // the same seeds, the same tokens
  CHECK(a == c);  // and a row's token does not depend on its place in the batch
  // The CPU with the same seeded streams.
  for (int r = 0; r < rows; ++r) {
    Sampler s;
    std::vector<float> l(logits.begin() + static_cast<std::ptrdiff_t>(r) * vocab,
                         logits.begin() + static_cast<std::ptrdiff_t>(r + 1) * vocab);
    SeqRng sr = SeqRng::for_sample(p, static_cast<std::uint32_t>(r));
    const std::int32_t cpu = s.sample(l, p, {}, {}, sr);
    if (cpu != a[static_cast<std::size_t>(r)]) WARN("row " << r << ": CPU " << cpu << ", GPU " << a[r] << " (boundary cases are checked in the main test)");
  }
}

TEST_CASE("cuda::sample_rows can be captured in a CUDA graph and replayed", "[cuda][sampling]") {
  const auto seed = test::test_seed("test_cuda_sampling graph");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const int vocab = 32000, rows = 16;
  std::vector<RowSpec> specs;
  std::vector<float> first_logits;
  for (int r = 0; r < rows; ++r) {
    auto row = random_row(vocab, rng);
    specs.push_back(random_spec(static_cast<int>(rng() % 8), row, std::nullopt, rng));
    first_logits.insert(first_logits.end(), row.begin(), row.end());
  }
  // Fixed-size device buffers, as an engine would hold them; the token lists get room for the largest.
  DeviceMem d_logits(first_logits.size() * 4), d_params(rows * sizeof(kc::SamplingRowParams)),
      d_indptr((rows + 1) * 4), d_ids(4096 * 4), d_counts(4096 * 4), d_out(rows * 4), d_lp(rows * 4);
  const std::size_t ws_bytes = kc::sampling_workspace_bytes(rows, vocab);
  DeviceMem ws(ws_bytes);
  cudaStream_t stream;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const kc::SamplingTokenLists lists{d_indptr.as<std::int32_t>(), d_ids.as<std::int32_t>(), d_counts.as<std::int32_t>()};
  cudaGraph_t graph;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  kc::sample_rows(d_logits.as<float>(), rows, vocab, d_params.as<kc::SamplingRowParams>(), lists, ws.p, ws_bytes,
                  d_out.as<std::int32_t>(), d_lp.as<float>(), stream);
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  Tally t;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> logits = first_logits;
    if (step > 0) {
      logits.clear();
      for (int r = 0; r < rows; ++r) {
        auto row = random_row(vocab, rng);
        logits.insert(logits.end(), row.begin(), row.end());
      }
    }
    kc::SamplingBatch batch(vocab);
    std::vector<SeqRng> before;
    for (int r = 0; r < rows; ++r) {
      SeqRng s(rng());
      before.push_back(s);
      batch.add(specs[static_cast<std::size_t>(r)].params, specs[static_cast<std::size_t>(r)].prompt,
                specs[static_cast<std::size_t>(r)].output, s);
    }
    REQUIRE(batch.ids().size() <= 4096);
    upload(d_logits, logits);
    upload(d_params, batch.params());
    upload(d_indptr, batch.indptr());
    upload_or_empty(d_ids, batch.ids());
    upload_or_empty(d_counts, batch.counts());
    CUDA_REQUIRE(cudaMemset(d_out.p, 0xab, rows * 4));
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    GpuOut g{download<std::int32_t>(d_out.p, rows), download<float>(d_lp.p, rows)};
    compare_rows(logits, vocab, specs, before, std::nullopt, batch, g, t, "graph");
    // The same batch through a direct call gives the same tokens (the graph is not stale).
    const GpuOut direct = gpu_sample(logits, vocab, batch);
    CHECK(direct.ids == g.ids);
  }
  CHECK(t.bad == 0);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("cuda::sample_rows and SamplingBatch reject bad arguments", "[cuda][sampling]") {
  DeviceMem logits(64 * 4), params(2 * sizeof(kc::SamplingRowParams)), out(8), ws(1 << 16);
  const auto* lp = logits.as<float>();
  const auto* pp = params.as<kc::SamplingRowParams>();
  auto* op = out.as<std::int32_t>();
  const std::size_t need = kc::sampling_workspace_bytes(2, 32);
  CHECK(need >= 2 * 32 * 4);
  CHECK(kc::sampling_workspace_bytes(0, 32) == 0);
  CHECK_THROWS_AS(kc::sampling_workspace_bytes(-1, 32), InvalidArgument);
  CHECK_THROWS_AS(kc::sampling_workspace_bytes(1, 0), InvalidArgument);
  CHECK_NOTHROW(kc::sample_rows(nullptr, 0, 32, nullptr, {}, nullptr, 0, nullptr, nullptr, nullptr));
  CHECK_THROWS_AS(kc::sample_rows(nullptr, 2, 32, pp, {}, ws.p, 1 << 16, op, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::sample_rows(lp, 2, 32, nullptr, {}, ws.p, 1 << 16, op, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::sample_rows(lp, 2, 32, pp, {}, nullptr, 1 << 16, op, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::sample_rows(lp, 2, 32, pp, {}, ws.p, need - 1, op, nullptr, nullptr), InvalidArgument);
  CHECK_THROWS_AS(kc::sample_rows(lp, 2, 32, pp, {}, static_cast<char*>(ws.p) + 4, need, op, nullptr, nullptr),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::sample_rows(lp, 2, 32, pp, {op, nullptr, nullptr}, ws.p, need, op, nullptr, nullptr),
                  InvalidArgument);
  CHECK_THROWS_AS(kc::sample_rows(lp, -1, 32, pp, {}, ws.p, need, op, nullptr, nullptr), InvalidArgument);

  // SamplingBatch checks ids as LogitsProcessor does, and a throw leaves the batch unchanged.
  kc::SamplingBatch batch(10, 3);
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  SeqRng rng(7);
  batch.add(p, Ids{1, 2, 2}, Ids{2, 4, 2}, rng);
  REQUIRE(batch.rows() == 1);
  CHECK(batch.indptr() == Ids{0, 3});
  CHECK(rng.draws() == 1);
  std::vector<float> l(10, 0.0f);
  LogitsProcessor proc;
  const std::vector<std::pair<Ids, Ids>> bad_ids = {{{10}, {}}, {{}, {-1}}, {{1}, {12}}};
  for (const auto& [prompt, output] : bad_ids) {
    CHECK_THROWS_AS(batch.add(p, prompt, output, rng), InvalidArgument);
    CHECK_THROWS_AS(proc.apply(l, p, prompt, output), InvalidArgument);
  }
  SamplingParams ban;
  ban.min_tokens = 2;
  ban.stop_token_ids = {11};
  CHECK_THROWS_AS(batch.add(ban, {}, {}, rng), InvalidArgument);
  CHECK(batch.rows() == 1);
  CHECK(batch.indptr() == Ids{0, 3});
  CHECK(batch.ids().size() == 3);
  CHECK(rng.draws() == 1);  // nothing drawn for the rejected rows
  // Entries of the accepted row: 2 twice in the output (count 2), 4 once, 1 prompt-only (count 0).
  Ids ids = batch.ids(), counts = batch.counts();
  std::vector<std::pair<std::int32_t, std::int32_t>> entries;
  for (std::size_t e = 0; e < ids.size(); ++e) entries.emplace_back(ids[e], counts[e]);
  std::sort(entries.begin(), entries.end());
  CHECK(entries == std::vector<std::pair<std::int32_t, std::int32_t>>{{1, 0}, {2, 2}, {4, 1}});
  // min_tokens: EOS (3) and the stop ids are banned, a banned token's penalty entry becomes a ban.
  SamplingParams mt;
  mt.min_tokens = 3;
  mt.stop_token_ids = {4};
  mt.frequency_penalty = 0.5f;
  batch.clear();
  batch.add(mt, {}, Ids{4, 5}, rng);
  entries.clear();
  for (std::size_t e = 0; e < batch.ids().size(); ++e) entries.emplace_back(batch.ids()[e], batch.counts()[e]);
  std::sort(entries.begin(), entries.end());
  CHECK(entries == std::vector<std::pair<std::int32_t, std::int32_t>>{{3, kc::kBannedToken}, {4, kc::kBannedToken}, {5, 1}});
}
