#pragma once
/// \file
/// `DeviceGroup`: the collectives the CUDA decoder's tensor parallelism calls, over device memory and ordered on
/// the caller's CUDA stream (the model's), so that they fall between its kernels like one more kernel and, where
/// the group allows it, are captured into its decode graphs. `dist::Nccl` is one (dist/nccl.hpp); `HostStaged`
/// here is one over any host `Group` (each call waits for the stream and copies through the host): slow and not
/// capturable, but it runs several ranks on one GPU (ranks as threads, test/support/thread_group.hpp), which NCCL
/// refuses, so that the sharded decoder is checked against the whole one on a single-GPU machine.
///
/// Every rank must make the same calls in the same order with the same sizes. Streams are `void*` (a
/// cudaStream_t) so that this header needs no CUDA headers.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/dist/communicator.hpp"

#if defined(INFER_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace infer::dist {

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  /// Whether the calls may be captured into a CUDA graph (the decoder captures its decode steps only then).
  [[nodiscard]] virtual bool capturable() const = 0;
  /// `n` f32 values at `data` (device) become their sum over the ranks, in place.
  virtual void all_reduce_sum(float* data, std::size_t n, void* stream) = 0;
  /// `n` bf16 values at `data` (device) become their sum over the ranks (rounded to bf16), in place.
  virtual void all_reduce_sum_bf16(std::uint16_t* data, std::size_t n, void* stream) = 0;
  /// `all` (device, size() · n values) becomes every rank's `n` values at `mine`, in rank order.
  virtual void all_gather(const float* mine, float* all, std::size_t n, void* stream) = 0;
};

#if defined(INFER_HAVE_CUDA)

/// A DeviceGroup over a host Group (see the file comment). The bf16 sum is taken in f32 and rounded once.
class HostStaged final : public DeviceGroup {
 public:
  explicit HostStaged(Group& host) noexcept : host_(host) {}
  [[nodiscard]] int rank() const override { return host_.rank(); }
  [[nodiscard]] int size() const override { return host_.size(); }
  [[nodiscard]] bool capturable() const override { return false; }

  void all_reduce_sum(float* data, std::size_t n, void* stream) override {
    f32_.resize(n);
    copy(f32_.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
    host_.all_reduce_sum(f32_);
    copy(data, f32_.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream);
  }
  void all_reduce_sum_bf16(std::uint16_t* data, std::size_t n, void* stream) override {
    bf16_.resize(n);
    f32_.resize(n);
    copy(bf16_.data(), data, n * sizeof(std::uint16_t), cudaMemcpyDeviceToHost, stream);
    for (std::size_t i = 0; i < n; ++i) f32_[i] = bf16_to_f32(bf16_[i]);
    host_.all_reduce_sum(f32_);
    for (std::size_t i = 0; i < n; ++i) bf16_[i] = f32_to_bf16(f32_[i]);
    copy(data, bf16_.data(), n * sizeof(std::uint16_t), cudaMemcpyHostToDevice, stream);
  }
  void all_gather(const float* mine, float* all, std::size_t n, void* stream) override {
    f32_.resize(n);
    gathered_.resize(n * static_cast<std::size_t>(size()));
    copy(f32_.data(), mine, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
    host_.all_gather(f32_, gathered_);
    copy(all, gathered_.data(), gathered_.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
  }

 private:
  /// A copy ordered after the stream's work, finished before returning (the host buffers are reused).
  static void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, void* stream) {
    const auto s = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
      throw DistributedError(detail::cat("HostStaged: copying ", bytes, " bytes through the host failed: ",
                                         cudaGetErrorString(e)));
  }

  Group& host_;
  std::vector<float> f32_, gathered_;
  std::vector<std::uint16_t> bf16_;
};

#endif  // INFER_HAVE_CUDA

}  // namespace infer::dist
