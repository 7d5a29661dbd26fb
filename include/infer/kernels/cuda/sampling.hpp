#pragma once
/// \file
/// Choosing tokens on the GPU from f32 logits [rows][vocab] without copying them to the host:
/// `argmax_rows` (greedy) and `sample_rows` (the whole `Sampler` pipeline: min-tokens bans, repetition /
/// frequency / presence penalties, temperature, top-k, top-p, min-p, then an inverse-CDF draw).
/// Compiled in kernels/cuda/sampling.cu; this header includes no CUDA header.
///
/// The oracle is the CPU `Sampler` (sampling/sampler.hpp, sampling/logits_processor.hpp). For the same
/// logits, parameters and uniform `u`, `sample_rows` picks the same token as `Sampler::sample`, except
/// where the CPU's choice is within float rounding of a boundary: the draw's CDF (the GPU's weights are
/// exp rounded correctly to f32, glibc's expf is within 0.502 ulp, so single weights may differ by one
/// ulp), the top-p mass boundary (the GPU sums fixed-point masses, within ~1e-9 of the CPU's double sum)
/// or the min-p ratio boundary (log in double, within an ulp). Everything else — penalties, temperature,
/// top-k, the tie rules, greedy — is computed with the CPU's f32 operations in the CPU's order and is
/// bit-identical.
///
/// The random number stays on the host: each non-greedy row carries the `u` its sequence's `SeqRng`
/// drew (`SamplingBatch::add` draws it exactly when `Sampler::sample` would), so seeded streams are the
/// same on both backends and a batch's composition never changes a sequence's tokens.
///
/// Conventions as in ops.hpp: device pointers, `stream` is a cudaStream_t (nullptr = legacy default),
/// asynchronous, no allocation, no host synchronization (so the calls can be captured in a CUDA graph);
/// InvalidArgument for bad sizes, null pointers or a short workspace; DeviceError when a launch fails.
///
/// Inputs the CPU sampler rejects with InvalidArgument (a NaN or +inf logit, every logit -inf, a
/// non-greedy row whose processed maximum is not finite, a temperature that is not finite and > 0) give
/// token -1 (and a NaN logprob) for that row instead: the device cannot throw, and the engine reads the
/// ids on the host anyway.
///
/// Not supported because the CPU sampler does not support them either: logit bias, allowed-token lists.
/// min_tokens is supported through the banned ids (`SamplingBatch` fills them as
/// `LogitsProcessor::apply_min_tokens` does).

#if defined(INFER_HAVE_CUDA)

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/sampling/sampler.hpp"
#include "infer/sampling/sampling_params.hpp"

namespace infer::kernels::cuda {

/// For each row: out_ids[r] = the first index of the row's largest logit (`Sampler::argmax`'s rule,
/// which is also what `Sampler::sample` returns for a greedy request without penalties), or -1 where
/// `Sampler::sample` would throw (a NaN or +inf logit, or every logit -inf). When `out_logprob_or_null`
/// is given it receives the chosen token's log-softmax over the raw row (NaN for a -1 row), computed
/// in f32 (an online max/sum, so the logits are read once): within ~(vocab / 2048 + 16) * 3 * 2^-24 of the
/// CPU's double value. A cluster of 8 blocks of 256 threads per row (rows <= 65535), 16-byte loads when the
/// rows allow.
void argmax_rows(const float* logits, int rows, int vocab, std::int32_t* out_ids, float* out_logprob_or_null,
                 void* stream);

/// One row's sampling parameters, as `SamplingParams` names them, plus the row's uniform draw.
/// A plain struct: an array of them is copied to the device as is (40 bytes each).
struct SamplingRowParams {
  float temperature = 1.0f;  ///< < SamplingParams::greedy_epsilon: greedy (argmax after the penalties)
  std::int32_t top_k = 0;    ///< <= 0 or >= vocab: off
  float top_p = 1.0f;        ///< >= 1: off
  float min_p = 0.0f;        ///< <= 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::int32_t reserved = 0;  ///< keeps `u` 8-byte aligned; write 0
  double u = 0.0;             ///< SeqRng::uniform() in [0, 1); ignored by greedy rows
};

/// Per-row token lists, CSR over rows (device arrays): row r owns entries [indptr[r], indptr[r + 1]).
/// Entry e names token ids[e] (unique within its row, in [0, vocab); ids outside are skipped) with
///   counts[e] >  0: the token occurs counts[e] times in the output (frequency/presence penalties, and the
///                   repetition penalty);
///   counts[e] == 0: the token occurs in the prompt only (repetition penalty only);
///   counts[e] == kBannedToken: the token is masked to -inf (min_tokens: EOS and the stop ids).
/// The CPU's penalties leave a token alone unless the row's penalties are on, exactly as here. All
/// three pointers null: no lists. `SamplingBatch` builds these arrays on the host.
struct SamplingTokenLists {
  const std::int32_t* indptr = nullptr;  ///< [rows + 1]
  const std::int32_t* ids = nullptr;
  const std::int32_t* counts = nullptr;
};
inline constexpr std::int32_t kBannedToken = -1;

/// Bytes of workspace `sample_rows` needs for `rows` x `vocab`: one f32 copy of the processed logits
/// (rows padded to 256 values) and one double per 256 values for the draw. Allocate once for the
/// largest batch; a larger workspace is fine. InvalidArgument for rows < 0 or vocab < 1.
std::size_t sampling_workspace_bytes(int rows, int vocab);

/// Samples one token per row as `Sampler::sample` does (see the file comment for the exact contract):
/// greedy rows (temperature < greedy_epsilon) take the argmax after bans and penalties, others draw
/// with their `u`. `logits` are left unchanged (the processed values live in the workspace), so the
/// optional `out_logprob_or_null` is the chosen token's log-softmax over the *raw* row, as
/// SampleResult::logprob. `workspace` is device memory of at least sampling_workspace_bytes(rows,
/// vocab) bytes, 16-byte aligned; its contents need no initialization and are garbage afterwards.
/// One block of 512 threads per row.
void sample_rows(const float* logits, int rows, int vocab, const SamplingRowParams* params,
                 SamplingTokenLists lists, void* workspace, std::size_t workspace_bytes, std::int32_t* out_ids,
                 float* out_logprob_or_null, void* stream);

/// Host-side staging of one `sample_rows` batch: the per-row parameters and the token lists, built from
/// what `Sampler::sample` takes (params, prompt, output, EOS, the sequence's SeqRng). Upload `params()`,
/// `indptr()`, `ids()` and `counts()` as they are. Keeps its capacity between batches (`clear`), and
/// holds one vocabulary-sized scratch array, so one per engine thread.
class SamplingBatch {
 public:
  explicit SamplingBatch(std::int32_t vocab, std::optional<std::int32_t> eos_id = std::nullopt)
      : vocab_(vocab), eos_id_(eos_id) {
    if (vocab < 1) throw InvalidArgument(detail::cat("SamplingBatch: vocab = ", vocab, " must be >= 1"));
    slot_.assign(static_cast<std::size_t>(vocab), -1);
    indptr_.push_back(0);
  }

