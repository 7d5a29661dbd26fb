#pragma once
// A program's tensor-parallel job (`mpirun -np N PROGRAM --tensor-parallel-size N ...`): MPI started, the world
// as the group the model is split over (ModelSpec::tensor_parallel: each rank loads its shard), every rank running
// the same requests, rank 0 printing; in a server, rank 0 serves and the others follow its engine (control()).
// Without the flag (size 1) it is a job of one and costs nothing; in a build without MPI, a size above 1 is
// refused. On the cuda backend each rank takes its local rank's GPU and the model's collectives go over NCCL
// (attach()), joined through MPI; a build without NCCL refuses it.
#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>

#include "infer/dist/communicator.hpp"
#include "infer/dist/data_parallel.hpp"
#include "infer/engine/engine_registry.hpp"
#if INFER_HAVE_MPI
#include "infer/dist/mpi.hpp"
#endif
#if INFER_HAVE_MPI && INFER_HAVE_NCCL
#include "infer/dist/nccl.hpp"
#endif

namespace infer::programs {

class TensorParallelJob {
 public:
  /// Starts MPI when `size` > 1; `ok()` is false after printing why when it cannot run (no MPI in this build, or
  /// mpirun started another number of ranks).
  TensorParallelJob([[maybe_unused]] const char* program, int size) {
    if (size <= 1) return;
    size_ = size;
#if INFER_HAVE_MPI
    mpi_.emplace();
    (void)dist::select_local_gpu(mpi_->local_rank());  // before anything touches CUDA: rank i on GPU i of its host
    world_.emplace();
    group_.emplace(*world_);
    // A year: a follower of an idle server waits here for the next step without end (see control()).
    control_world_.emplace(MPI_COMM_WORLD, std::chrono::hours(24 * 365));
    control_.emplace(*control_world_);
    rank_ = world_->rank();
    if (world_->size() != size) {
      if (rank_ == 0)
        fmt::print(stderr, "{}: --tensor-parallel-size {} needs as many ranks (mpirun -np {}); this job has {}\n", program,
                   size, size, world_->size());
      ok_ = false;
    }
#else
    fmt::print(stderr, "{}: --tensor-parallel-size needs a build with MPI (scripts/setup.sh installs Open MPI)\n",
               program);
    ok_ = false;
#endif
  }

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// This process's place in the split ({0, 1} for a job of one): which rank's engine file it loads or builds.
  [[nodiscard]] TensorParallel place() const noexcept { return {rank_, size_}; }
  /// The group the model is split over (ModelSpec::tensor_parallel), or null for a job of one.
  [[nodiscard]] dist::Group* group() noexcept {
#if INFER_HAVE_MPI
    if (group_) return &*group_;
#endif
    return nullptr;
  }
  /// The group a server's rank 0 sends its engine calls over (dist/lockstep_engine.hpp): the world again, on a
  /// communicator of its own whose waits do not time out, since the other ranks wait there for as long as the
  /// server is idle. A rank that dies still ends the job (mpirun ends the others); the model's collectives keep
  /// group()'s timeout. Null for a job of one.
  [[nodiscard]] dist::Group* control() noexcept {
#if INFER_HAVE_MPI
    if (control_) return &*control_;
#endif
    return nullptr;
  }

  /// Makes `spec` load this rank's shard: the host group, and on the cuda backend (spec.backend resolved) the
  /// group's collectives over NCCL on this rank's GPU, joined through MPI. Every rank calls it at the same point.
  /// False after printing why when the build has no NCCL and the backend is cuda.
  [[nodiscard]] bool attach([[maybe_unused]] const char* program, ModelSpec& spec) {
    spec.tensor_parallel = group();
    if (spec.tensor_parallel == nullptr || spec.backend != "cuda") return true;
#if INFER_HAVE_MPI && INFER_HAVE_NCCL
    if (!nccl_) nccl_.emplace(dist::Nccl::join(*world_, 0, nullptr));
    spec.tensor_parallel_device = &*nccl_;
    return true;
#else
    if (rank_ == 0)
      fmt::print(stderr, "{}: tensor parallelism on cuda needs a build with NCCL (libnccl beside the CUDA toolkit); "
                         "use --backend cpu\n", program);
    return false;
#endif
  }

  /// "rank R: " in a parallel job, for error messages.
  [[nodiscard]] std::string who() const { return group_active() ? fmt::format("rank {}: ", rank_) : std::string(); }

  /// One seed for the whole job, rank 0's: requests without a seed of their own take seeds derived from it, so
  /// every rank samples the same tokens (a fresh seed per rank would split their schedules).
  [[nodiscard]] std::uint64_t common_seed() {
    std::uint64_t seed = std::random_device{}();
    seed = (seed << 32) ^ std::random_device{}();
    if (dist::Group* g = group()) g->broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&seed, 1)), 0);
    return seed;
  }

  /// The exit code, after ending every rank (the others would wait in a collective for this one).
  int fail(int code) {
#if INFER_HAVE_MPI
    if (group_active()) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    return code;
  }

 private:
  [[nodiscard]] bool group_active() const noexcept {
#if INFER_HAVE_MPI
    return group_.has_value();
#else
    return false;
#endif
  }
#if INFER_HAVE_MPI
  std::optional<dist::MpiSession> mpi_;
  std::optional<dist::Mpi> world_;
  std::optional<dist::GroupOf<dist::Mpi>> group_;
  std::optional<dist::Mpi> control_world_;
  std::optional<dist::GroupOf<dist::Mpi>> control_;
#endif
#if INFER_HAVE_MPI && INFER_HAVE_NCCL
  std::optional<dist::Nccl> nccl_;  ///< the model's collectives on the GPU (cuda backend), after the MPI group
#endif
  bool ok_ = true;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace infer::programs
