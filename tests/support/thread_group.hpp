#pragma once
// An in-process dist::Group for tests: N threads of one process as the ranks of a group, so the tensor-parallel
// decoder's arithmetic is tested without MPI (tests/dist runs the same over mpirun). Each collective is two or
// three rounds of a barrier around a shared table of the ranks' buffers; sums are taken in rank order, so every
// rank gets the same bits, as MPI's all-reduce gives them.
#include <barrier>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/dist/communicator.hpp"

namespace infer::test {

/// What the ranks of one ThreadGroup share.
class ThreadGroupState {
 public:
  explicit ThreadGroupState(int size) : size_(size), sync_(size), slots_(static_cast<std::size_t>(size)) {}
  [[nodiscard]] int size() const noexcept { return size_; }

 private:
  friend class ThreadGroup;
  int size_;
  std::barrier<> sync_;
  std::vector<std::span<std::byte>> slots_;  ///< each rank's buffer of the collective under way
  std::vector<float> sum_;                   ///< rank 0's all-reduce result, read by all
};

class ThreadGroup final : public dist::Group {
 public:
  ThreadGroup(ThreadGroupState& state, int rank) : s_(state), rank_(rank) {}
  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return s_.size_; }

  void all_reduce_sum(std::span<float> values) override {
    post(std::as_writable_bytes(values));
    if (rank_ == 0) {  // rank 0 adds in rank order; every rank copies the same bits
      s_.sum_.assign(values.size(), 0.0f);
      for (int r = 0; r < s_.size_; ++r) {
        const auto* v = reinterpret_cast<const float*>(s_.slots_[static_cast<std::size_t>(r)].data());
        for (std::size_t i = 0; i < values.size(); ++i) s_.sum_[i] += v[i];
      }
    }
    s_.sync_.arrive_and_wait();
    std::memcpy(values.data(), s_.sum_.data(), values.size_bytes());
    s_.sync_.arrive_and_wait();
  }

  void all_gather(std::span<const float> mine, std::span<float> all) override {
    require<InvalidArgument>(all.size() == mine.size() * static_cast<std::size_t>(s_.size_), "ThreadGroup::all_gather: ",
                             all.size(), " values for ", s_.size_, " ranks of ", mine.size());
    post(std::as_writable_bytes(std::span<float>(const_cast<float*>(mine.data()), mine.size())));
    for (int r = 0; r < s_.size_; ++r)
      std::memcpy(all.data() + static_cast<std::size_t>(r) * mine.size(), s_.slots_[static_cast<std::size_t>(r)].data(),
                  mine.size_bytes());
    s_.sync_.arrive_and_wait();
  }

  void broadcast(std::span<std::byte> bytes, int root) override {
    post(bytes);
    if (rank_ != root) std::memcpy(bytes.data(), s_.slots_[static_cast<std::size_t>(root)].data(), bytes.size());
    s_.sync_.arrive_and_wait();
  }

  void barrier() override { s_.sync_.arrive_and_wait(); }

 private:
  /// Puts this rank's buffer in the table; returns once every rank's is there.
  void post(std::span<std::byte> mine) {
    s_.slots_[static_cast<std::size_t>(rank_)] = mine;
    s_.sync_.arrive_and_wait();
  }
  ThreadGroupState& s_;
  int rank_;
};

/// Runs body(rank, group) on `size` threads, one per rank of one ThreadGroup; rethrows the first rank's exception
/// once every thread has ended (a rank that throws mid-collective leaves the others waiting: bodies that can fail
/// mid-way catch and finish their collectives themselves).
inline void run_ranks(int size, const std::function<void(int, dist::Group&)>& body) {
  ThreadGroupState state(size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      ThreadGroup g(state, r);
      try {
        body(r, g);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace infer::test
