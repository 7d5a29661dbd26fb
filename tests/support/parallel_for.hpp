#pragma once
/// \file
/// A small pool of worker threads for the CPU reference's elementwise passes (Bf16Stages' perturbation):
/// on the GPU machine's 16 cores the reference's GEMMs run threaded in OpenBLAS, and a pass left on one
/// thread between them would cost more than the GEMMs. Workers block on a condition variable between
/// calls (no spinning against OpenBLAS's threads). `parallel_for` splits [0, n) into fixed chunks, so what
/// a chunk computes never depends on how many threads there are.

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace infer::test {

/// The CPUs this process may use: those of its affinity mask, capped by a cgroup v2 CPU quota
/// (/sys/fs/cgroup/cpu.max, "quota period"). A container with a quota of 16 CPUs over a larger host sees all
/// of the host's CPUs; sizing a pool by those would put dozens of threads on 16 CPUs' worth of time.
inline unsigned usable_cpus() {
  cpu_set_t set;
  unsigned n = sched_getaffinity(0, sizeof set, &set) == 0 ? static_cast<unsigned>(CPU_COUNT(&set))
                                                           : std::thread::hardware_concurrency();
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (f >> quota >> period && quota != "max" && period > 0)
    n = std::min<unsigned>(n, static_cast<unsigned>(std::max(1LL, (std::stoll(quota) + period - 1) / period)));
  return std::max(1u, n);
}

class WorkerPool {
 public:
  /// One pool per process, with one worker fewer than the usable CPUs (the caller works too).
  static WorkerPool& instance() {
    static WorkerPool pool(usable_cpus() - 1);
    return pool;
  }

  explicit WorkerPool(unsigned workers) {
    for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Calls body(begin, end) for consecutive chunks of [0, n) of `chunk` elements, spread over the workers
  /// and the caller; returns when every chunk is done. Not reentrant: one call at a time per pool.
  void run(std::size_t n, std::size_t chunk, const std::function<void(std::size_t, std::size_t)>& body) {
    const std::size_t chunks = (n + chunk - 1) / chunk;
    if (chunks <= 1 || threads_.empty()) {
      if (n > 0) body(0, n);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      body_ = &body;
      n_ = n;
      chunk_ = chunk;
      chunks_ = chunks;
      next_.store(0);
      busy_ = threads_.size();
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    body_ = nullptr;
  }

 private:
  void drain() {
    for (std::size_t c; (c = next_.fetch_add(1)) < chunks_;) (*body_)(c * chunk_, std::min(n_, (c + 1) * chunk_));
  }

  void work() {
    std::size_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain();
      std::lock_guard lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t, std::size_t)>* body_ = nullptr;
  std::size_t n_ = 0, chunk_ = 1, chunks_ = 0, busy_ = 0, generation_ = 0;
  std::atomic<std::size_t> next_{0};
  bool stop_ = false;
};

/// body(begin, end) over [0, n) in chunks of `chunk`, on the process's WorkerPool.
inline void parallel_for(std::size_t n, std::size_t chunk, const std::function<void(std::size_t, std::size_t)>& body) {
  WorkerPool::instance().run(n, chunk, body);
}

}  // namespace infer::test
