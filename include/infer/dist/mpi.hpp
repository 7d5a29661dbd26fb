#pragma once
/// \file
/// Ranks over MPI (Open MPI from the distribution, launched by `mpirun`): `MpiSession`, MPI's lifetime in a
/// process, and `Mpi`, a Communicator (dist/communicator.hpp) on a duplicate of a parent communicator. Needs
/// <mpi.h> and MPI's library: in this project's build, link `infer::mpi` (present when CMake finds MPI).
///
/// Collectives never hang: each is started non-blocking and polled until it completes or the communicator's
/// timeout passes (a rank died, hangs, or called another collective). By default the rank then prints which
/// rank waited for what, and how long, and calls MPI_Abort, which ends every rank of the job (mpirun reports
/// it). With a timeout handler, the handler gets the message and DistributedError is thrown after it; the
/// collective stays pending, so that communicator must not be used again (tests; a caller that reports before
/// it exits). Polling spins
/// for the first millisecond (a CPU all-reduce of a decode step takes microseconds), then sleeps 100 us between
/// polls, and 1 ms after the first 100 ms (a follower of an idle server waits there), so a rank waiting on a slow
/// one does not burn its core.
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/dist/communicator.hpp"

namespace infer::dist {

/// MPI_Init_thread / MPI_Finalize, once per process (the first MpiSession initializes, its destructor
/// finalizes). MPI_THREAD_SERIALIZED: collectives may come from any one thread at a time (the server's engine
/// thread, a program's main thread). DistributedError when MPI cannot start or gives less thread support.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv) { init(&argc, &argv); }
  /// Without the command line (MPI-2 allows it): for a program that decides after parsing its flags.
  MpiSession() { init(nullptr, nullptr); }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  [[nodiscard]] int world_rank() const noexcept { return world_rank_; }
  [[nodiscard]] int world_size() const noexcept { return world_size_; }
  /// This rank's index among the ranks on its host (which GPU it takes): Open MPI's
  /// OMPI_COMM_WORLD_LOCAL_RANK, else MPI's shared-memory split of the world.
  [[nodiscard]] int local_rank() const {
    if (const char* e = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) return std::atoi(e);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &local);
    int r = 0;
    MPI_Comm_rank(local, &r);
    MPI_Comm_free(&local);
    return r;
  }

 private:
  void init(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        throw DistributedError("MpiSession: MPI_Init_thread failed");
      owner_ = true;
      if (provided < MPI_THREAD_SERIALIZED)
        throw DistributedError(detail::cat("MpiSession: MPI gives thread level ", provided,
                                           ", less than MPI_THREAD_SERIALIZED"));
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  }

  bool owner_ = false;
  int world_rank_ = 0, world_size_ = 1;
};

/// A Communicator over MPI (see the file comment for the timeout).
class Mpi {
 public:
  /// Called with the message when a collective times out, before DistributedError is thrown; without one, the
  /// message is printed and MPI_Abort ends the job.
  using TimeoutHandler = std::function<void(const std::string& message)>;

  /// A group of parent's ranks (duplicated, so its traffic never meets the caller's). MPI must be running
  /// (MpiSession). DistributedError when MPI is not initialized.
  explicit Mpi(MPI_Comm parent = MPI_COMM_WORLD, std::chrono::milliseconds timeout = collective_timeout(),
               TimeoutHandler on_timeout = {})
      : timeout_(timeout), on_timeout_(std::move(on_timeout)) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw DistributedError("Mpi: MPI is not initialized (create an MpiSession first)");
    MPI_Comm_dup(parent, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~Mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  void all_reduce_sum(std::span<float> values) {
    if (size_ == 1 || values.empty()) return;
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size(), "all_reduce_sum"), MPI_FLOAT, MPI_SUM, comm_, &r);
    finish(r, "all_reduce_sum", values.size());
  }
  void all_gather(std::span<const float> mine, std::span<float> all) {
    require<InvalidArgument>(all.size() == mine.size() * static_cast<std::size_t>(size_), "Mpi::all_gather: ",
                             all.size(), " values for ", size_, " ranks of ", mine.size());
    const int n = count_of(mine.size(), "all_gather");
    MPI_Request r;
    MPI_Iallgather(mine.data(), n, MPI_FLOAT, all.data(), n, MPI_FLOAT, comm_, &r);
    finish(r, "all_gather", mine.size());
  }
  void broadcast(std::span<std::byte> bytes, int root) {
    require<InvalidArgument>(root >= 0 && root < size_, "Mpi::broadcast: root ", root, " in a group of ", size_);
    if (size_ == 1 || bytes.empty()) return;
    MPI_Request r;
    MPI_Ibcast(bytes.data(), count_of(bytes.size(), "broadcast"), MPI_BYTE, root, comm_, &r);
    finish(r, "broadcast", bytes.size());
  }
  void barrier() {
    if (size_ == 1) return;
    MPI_Request r;
    MPI_Ibarrier(comm_, &r);
    finish(r, "barrier", 0);
  }
  /// Every rank's `mine` (any length) at `root`, in rank order; the others get an empty list. Not part of the
  /// Communicator concept: a host-side exchange (data-parallel results), not a step's collective.
  std::vector<std::vector<std::byte>> gather_bytes(std::span<const std::byte> mine, int root) {
    require<InvalidArgument>(root >= 0 && root < size_, "Mpi::gather_bytes: root ", root, " in a group of ", size_);
    const int n = count_of(mine.size(), "gather_bytes");
    std::vector<int> sizes(rank_ == root ? static_cast<std::size_t>(size_) : 0);
    MPI_Request r;
    MPI_Igather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm_, &r);
    finish(r, "gather_bytes (sizes)", 1);
    std::vector<int> offsets(sizes.size(), 0);
    std::size_t total = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      offsets[i] = count_of(total, "gather_bytes");
      total += static_cast<std::size_t>(sizes[i]);
    }
    count_of(total, "gather_bytes");
    std::vector<std::byte> all(total);
    MPI_Igatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, root, comm_, &r);
    finish(r, "gather_bytes", mine.size());
    std::vector<std::vector<std::byte>> out;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      out.emplace_back(all.begin() + offsets[i], all.begin() + offsets[i] + sizes[i]);
    return out;
  }

 private:
  static int count_of(std::size_t n, const char* what) {
    require<InvalidArgument>(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()), "Mpi::", what, ": ", n,
                             " elements exceed one MPI call's count");
    return static_cast<int>(n);
  }

  /// Polls r until it completes or the timeout passes (then see the file comment; r is left pending).
  void finish(MPI_Request& r, const char* what, std::size_t n) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto spin_until = start + std::chrono::milliseconds(1);
    const auto patient_after = start + std::chrono::milliseconds(100);
    for (;;) {
      int done = 0;
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (done) return;
      const auto now = Clock::now();
      if (now - start >= timeout_) break;
      if (now >= patient_after) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // an idle server's ranks
      else if (now >= spin_until) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const std::string message =
        detail::cat("infer: rank ", rank_, " of ", size_, ": ", what, n > 0 ? detail::cat(" of ", n) : std::string(),
                    " did not complete within ", static_cast<double>(timeout_.count()) / 1000.0,
                    " s: another rank has stopped, hangs, or called a different collective");
    if (on_timeout_) {
      on_timeout_(message);
      throw DistributedError(message);
    }
    std::fprintf(stderr, "%s; ending the job\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, 3);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  TimeoutHandler on_timeout_;
};
static_assert(Communicator<Mpi>);

}  // namespace infer::dist
