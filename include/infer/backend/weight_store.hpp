#pragma once
/// \file
/// `CudaWeightStore`: where the CUDA backend's Quantizers put weights — one device arena for the whole
/// model (one cudaMalloc, no fragmentation, one free). Loading runs twice over the same code: first with
/// a *measuring* store, which only adds up the aligned sizes (no allocation, no copy, no conversion), then
/// with a live store of exactly that capacity. So a Quantizer's `load` is written once and the arena is
/// sized without guessing.
///
/// Values arrive three ways: bytes copied as they are (bf16 weights, GGUF blocks kept in place); any
/// other dtype decoded to bf16 on the device (the file's bytes are staged, then the dequantize kernel
/// runs); and dummy weights (WeightTensor::dummy) made on the device by the fill kernel, without any host
/// work or transfer.

#if defined(INFER_HAVE_CUDA)

#include <cstddef>
#include <cstdint>
#include <span>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/dtype.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/fill.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/weight_tensor.hpp"

namespace infer {

class CudaWeightStore {
 public:
  /// A measuring store: allocate() returns nullptr and counts; the copy functions do nothing.
  CudaWeightStore() = default;

  /// A live store of `capacity_bytes` (what a measuring pass reported), enqueuing on `stream`.
  CudaWeightStore(std::size_t capacity_bytes, void* stream) : arena_(capacity_bytes), stream_(stream), live_(true) {}

  [[nodiscard]] bool measuring() const noexcept { return !live_; }

  /// `bytes` of arena memory (256-byte aligned); nullptr while measuring.
  [[nodiscard]] void* allocate(std::size_t bytes) {
    if (!live_) {
      measured_ = backend::cuda::DeviceArena::align_up(measured_) + bytes;
      return nullptr;
    }
    return arena_.allocate(bytes);
  }

  /// Copies the tensor's bytes as they are to `dst` (which holds t.data.size() bytes).
  void copy_bytes(void* dst, const WeightTensor& t) {
    if (!live_ || t.data.empty()) return;
    require<InvalidArgument>(!t.dummy, "CudaWeightStore::copy_bytes: tensor '", t.name, "' is a dummy weight");
    backend::cuda::check(cudaMemcpyAsync(dst, t.data.data(), t.data.size(), cudaMemcpyHostToDevice, stream()),
                         "CudaWeightStore: copying a weight to the device");
    // The source is the mapped file (pageable): the copy has been taken by the time this returns.
  }

  /// Writes `t` (any dtype the dequantizer knows, or a dummy fill) to `dst` as t.elements() bf16 values.
  void store_bf16(std::uint16_t* dst, const WeightTensor& t) {
    if (!live_) return;
    const std::size_t n = t.elements();
    if (t.dummy) {
      kernels::cuda::fill_dummy_bf16(dst, n, t.dummy->seed, t.dummy->center, t.dummy->spread, stream_,
                                      {static_cast<std::uint64_t>(t.cols()), t.dummy->row0, t.dummy->col0, t.dummy->full_cols});
      return;
    }
    if (t.type == DType::bf16) {
      require<FormatError>(t.data.size() == n * 2, "tensor '", t.name, "': ", t.data.size(), " bytes for ", n,
                           " bf16 values");
      copy_bytes(dst, t);
      return;
    }
    // Stage the file's bytes, decode on the device. The staging buffer only grows, and the copy into it
    // waits for the previous decode (same stream), so one buffer serves every tensor.
    if (staging_.size() < t.data.size()) {
      backend::cuda::check(cudaStreamSynchronize(stream()), "CudaWeightStore: synchronize before regrowing staging");
      staging_ = backend::cuda::DeviceBuffer(t.data.size());
    }
    backend::cuda::check(cudaMemcpyAsync(staging_.data(), t.data.data(), t.data.size(), cudaMemcpyHostToDevice,
                                         stream()),
                         "CudaWeightStore: staging a weight");
    try {
      kernels::cuda::dequantize(t.type, staging_.data(), dst, n, stream_);
    } catch (const InvalidArgument& e) {
      throw FormatError(detail::cat("tensor '", t.name, "' (", name(t.type), ", ", n, " values): ", e.what()));
    }
  }

