#pragma once
/// \file
/// `Nccl`: a Communicator (dist/communicator.hpp) over NCCL, for tensor parallelism on the CUDA backend: the
/// collectives run on the communicator's CUDA stream over device memory (a span's data is a device pointer).
/// Needs <nccl.h> and NCCL's library: in this project's build, link `infer::nccl` (present where CMake finds NCCL
/// beside the CUDA toolkit).
///
/// Joining: rank 0 makes an ncclUniqueId and broadcasts it over a host communicator the ranks already share
/// (`Nccl::join(mpi, device, stream)`: any Communicator, Mpi for a job started by mpirun), and every rank joins
/// with its rank and its GPU. Nothing waits forever: the communicator is made non-blocking (ncclConfig_t.blocking
/// = 0), and every wait (joining, a collective's completion) polls NCCL's state and the stream against a timeout
/// (collective_timeout(): INFER_DIST_TIMEOUT_S, default 300 s). Past it, or on an NCCL error, the communicator is aborted
/// (ncclCommAbort) and DistributedError names the rank, the call and the wait; that communicator is not used again.
///
/// The blocking collectives enqueue on the stream and wait for it (what the Communicator concept promises); the
/// `*_async` ones only enqueue, for a decode step whose kernels and collectives go into one CUDA graph. As a
/// DeviceGroup (dist/device_group.hpp: what the CUDA decoder calls) it enqueues on the caller's stream. Before the
/// first multi-GPU run (a separate issue), keep NCCL_NVLS_ENABLE=0 in the ranks' environment.
#if defined(INFER_HAVE_CUDA)

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>

#include "infer/core/error.hpp"
#include "infer/dist/communicator.hpp"
#include "infer/dist/device_group.hpp"

namespace infer::dist {

class Nccl final : public DeviceGroup {
 public:
  /// A new group's id (rank 0 makes it; the others receive it).
  [[nodiscard]] static ncclUniqueId unique_id() {
    ncclUniqueId id;
    check_result(ncclGetUniqueId(&id), "ncclGetUniqueId", -1);
    return id;
  }

  /// Joins the group of `host`'s ranks on `device` (rank and size are host's): rank 0's id is broadcast over host.
  template <Communicator C>
  [[nodiscard]] static Nccl join(C& host, int device, cudaStream_t stream,
                                 std::chrono::milliseconds timeout = collective_timeout()) {
    ncclUniqueId id{};
    if (host.rank() == 0) id = unique_id();
    host.broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
    return Nccl(id, host.rank(), host.size(), device, stream, timeout);
  }

