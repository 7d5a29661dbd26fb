#pragma once
/// \file
/// `upload_staged`: gigabytes of host memory that is not pinned (an engine file's mapped weights) copied to
/// the device at the pace of the slower side. A plain cudaMemcpy from pageable memory runs one thread that
/// takes every page fault of the mapping in turn, then copies through the driver's small staging buffer;
/// here the bytes go through two large pinned buffers, each filled by several threads (so the mapping's
/// page faults and the reads behind them run in parallel) while the other one is on its way to the device.

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "infer/backend/cuda_runtime.hpp"

namespace infer::backend::cuda {

/// Copies `src` to `dst` (device, src.size() bytes) through pinned chunks of `chunk_bytes`, enqueued on
/// `stream`; returns once the device holds every byte. `threads` 0: one per core, at most 8.
inline void upload_staged(void* dst, std::span<const std::byte> src, void* stream,
                          std::size_t chunk_bytes = std::size_t{128} << 20, unsigned threads = 0) {
  if (src.empty()) return;
  auto* s = static_cast<cudaStream_t>(stream);
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  chunk_bytes = std::min(chunk_bytes, src.size());
  PinnedBuffer staging[2] = {PinnedBuffer(chunk_bytes), PinnedBuffer(src.size() > chunk_bytes ? chunk_bytes : 0)};
  struct Events {
    cudaEvent_t e[2] = {nullptr, nullptr};
    Events() {
      for (auto& x : e) check(cudaEventCreateWithFlags(&x, cudaEventDisableTiming), "upload_staged: creating an event");
    }
    ~Events() {
      for (auto x : e)
        if (x) (void)cudaEventDestroy(x);
    }
  } done;
  // The filling threads work on one chunk at a time, each on its own slice: page faults of a mapped file
  // are taken per thread, and a slice of 16 MiB per thread keeps each one's reads sequential.
  const auto fill = [threads](std::byte* to, const std::byte* from, std::size_t n) {
    const std::size_t per = std::max<std::size_t>((n + threads - 1) / threads, std::size_t{1} << 20);
    std::vector<std::jthread> pool;
    for (std::size_t at = per; at < n; at += per)
      pool.emplace_back([=] { std::memcpy(to + at, from + at, std::min(per, n - at)); });
    std::memcpy(to, from, std::min(per, n));
  };
  auto* out = static_cast<std::byte*>(dst);
  std::size_t k = 0;
  for (std::size_t at = 0; at < src.size(); at += chunk_bytes, ++k) {
    const std::size_t n = std::min(chunk_bytes, src.size() - at);
    PinnedBuffer& buf = staging[k % 2];
    if (k >= 2) check(cudaEventSynchronize(done.e[k % 2]), "upload_staged: waiting for a staging buffer");
    fill(static_cast<std::byte*>(buf.data()), src.data() + at, n);
    check(cudaMemcpyAsync(out + at, buf.data(), n, cudaMemcpyHostToDevice, s), "upload_staged: copying a chunk");
    check(cudaEventRecord(done.e[k % 2], s), "upload_staged: recording a chunk's copy");
  }
  check(cudaStreamSynchronize(s), "upload_staged: finishing the upload");
}

}  // namespace infer::backend::cuda

#endif  // INFER_HAVE_CUDA
