#pragma once
/// \file
/// The CUDA backend's own runtime layer: error checks, RAII device memory, streams, event timers, the
/// weight arena and the KV-pool sizing rule. This is the one header of the backend that includes
/// <cuda_runtime.h>; host metadata code (allocators, schedulers, block tables) never includes it, and
/// kernel entry points (include/infer/kernels/cuda/) take plain `void*` streams instead.
///
/// Everything here is inline host code and nvcc-safe (messages through `detail::cat`, never fmt), so
/// .cu files and g++-compiled tests can both include it. Without INFER_HAVE_CUDA the header is empty.
///
/// Namespace `infer::backend::cuda`: `infer::cuda` is the backend tag (core/backend.hpp), and a
/// namespace of that name cannot coexist with it.

#if defined(INFER_HAVE_CUDA)

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "infer/core/error.hpp"

namespace infer::backend::cuda {

/// Throws DeviceError "<what>: <cudaErrorName>: <description>" unless `err` is cudaSuccess.
/// `what` names the operation ("cudaMalloc of the KV pool", "add_rmsnorm launch"), so the message says
/// both what failed and why.
inline void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw DeviceError(detail::cat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

/// CUDA devices this process can use; 0 when there are none or the driver cannot say (no GPU, no driver).
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: leave no error behind for the next check
    return 0;
  }
  return n;
}

/// What a kernel or a query needs to do or know once per device, kept per device (the first 64; past them
/// nothing is kept and the work is redone at every call). A function-local `static PerDevice` per use.
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;

  /// compute(dev) for the current device (a non-zero int), asked once per device and kept; `no_device` where
  /// there is no current device.
  template <class Compute>
  int value(Compute compute, int no_device) noexcept {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return no_device;
    }
    const bool kept = dev >= 0 && dev < kMaxDevices;
    if (kept) {
      if (const int v = slots_[static_cast<std::size_t>(dev)].load(std::memory_order_acquire); v != 0) return v;
    }
    const int v = compute(dev);
    if (kept) slots_[static_cast<std::size_t>(dev)].store(v, std::memory_order_release);
    return v;
  }

  /// prepare() (a cudaError_t: raising a kernel's shared memory, say) on the current device until it succeeds once.
  template <class Prepare>
  cudaError_t once(Prepare prepare) {
    int dev = 0;
    if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    const bool kept = dev >= 0 && dev < kMaxDevices;
    if (kept && slots_[static_cast<std::size_t>(dev)].load(std::memory_order_acquire) != 0) return cudaSuccess;
    if (cudaError_t e = prepare(); e != cudaSuccess) return e;
    if (kept) slots_[static_cast<std::size_t>(dev)].store(1, std::memory_order_release);
    return cudaSuccess;
  }

 private:
  std::atomic<int> slots_[kMaxDevices] = {};  // 0: not yet
};

/// The current device's streaming multiprocessors (kernels size their grids by it), asked once per device and
/// kept; 132 (an H100's or H200's) when the driver cannot say.
inline int sm_count() noexcept {
  static PerDevice memo;
  return memo.value(
      [](int dev) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
          (void)cudaGetLastError();
          n = 132;
        }
        return n;
      },
      132);
}

/// The current device's architecture as nvcc names it ("sm_90" for an H100 or H200).
inline std::string device_architecture() {
  int device = 0, major = 0, minor = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "reading the compute capability");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "reading the compute capability");
  return detail::cat("sm_", major, minor);
}

/// Free and total memory of the current device, in bytes (cudaMemGetInfo).
struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

inline MemoryInfo memory_info() {
  MemoryInfo m;
  check(cudaMemGetInfo(&m.free, &m.total), "cudaMemGetInfo");
  return m;
}