  void clear() {
    params_.clear();
    ids_.clear();
    counts_.clear();
    indptr_.assign(1, 0);
  }

  /// Appends one row. Bans and penalties follow LogitsProcessor::apply_min_tokens / apply_penalties
  /// (same conditions, same id checks: InvalidArgument for an id outside the vocabulary, and then the
  /// batch is unchanged and nothing is drawn). `rng` gives one draw exactly when the CPU sampler would
  /// take one: for a non-greedy row.
  void add(const SamplingParams& p, std::span<const std::int32_t> prompt, std::span<const std::int32_t> output,
           SeqRng& rng) {
    const bool ban = output.size() < static_cast<std::size_t>(std::max(p.min_tokens, 0));
    const bool rep = p.repetition_penalty != 1.0f;
    const bool freq_pres = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    const bool penalize = rep || freq_pres;
    // Every check first, so a throw leaves the batch as it was.
    if (ban) {
      for (std::int32_t id : p.stop_token_ids) check_id(id, "stop_token_ids");
      if (eos_id_ && !p.ignore_eos) check_id(*eos_id_, "eos_id");
    }
    if (penalize) {
      for (std::int32_t id : output) check_id(id, "output");
      if (rep) {
        for (std::int32_t id : prompt) check_id(id, "prompt");
      }
    }
    const std::size_t first = ids_.size();
    auto entry = [&](std::int32_t id) -> std::int32_t& {
      std::int32_t& s = slot_[static_cast<std::size_t>(id)];
      if (s < 0) {
        s = static_cast<std::int32_t>(ids_.size() - first);
        ids_.push_back(id);
        counts_.push_back(0);
      }
      return counts_[first + static_cast<std::size_t>(s)];
    };
    if (penalize) {
      for (std::int32_t id : output) ++entry(id);
      if (rep) {
        for (std::int32_t id : prompt) (void)entry(id);
      }
    }
    if (ban) {
      for (std::int32_t id : p.stop_token_ids) entry(id) = kBannedToken;
      if (eos_id_ && !p.ignore_eos) entry(*eos_id_) = kBannedToken;
    }
    for (std::size_t e = first; e < ids_.size(); ++e) slot_[static_cast<std::size_t>(ids_[e])] = -1;
    indptr_.push_back(static_cast<std::int32_t>(ids_.size()));

    SamplingRowParams r;
    r.temperature = p.temperature;
    r.top_k = p.top_k;
    r.top_p = p.top_p;
    r.min_p = p.min_p;
    r.repetition_penalty = p.repetition_penalty;
    r.presence_penalty = p.presence_penalty;
    r.frequency_penalty = p.frequency_penalty;
    r.u = p.greedy() ? 0.0 : rng.uniform();
    params_.push_back(r);
  }

  [[nodiscard]] int rows() const noexcept { return static_cast<int>(params_.size()); }
  [[nodiscard]] std::int32_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] const std::vector<SamplingRowParams>& params() const noexcept { return params_; }
  [[nodiscard]] const std::vector<std::int32_t>& indptr() const noexcept { return indptr_; }
  [[nodiscard]] const std::vector<std::int32_t>& ids() const noexcept { return ids_; }
  [[nodiscard]] const std::vector<std::int32_t>& counts() const noexcept { return counts_; }

 private:
  void check_id(std::int32_t id, const char* what) const {
    if (id < 0 || id >= vocab_) {
      throw InvalidArgument(detail::cat("SamplingBatch: ", what, " token id ", id,
                                        " is out of range; the logits have ", vocab_, " entries"));
    }
  }

  std::int32_t vocab_;
  std::optional<std::int32_t> eos_id_;
  std::vector<SamplingRowParams> params_;
  std::vector<std::int32_t> indptr_, ids_, counts_;
  std::vector<std::int32_t> slot_;  ///< per token: its entry in the row being added, -1 otherwise
};

}  // namespace infer::kernels::cuda

#endif  // INFER_HAVE_CUDA