  /// Writes `t` (a dummy fill or any dtype the dequantizer knows) to `dst` as t.elements() f32 values.
  void store_f32(float* dst, const WeightTensor& t) {
    if (!live_) return;
    const std::size_t n = t.elements();
    if (t.dummy) {
      kernels::cuda::fill_dummy_f32(dst, n, t.dummy->seed, t.dummy->center, t.dummy->spread, stream_,
                                      {static_cast<std::uint64_t>(t.cols()), t.dummy->row0, t.dummy->col0, t.dummy->full_cols});
      return;
    }
    if (staging_.size() < t.data.size()) {
      backend::cuda::check(cudaStreamSynchronize(stream()), "CudaWeightStore: synchronize before regrowing staging");
      staging_ = backend::cuda::DeviceBuffer(t.data.size());
    }
    backend::cuda::check(cudaMemcpyAsync(staging_.data(), t.data.data(), t.data.size(), cudaMemcpyHostToDevice,
                                         stream()),
                         "CudaWeightStore: staging a weight");
    try {
      kernels::cuda::dequantize(t.type, staging_.data(), dst, n, stream_);
    } catch (const InvalidArgument& e) {
      throw FormatError(detail::cat("tensor '", t.name, "' (", name(t.type), ", ", n, " values): ", e.what()));
    }
  }

  /// Device room for `n` f32 values outside the arena, for a Quantizer that decodes a weight before
  /// re-encoding it (Fp8: f32, then e4m3). Reused by the next call: work enqueued on the store's stream
  /// that reads it is ordered before any later write (the buffer only grows, after a synchronization).
  /// nullptr while measuring.
  [[nodiscard]] float* f32_scratch(std::size_t n) {
    if (!live_) return nullptr;
    if (f32_scratch_.size() < n * sizeof(float)) {
      backend::cuda::check(cudaStreamSynchronize(stream()), "CudaWeightStore: synchronize before regrowing scratch");
      f32_scratch_ = backend::cuda::DeviceBuffer(n * sizeof(float));
    }
    return f32_scratch_.as<float>();
  }

  /// Copies `bytes` of host memory (pageable: taken by the time this returns) to `dst`.
  void copy_host(void* dst, const void* src, std::size_t bytes) {
    if (!live_ || bytes == 0) return;
    backend::cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()),
                         "CudaWeightStore: copying host values to the device");
  }

  /// Bytes a measuring pass counted (the capacity the live store needs).
  [[nodiscard]] std::size_t measured_bytes() const noexcept { return measured_; }
  /// Bytes the live arena has handed out.
  [[nodiscard]] std::size_t used_bytes() const noexcept { return arena_.used(); }
  [[nodiscard]] void* stream_handle() const noexcept { return stream_; }

  /// Waits until every copy and kernel the store enqueued has finished (after which the mapped file
  /// and the staging buffer are no longer needed).
  void finish() {
    if (live_) backend::cuda::check(cudaStreamSynchronize(stream()), "CudaWeightStore: finishing the weight upload");
    staging_ = backend::cuda::DeviceBuffer();
    f32_scratch_ = backend::cuda::DeviceBuffer();
  }

  /// The arena, moved out once loading is done (the model owns it from then on).
  [[nodiscard]] backend::cuda::DeviceArena release_arena() noexcept { return std::move(arena_); }

 private:
  [[nodiscard]] cudaStream_t stream() const noexcept { return static_cast<cudaStream_t>(stream_); }

  backend::cuda::DeviceArena arena_;
  backend::cuda::DeviceBuffer staging_, f32_scratch_;
  void* stream_ = nullptr;
  bool live_ = false;
  std::size_t measured_ = 0;
};

}  // namespace infer

#endif  // INFER_HAVE_CUDA
