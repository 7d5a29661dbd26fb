#pragma once
/// \file
/// `DeviceSampler`: the tokens of a step's sampled rows drawn on the GPU from the logits the model left
/// there, so a step brings back one id (and one logprob) per row instead of a vocabulary of f32 logits.
/// It stages each row's parameters and token lists (`kernels::cuda::SamplingBatch`, which also takes
/// the row's uniform draw from its `SeqRng` exactly when the CPU `Sampler` would), copies them up in
/// one transfer, runs `kernels::cuda::sample_rows` over the rows in passes that fit its workspace, and
/// copies the ids back. Tokens equal the CPU sampler's on the same logits except within float
/// rounding of a draw boundary (sampling.hpp's contract).
///
/// Every buffer but the token lists is allocated by `reserve()` (the model calls it before the KV pool
/// takes what is left); the lists grow, doubling, when penalties bring long prompts. Not thread-safe.

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/sampling.hpp"
#include "infer/model/forward_batch.hpp"
#include "infer/sampling/sampler.hpp"

namespace infer {

class DeviceSampler {
 public:
  /// Workspace of one pass: enough rows of processed logits to fill the GPU without holding a copy of
  /// every row of a large batch (1024 rows of Llama 3's 128,256 logits would be 525 MB).
  static constexpr std::size_t kPassWorkspaceBytes = std::size_t{64} << 20;

  /// Sizes the buffers for steps of up to `max_rows` sampled rows of `vocab` logits. Idempotent for
  /// equal or smaller sizes.
  void reserve(int max_rows, int vocab) {
    if (max_rows <= max_rows_ && vocab == vocab_) return;
    const std::size_t per_row = kernels::cuda::sampling_workspace_bytes(1, vocab);
    rows_per_pass_ = static_cast<int>(std::clamp<std::size_t>(kPassWorkspaceBytes / per_row, 1, static_cast<std::size_t>(max_rows)));
    workspace_ = backend::cuda::DeviceBuffer(kernels::cuda::sampling_workspace_bytes(rows_per_pass_, vocab));
    max_rows_ = max_rows;
    vocab_ = vocab;
    stage(0);  // parameters and results of max_rows rows, no token lists yet
    batch_.reset();
  }

