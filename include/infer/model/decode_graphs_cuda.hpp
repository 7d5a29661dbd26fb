#pragma once
/// \file
/// `DecodeGraphs`: which decode batch sizes the GPU decoder captures as CUDA graphs, which captured size a
/// decode step of n sequences replays, and the graphs themselves.
///
/// Small decode steps are bound by reading the weights, so a few padding rows cost nothing: a step of n
/// sequences replays the smallest bucket >= n (padding rows write nothing and attend to nothing). Past the
/// last bucket a step is compute-bound and replays max_num_seqs' graph only when the padding is at most
/// 1/kMaxPaddingShare of it; else it runs eagerly at its own size.

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"

namespace infer {

class DecodeGraphs {
 public:
  using Graph = backend::cuda::Graph;

  static constexpr std::array<std::int32_t, 16> kBuckets{1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  static constexpr std::int32_t kMaxPaddingShare = 8;  ///< 1/8

  /// The sizes to capture for steps of at most `max_seqs` sequences and `max_tokens` tokens: every bucket
  /// that fits, and max_seqs itself when the largest fitting bucket falls short of it. Drops every graph.
  void plan(std::int32_t max_seqs, std::int32_t max_tokens) {
    graphs_.clear();
    sizes_.clear();
    for (std::int32_t b : kBuckets) {
      if (b > max_seqs || b > max_tokens) break;
      sizes_.push_back(b);
    }
    if (max_seqs <= max_tokens && (sizes_.empty() || sizes_.back() != max_seqs)) sizes_.push_back(max_seqs);
  }

  /// The planned sizes, ascending.
  [[nodiscard]] const std::vector<std::int32_t>& sizes() const noexcept { return sizes_; }

  /// The planned size a decode step of `n` rows takes (the smallest one >= n, past the last bucket only
  /// when padding is at most 1/kMaxPaddingShare of it), or 0 when it runs at its own size.
  [[nodiscard]] std::int32_t bucket(std::int32_t n) const {
    const auto it = std::lower_bound(sizes_.begin(), sizes_.end(), n);
    if (it == sizes_.end()) return 0;
    return *it <= kBuckets.back() || (*it - n) * kMaxPaddingShare <= *it ? *it : 0;
  }

  /// The graph captured for size `b`, or nullptr.
  [[nodiscard]] const Graph* find(std::int32_t b) const {
    const auto it = graphs_.find(b);
    return it == graphs_.end() ? nullptr : &it->second;
  }
  [[nodiscard]] std::size_t captured() const noexcept { return graphs_.size(); }

  /// Captures what `enqueue()` puts on `stream` as the graph of size `b` (ending the capture if it throws).
  template <class F>
  void capture(std::int32_t b, void* stream, F&& enqueue) {
    Graph::begin_capture(stream);
    try {
      enqueue();
    } catch (...) {
      Graph::abort_capture(stream);
      throw;
    }
    graphs_.insert_or_assign(b, Graph::end_capture(stream));
  }

  /// Drops the captured graphs (the buffers they point at are gone), keeping the plan: until the next
  /// capture, steps of a planned size run eagerly.
  void drop() noexcept { graphs_.clear(); }

 private:
  std::vector<std::int32_t> sizes_;
  std::map<std::int32_t, Graph> graphs_;
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
