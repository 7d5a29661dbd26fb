#pragma once
/// \file
/// Communicators: how the ranks of a tensor-parallel group, or data-parallel replicas, exchange data. A
/// policy like the engine's others: what takes one takes it as a template parameter, so one process
/// (`SingleRank`) compiles to what it was before, with no calls at all. `Mpi` (dist/mpi.hpp) runs ranks over
/// MPI: the CPU backend's, and the channel a GPU communicator's setup goes through.
///
/// Every rank of a group must make the same calls in the same order with the same sizes (as MPI's and NCCL's
/// collectives require); a call that cannot complete in time (a rank died or hangs) ends in the
/// communicator's timeout, never in a hang.
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "infer/core/error.hpp"

namespace infer::dist {

/// How long a collective may wait before the communicators that poll (Mpi, Nccl) end it: INFER_DIST_TIMEOUT_S
/// (seconds) when set, else 300 s (a rank loading an 8B model while the others wait at a barrier is slow, but not
/// that slow).
[[nodiscard]] inline std::chrono::milliseconds collective_timeout() {
  if (const char* e = std::getenv("INFER_DIST_TIMEOUT_S")) {
    const double s = std::atof(e);
    if (s > 0) return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000.0));
  }
  return std::chrono::seconds(300);
}

/// What a communicator offers: its place in the group and four collectives, all blocking.
/// - `all_reduce_sum(data)`: every rank's `data` becomes the element-wise sum over the ranks (in place);
/// - `all_gather(mine, all)`: `all` (size() · mine.size() values) becomes every rank's `mine`, in rank order;
/// - `broadcast(bytes, root)`: every rank's `bytes` becomes root's;
/// - `barrier()`: returns once every rank has called it.
template <class C>
concept Communicator = requires(C& c, const C& cc, std::span<float> values, std::span<const float> mine,
                                std::span<std::byte> bytes, int root) {
  { cc.rank() } -> std::same_as<int>;
  { cc.size() } -> std::same_as<int>;
  c.all_reduce_sum(values);
  c.all_gather(mine, values);
  c.broadcast(bytes, root);
  c.barrier();
};

/// A group of one: every collective is the identity, and costs nothing (TP = 1, DP = 1).
class SingleRank {
 public:
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  void all_reduce_sum(std::span<float>) noexcept {}
  void all_gather(std::span<const float> mine, std::span<float> all) const {
    require<InvalidArgument>(all.size() == mine.size(), "SingleRank::all_gather: ", all.size(),
                             " values for 1 rank of ", mine.size());
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  void broadcast(std::span<std::byte>, int root) const {
    require<InvalidArgument>(root == 0, "SingleRank::broadcast: root ", root, " in a group of 1");
  }
  void barrier() noexcept {}
};
static_assert(Communicator<SingleRank>);

/// Any Communicator behind a virtual interface: what code compiled once for every group takes (the decoder's
/// tensor-parallel collectives: the engines are compiled in kernels/, which does not link MPI, and a program
/// hands them its Mpi as a Group). A call through it costs a virtual call next to a collective.
class Group {
 public:
  virtual ~Group() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  virtual void all_reduce_sum(std::span<float> values) = 0;
  virtual void all_gather(std::span<const float> mine, std::span<float> all) = 0;
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  virtual void barrier() = 0;
};
static_assert(Communicator<Group>);

/// A Group over a Communicator the caller keeps alive (`GroupOf<Mpi> group(mpi)`).
template <Communicator C>
class GroupOf final : public Group {
 public:
  explicit GroupOf(C& c) noexcept : c_(c) {}
  [[nodiscard]] int rank() const override { return c_.rank(); }
  [[nodiscard]] int size() const override { return c_.size(); }
  void all_reduce_sum(std::span<float> values) override { c_.all_reduce_sum(values); }
  void all_gather(std::span<const float> mine, std::span<float> all) override { c_.all_gather(mine, all); }
  void broadcast(std::span<std::byte> bytes, int root) override { c_.broadcast(bytes, root); }
  void barrier() override { c_.barrier(); }

 private:
  C& c_;
};

}  // namespace infer::dist