  /// Draws one token per row of `logits` (device, f32 [rows.size()][vocab], as the model's last step
  /// left them) on `stream`, and waits for the ids. `out[i]` is row i's token and, when its params ask
  /// for logprobs, the token's raw log-softmax (NaN otherwise). A row the CPU sampler would reject
  /// (non-finite logits) gets token -1. InvalidArgument for more rows than reserved, or from
  /// SamplingBatch::add for a token id outside the vocabulary (which the engine's request checks rule out).
  void sample(const float* logits, std::span<const SampleRow> rows, std::optional<std::int32_t> eos_id,
              std::vector<SampleResult>& out, cudaStream_t stream) {
    const auto n = static_cast<int>(rows.size());
    require<InvalidArgument>(n <= max_rows_, "DeviceSampler: ", n, " rows, more than the ", max_rows_, " reserved");
    out.resize(rows.size());
    if (n == 0) return;
    if (!batch_ || batch_eos_ != eos_id) {
      batch_.emplace(vocab_, eos_id);
      batch_eos_ = eos_id;
    }
    batch_->clear();
    bool logprobs = false;
    for (const SampleRow& r : rows) logprobs = logprobs || r.params->logprobs.has_value();
    for (const SampleRow& r : rows) batch_->add(*r.params, r.prompt, r.output, *r.rng);

    const Layout l = stage(batch_->ids().size());
    auto* host = static_cast<std::byte*>(pinned_.data());
    std::memcpy(host + l.params, batch_->params().data(), rows.size() * sizeof(kernels::cuda::SamplingRowParams));
    std::memcpy(host + l.indptr, batch_->indptr().data(), batch_->indptr().size() * sizeof(std::int32_t));
    std::memcpy(host + l.ids, batch_->ids().data(), batch_->ids().size() * sizeof(std::int32_t));
    std::memcpy(host + l.counts, batch_->counts().data(), batch_->counts().size() * sizeof(std::int32_t));
    backend::cuda::check(cudaMemcpyAsync(staged_.data(), pinned_.data(), l.inputs, cudaMemcpyHostToDevice, stream),
                         "DeviceSampler: copying the rows' parameters");
    auto* dev = static_cast<std::byte*>(staged_.data());
    const auto* params = reinterpret_cast<const kernels::cuda::SamplingRowParams*>(dev + l.params);
    kernels::cuda::SamplingTokenLists lists;
    if (!batch_->ids().empty()) {
      lists.indptr = reinterpret_cast<const std::int32_t*>(dev + l.indptr);
      lists.ids = reinterpret_cast<const std::int32_t*>(dev + l.ids);
      lists.counts = reinterpret_cast<const std::int32_t*>(dev + l.counts);
    }
    auto* ids = reinterpret_cast<std::int32_t*>(dev + l.out_ids);
    auto* lps = reinterpret_cast<float*>(dev + l.out_logprobs);
    for (int r0 = 0; r0 < n; r0 += rows_per_pass_) {
      const int cnt = std::min(rows_per_pass_, n - r0);
      kernels::cuda::SamplingTokenLists pass = lists;
      if (pass.indptr) pass.indptr += r0;  // entries are absolute indices into ids / counts
      kernels::cuda::sample_rows(logits + static_cast<std::size_t>(r0) * static_cast<std::size_t>(vocab_), cnt, vocab_,
                                 params + r0, pass, workspace_.data(), workspace_.size(), ids + r0,
                                 logprobs ? lps + r0 : nullptr, stream);
    }
    // Ids and logprobs lie side by side: one copy back.
    const std::size_t back = (logprobs ? l.end : l.out_ids + rows.size() * sizeof(std::int32_t)) - l.out_ids;
    backend::cuda::check(cudaMemcpyAsync(host + l.out_ids, dev + l.out_ids, back, cudaMemcpyDeviceToHost, stream),
                         "DeviceSampler: copying the sampled ids");
    backend::cuda::check(cudaStreamSynchronize(stream), "DeviceSampler: waiting for the sampled ids");
    const auto* host_ids = reinterpret_cast<const std::int32_t*>(host + l.out_ids);
    const auto* host_lps = reinterpret_cast<const float*>(host + l.out_logprobs);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      out[i].token = host_ids[i];
      out[i].logprob = rows[i].params->logprobs ? host_lps[i] : std::numeric_limits<float>::quiet_NaN();
      out[i].top_logprobs.clear();
    }
  }

 private:
  /// Byte offsets of one batch in the pinned staging buffer and its device copy: the inputs first
  /// (one upload), then the results (one download).
  struct Layout {
    std::size_t params = 0, indptr = 0, ids = 0, counts = 0, inputs = 0, out_ids = 0, out_logprobs = 0, end = 0;
  };
  Layout layout(std::size_t entries) const {
    Layout l;
    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
      at = (at + 15) / 16 * 16;
      const std::size_t r = at;
      at += bytes;
      return r;
    };
    const auto rows = static_cast<std::size_t>(max_rows_);
    l.params = take(rows * sizeof(kernels::cuda::SamplingRowParams));
    l.indptr = take((rows + 1) * sizeof(std::int32_t));
    l.ids = take(entries * sizeof(std::int32_t));
    l.counts = take(entries * sizeof(std::int32_t));
    l.inputs = at;
    l.out_ids = take(rows * sizeof(std::int32_t));
    l.out_logprobs = take(rows * sizeof(float));
    l.end = at;
    return l;
  }
  /// The layout for `entries` list entries, growing both staging buffers (doubling the lists' room)
  /// when they are short. Safe to reallocate here: the last batch's copies finished before it returned.
  Layout stage(std::size_t entries) {
    Layout l = layout(entries);
    if (l.end > pinned_.size()) {
      entries_room_ = std::max(entries, entries_room_ * 2);
      l = layout(entries_room_);
      pinned_ = backend::cuda::PinnedBuffer(l.end);
      staged_ = backend::cuda::DeviceBuffer(l.end);
      l = layout(entries);
    }
    return l;
  }

  int vocab_ = 0, max_rows_ = 0, rows_per_pass_ = 1;
  std::size_t entries_room_ = 0;
  backend::cuda::DeviceBuffer workspace_, staged_;
  backend::cuda::PinnedBuffer pinned_;
  std::optional<kernels::cuda::SamplingBatch> batch_;
  std::optional<std::int32_t> batch_eos_;
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