/// Bytes the KV pool may take: `gpu_memory_utilization * total - bytes_in_use`, vLLM's meaning of the
/// flag — the fraction of the *whole* device this engine may occupy, weights and workspace
/// (`bytes_in_use`) included. `total` is passed explicitly here so the arithmetic is testable; the
/// overload below reads it from the device. InvalidArgument for a utilization outside (0, 1] (NaN
/// included), and when the budget does not even cover what is already in use.
inline std::size_t kv_pool_bytes(double gpu_memory_utilization, std::size_t bytes_in_use, std::size_t total) {
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
    throw InvalidArgument(detail::cat("gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization));
  const double budget = std::floor(gpu_memory_utilization * static_cast<double>(total));
  const auto budget_bytes = static_cast<std::size_t>(budget);
  if (budget_bytes < bytes_in_use)
    throw InvalidArgument(detail::cat("gpu_memory_utilization ", gpu_memory_utilization, " allows ", budget_bytes,
                                      " bytes of the device's ", total, ", but ", bytes_in_use,
                                      " bytes are already in use (weights and workspace), leaving nothing for the "
                                      "KV cache; raise gpu_memory_utilization or use a smaller model"));
  return budget_bytes - bytes_in_use;
}

/// As above, with `total` read from the current device.
inline std::size_t kv_pool_bytes(double gpu_memory_utilization, std::size_t bytes_in_use) {
  return kv_pool_bytes(gpu_memory_utilization, bytes_in_use, memory_info().total);
}

/// Allocations infer holds right now through DeviceBuffer and PinnedBuffer, counted as they are made and
/// freed. The device's free memory moves in 2 MiB granules and also follows the driver's own reservations;
/// these counts move by the byte and only with infer's buffers, so a test can demand they come back exactly.
struct LiveAllocations {
  std::int64_t device_buffers = 0, device_bytes = 0, pinned_buffers = 0, pinned_bytes = 0;
  friend bool operator==(const LiveAllocations&, const LiveAllocations&) = default;
};

/// The counters behind live_allocations(); DeviceBuffer and PinnedBuffer add and remove themselves.
class AllocationCounters {
 public:
  static void device(std::size_t bytes, int sign) noexcept { add(get().device_buffers, get().device_bytes, bytes, sign); }
  static void pinned(std::size_t bytes, int sign) noexcept { add(get().pinned_buffers, get().pinned_bytes, bytes, sign); }
  static LiveAllocations read() noexcept {
    const Counts& c = get();
    return {c.device_buffers.load(), c.device_bytes.load(), c.pinned_buffers.load(), c.pinned_bytes.load()};
  }

 private:
  struct Counts {
    std::atomic<std::int64_t> device_buffers{0}, device_bytes{0}, pinned_buffers{0}, pinned_bytes{0};
  };
  static Counts& get() noexcept {
    static Counts c;
    return c;
  }
  static void add(std::atomic<std::int64_t>& buffers, std::atomic<std::int64_t>& bytes, std::size_t n, int sign) noexcept {
    buffers.fetch_add(sign, std::memory_order_relaxed);
    bytes.fetch_add(sign * static_cast<std::int64_t>(n), std::memory_order_relaxed);
  }
};

inline LiveAllocations live_allocations() noexcept { return AllocationCounters::read(); }

/// Owns one cudaMalloc allocation. Move-only; a moved-from or default buffer is empty (data() null).
/// upload/download are synchronous copies from/to host memory of the same byte count or less.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;

  /// Allocates `bytes` (none for 0). Out of memory → DeviceError naming the bytes asked for and the
  /// bytes free on the device, so a user can tell a too-large request from a full device.
  explicit DeviceBuffer(std::size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    const cudaError_t err = cudaMalloc(&data_, bytes);
    if (err == cudaSuccess) {
      AllocationCounters::device(size_, +1);
      return;
    }
    data_ = nullptr;
    size_ = 0;
    (void)cudaGetLastError();  // clear the (non-sticky) allocation error so later checks see only their own
    std::size_t free = 0, total = 0;
    const bool have_info = cudaMemGetInfo(&free, &total) == cudaSuccess;
    if (err == cudaErrorMemoryAllocation)
      throw DeviceError(detail::cat("cudaMalloc of ", bytes, " bytes (", static_cast<double>(bytes) / (1u << 30),
                                    " GiB) failed: out of memory; ",
                                    have_info ? detail::cat("the device has ", free, " bytes free of ", total)
                                              : std::string("the device's free memory is unknown")));
    check(err, detail::cat("cudaMalloc of ", bytes, " bytes").c_str());
  }

  ~DeviceBuffer() { release(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] void* data() const noexcept { return data_; }
  /// The allocation viewed as T (cudaMalloc aligns to at least 256 bytes).
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(data_);
  }

  /// Copies `host` to the start of the buffer (plus `offset_bytes`). InvalidArgument when it does not fit.
  template <class T>
  void upload(std::span<const T> host, std::size_t offset_bytes = 0) {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::size_t bytes = host.size_bytes();
    require_fits("upload", bytes, offset_bytes);
    if (bytes == 0) return;
    check(cudaMemcpy(static_cast<std::byte*>(data_) + offset_bytes, host.data(), bytes, cudaMemcpyHostToDevice),
          "DeviceBuffer::upload (cudaMemcpy host to device)");
  }
  template <class T>
  void upload(std::span<T> host, std::size_t offset_bytes = 0) {
    upload(std::span<const T>(host), offset_bytes);
  }

  /// Copies the first `host.size_bytes()` bytes (from `offset_bytes`) into `host`.
  template <class T>
  void download(std::span<T> host, std::size_t offset_bytes = 0) const {
    static_assert(std::is_trivially_copyable_v<T> && !std::is_const_v<T>);
    const std::size_t bytes = host.size_bytes();
    require_fits("download", bytes, offset_bytes);
    if (bytes == 0) return;
    check(cudaMemcpy(host.data(), static_cast<const std::byte*>(data_) + offset_bytes, bytes, cudaMemcpyDeviceToHost),
          "DeviceBuffer::download (cudaMemcpy device to host)");
  }

  /// Sets every byte to `value` (0xff poisons f32 and bf16 alike with NaN). Synchronous.
  void fill_bytes(unsigned char value) {
    if (size_ == 0) return;
    check(cudaMemset(data_, value, size_), "DeviceBuffer::fill_bytes (cudaMemset)");
    check(cudaDeviceSynchronize(), "DeviceBuffer::fill_bytes (synchronize)");
  }

 private:
  void require_fits(const char* op, std::size_t bytes, std::size_t offset) const {
    if (offset > size_ || bytes > size_ - offset)
      throw InvalidArgument(detail::cat("DeviceBuffer::", op, " of ", bytes, " bytes at offset ", offset,
                                        " does not fit the buffer's ", size_, " bytes"));
  }
  void release() noexcept {
    if (data_ != nullptr) {
      (void)cudaFree(data_);  // errors here would be from earlier work; never throw
      AllocationCounters::device(size_, -1);
    }
    data_ = nullptr;
    size_ = 0;
  }

  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Owns a cudaStream_t (default flags: it synchronizes with the legacy default stream, so plain
/// cudaMemcpy calls stay ordered with work on it). `handle()` is what kernel entry points take.
class Stream {
 public:
  Stream() { check(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  ~Stream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }

  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  [[nodiscard]] void* handle() const noexcept { return static_cast<void*>(stream_); }
  void synchronize() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

/// Times work on a stream with two CUDA events: start(), enqueue work, stop(), then elapsed_ms()
/// (which waits for the stop event).
class EventTimer {
 public:
  EventTimer() {
    check(cudaEventCreate(&start_), "cudaEventCreate (timer start)");
    const cudaError_t err = cudaEventCreate(&stop_);
    if (err != cudaSuccess) {
      (void)cudaEventDestroy(start_);
      check(err, "cudaEventCreate (timer stop)");
    }
  }
  ~EventTimer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void start(void* stream = nullptr) { check(cudaEventRecord(start_, static_cast<cudaStream_t>(stream)), "cudaEventRecord (timer start)"); }
  void stop(void* stream = nullptr) { check(cudaEventRecord(stop_, static_cast<cudaStream_t>(stream)), "cudaEventRecord (timer stop)"); }
  /// Milliseconds between start() and stop(); blocks until the stop event has completed.
  [[nodiscard]] float elapsed_ms() const {
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize (timer stop)");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

/// Page-locked host memory (cudaMallocHost): the staging area of a step's metadata and results, so
/// cudaMemcpyAsync to and from it is a real asynchronous DMA (pageable memory would be copied twice).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    check(cudaMallocHost(&data_, bytes), detail::cat("cudaMallocHost of ", bytes, " bytes").c_str());
    AllocationCounters::pinned(size_, +1);
  }
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] void* data() const noexcept { return data_; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    (void)cudaFreeHost(data_);
    AllocationCounters::pinned(size_, -1);
    data_ = nullptr;
  }

  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// An instantiated CUDA graph: work captured once from a stream (begin_capture / end_capture), then
/// replayed with one launch. The captured kernels read their inputs from fixed device addresses, so a
/// replay only needs those buffers refreshed first.
class Graph {
 public:
  Graph() = default;
  ~Graph() { reset(); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      reset();
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }

  /// Starts capturing `stream` (thread-local mode: other threads' CUDA calls are not affected).
  static void begin_capture(void* stream) {
    check(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
  }
  /// Ends the capture started on `stream`, instantiates it and uploads it to the device. On failure the
  /// capture is still ended. Uploading here, not at the first replay, keeps the graph's device memory
  /// and the upload's latency out of serving: a bucket first replayed after hours would otherwise take
  /// both then.
  static Graph end_capture(void* stream) {
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph), "cudaStreamEndCapture");
    Graph g;
    const cudaError_t err = cudaGraphInstantiate(&g.exec_, graph, 0);
    (void)cudaGraphDestroy(graph);
    check(err, "cudaGraphInstantiate");
    check(cudaGraphUpload(g.exec_, static_cast<cudaStream_t>(stream)), "cudaGraphUpload");
    return g;
  }
  /// Abandons a capture after an exception inside it (so the stream is usable again).
  static void abort_capture(void* stream) noexcept {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }

  void launch(void* stream) const { check(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream)), "cudaGraphLaunch"); }
  [[nodiscard]] explicit operator bool() const noexcept { return exec_ != nullptr; }

 private:
  void reset() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }
  cudaGraphExec_t exec_ = nullptr;
};

/// One cudaMalloc for all weights, handed out by bumping an offset: no per-tensor allocation, no
/// fragmentation, one free at the end. Every allocation starts on a 256-byte boundary (what cudaMalloc
/// itself guarantees, and more than any vector load needs). Not thread-safe; allocate at load time.
class DeviceArena {
 public:
  static constexpr std::size_t kAlignment = 256;

  DeviceArena() = default;
  explicit DeviceArena(std::size_t capacity_bytes) : buffer_(capacity_bytes) {}

  /// `bytes` of arena memory, 256-byte aligned. DeviceError naming the capacity when it does not fit.
  [[nodiscard]] void* allocate(std::size_t bytes) {
    const std::size_t start = align_up(used_);
    if (start > buffer_.size() || bytes > buffer_.size() - start)
      throw DeviceError(detail::cat("DeviceArena: allocating ", bytes, " bytes (at aligned offset ", start,
                                    ") exceeds the arena's capacity of ", buffer_.size(), " bytes (", used_,
                                    " used, ", buffer_.size() - (used_ < buffer_.size() ? used_ : buffer_.size()),
                                    " left); size the arena from the model's weight bytes"));
    used_ = start + bytes;
    return static_cast<std::byte*>(buffer_.data()) + start;
  }

  /// `count` values of T.
  template <class T>
  [[nodiscard]] T* allocate(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw DeviceError(detail::cat("DeviceArena: ", count, " values of ", sizeof(T), " bytes overflow size_t"));
    return static_cast<T*>(allocate(count * sizeof(T)));
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return buffer_.size(); }
  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  [[nodiscard]] void* base() const noexcept { return buffer_.data(); }
  /// Forgets every allocation (the memory stays allocated).
  void reset() noexcept { used_ = 0; }

  /// Rounds up to the arena's alignment (saturating, so a huge `n` fails the capacity check, not wraps).
  [[nodiscard]] static constexpr std::size_t align_up(std::size_t n) noexcept {
    if (n > std::numeric_limits<std::size_t>::max() - (kAlignment - 1)) return std::numeric_limits<std::size_t>::max();
    return (n + kAlignment - 1) / kAlignment * kAlignment;
  }

 private:
  DeviceBuffer buffer_;
  std::size_t used_ = 0;
};

}  // namespace infer::backend::cuda

#endif  // INFER_HAVE_CUDA