  /// Joins group `id` as `rank` of `size` on `device`; collectives go on `stream` (the caller's, which it keeps).
  Nccl(const ncclUniqueId& id, int rank, int size, int device, cudaStream_t stream,
       std::chrono::milliseconds timeout = collective_timeout())
      : rank_(rank), size_(size), stream_(stream), timeout_(timeout) {
    require<InvalidArgument>(size >= 1 && rank >= 0 && rank < size, "Nccl: rank ", rank, " of a group of ", size);
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaMalloc(&word_, sizeof(float)), "cudaMalloc of the barrier's word");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      cudaFree(word_);
      check_result(r, "ncclCommInitRankConfig", rank);
    }
    try {
      settle("joining the group", 0);
    } catch (...) {
      cudaFree(word_);
      throw;
    }
  }

  Nccl(Nccl&& o) noexcept
      : rank_(o.rank_), size_(o.size_), stream_(o.stream_), timeout_(o.timeout_), comm_(o.comm_), word_(o.word_),
        broken_(o.broken_) {
    o.comm_ = nullptr;
    o.word_ = nullptr;
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  Nccl& operator=(Nccl&&) = delete;

  ~Nccl() {
    if (comm_ != nullptr) {
      if (broken_) ncclCommAbort(comm_);
      else ncclCommDestroy(comm_);
    }
    if (word_ != nullptr) cudaFree(word_);
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  // ---- DeviceGroup: enqueued on the caller's stream, not waited for (the decoder's step; a graph captures them) --
  [[nodiscard]] bool capturable() const noexcept override { return true; }
  void all_reduce_sum(float* data, std::size_t n, void* stream) override {
    if (n > 0)
      enqueue(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, static_cast<cudaStream_t>(stream)),
              "ncclAllReduce", n);
  }
  void all_reduce_sum_bf16(std::uint16_t* data, std::size_t n, void* stream) override {
    if (n > 0)
      enqueue(ncclAllReduce(data, data, n, ncclBfloat16, ncclSum, comm_, static_cast<cudaStream_t>(stream)),
              "ncclAllReduce (bf16)", n);
  }
  void all_gather(const float* mine, float* all, std::size_t n, void* stream) override {
    if (n > 0)
      enqueue(ncclAllGather(mine, all, n, ncclFloat32, comm_, static_cast<cudaStream_t>(stream)), "ncclAllGather", n);
  }

  /// In place, device memory: every rank's values become their sum. Waits for it.
  void all_reduce_sum(std::span<float> values) {
    all_reduce_sum_async(values);
    wait("all_reduce_sum", values.size());
  }
  /// all_reduce_sum enqueued on the stream, not waited for (a graph captures it).
  void all_reduce_sum_async(std::span<float> values) {
    if (values.empty()) return;
    enqueue(ncclAllReduce(values.data(), values.data(), values.size(), ncclFloat32, ncclSum, comm_, stream_),
            "ncclAllReduce", values.size());
  }

  /// `all` (device, size() · mine.size() values) becomes every rank's `mine` in rank order. Waits for it.
  void all_gather(std::span<const float> mine, std::span<float> all) {
    all_gather_async(mine, all);
    wait("all_gather", mine.size());
  }
  void all_gather_async(std::span<const float> mine, std::span<float> all) {
    require<InvalidArgument>(all.size() == mine.size() * static_cast<std::size_t>(size_), "Nccl::all_gather: ",
                             all.size(), " values for ", size_, " ranks of ", mine.size());
    if (mine.empty()) return;
    enqueue(ncclAllGather(mine.data(), all.data(), mine.size(), ncclFloat32, comm_, stream_), "ncclAllGather",
            mine.size());
  }

  /// Every rank's `bytes` (device memory) become root's. Waits for it.
  void broadcast(std::span<std::byte> bytes, int root) {
    require<InvalidArgument>(root >= 0 && root < size_, "Nccl::broadcast: root ", root, " in a group of ", size_);
    if (!bytes.empty())
      enqueue(ncclBroadcast(bytes.data(), bytes.data(), bytes.size(), ncclUint8, root, comm_, stream_), "ncclBroadcast",
              bytes.size());
    wait("broadcast", bytes.size());
  }

  /// Returns once every rank has reached it (an all-reduce of one word).
  void barrier() {
    enqueue(ncclAllReduce(word_, word_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)", 1);
    wait("barrier", 0);
  }

 private:
  static void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw DistributedError(detail::cat("Nccl: ", what, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
  static void check_result(ncclResult_t r, const char* what, int rank) {
    if (r != ncclSuccess && r != ncclInProgress)
      throw DistributedError(detail::cat("Nccl", rank >= 0 ? detail::cat(" rank ", rank) : std::string(), ": ", what,
                                         " failed: ", ncclGetErrorString(r)));
  }

  /// An enqueue call's result: in progress is settled (a non-blocking communicator may return it), errors end it.
  void enqueue(ncclResult_t r, const char* what, std::size_t n) {
    if (r != ncclSuccess && r != ncclInProgress) fail(detail::cat(what, " failed: ", ncclGetErrorString(r)));
    if (r == ncclInProgress) settle(what, n);
  }

  /// Polls the communicator's state until it is not in progress, or the timeout.
  void settle(const char* what, std::size_t n) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) fail(detail::cat(what, ": ncclCommGetAsyncError failed: ", ncclGetErrorString(r)));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(detail::cat(what, " failed: ", ncclGetErrorString(state)));
      pause_or_time_out(start, what, n);
    }
  }

  /// Waits for the stream (the collective and what was enqueued before it), watching NCCL's state.
  void wait(const char* what, std::size_t n) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail(detail::cat(what, ": the stream failed: ", cudaGetErrorName(q)));
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress)
        fail(detail::cat(what, " failed: ", ncclGetErrorString(state)));
      pause_or_time_out(start, what, n);
    }
  }

  /// Spins for the first millisecond (a decode step's all-reduce takes microseconds), then sleeps between polls.
  void pause_or_time_out(std::chrono::steady_clock::time_point start, const char* what, std::size_t n) {
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited > timeout_)
      fail(detail::cat(what, " of ", n, " values did not complete in ",
                       std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(),
                       " ms (a rank died, hangs, or called another collective)"));
    if (waited > std::chrono::milliseconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }

  [[noreturn]] void fail(const std::string& why) {
    broken_ = true;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw DistributedError(detail::cat("Nccl rank ", rank_, " of ", size_, ": ", why));
  }

  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  float* word_ = nullptr;  ///< the barrier's all-reduce word (device)
  bool broken_ = false;
};
static_assert(Communicator<Nccl>);

}  // namespace infer::dist

#endif  // INFER_HAVE_CUDA
