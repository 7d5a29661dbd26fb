#pragma once
// A program's data-parallel job (`mpirun -np N PROGRAM --data-parallel ...`): MPI started before anything
// touches CUDA, each rank on its local GPU, its share of the items, its results carried to rank 0 as JSON, and
// an error on a rank ending the whole job. Without --data-parallel (or in a build without MPI, where the flag
// is refused) it is a job of one rank and costs nothing. Used by infer-generate and infer-offline-batch.
#include <fmt/core.h>

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "infer/dist/data_parallel.hpp"
#if INFER_HAVE_MPI
#include "infer/dist/mpi.hpp"
#endif

namespace infer::programs {

class DataParallelJob {
 public:
  /// Starts MPI when `on`; in a build without MPI, `ok()` is false after printing why.
  DataParallelJob([[maybe_unused]] const char* program, bool on) {
    if (!on) return;
#if INFER_HAVE_MPI
    mpi_.emplace();
    world_.emplace();
    dist::select_local_gpu(mpi_->local_rank());
    rank_ = world_->rank();
    ranks_ = world_->size();
#else
    fmt::print(stderr, "{}: --data-parallel needs a build with MPI (scripts/setup.sh installs Open MPI)\n", program);
    ok_ = false;
#endif
  }

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int ranks() const noexcept { return ranks_; }
  [[nodiscard]] bool parallel() const noexcept { return ranks_ > 1; }
  /// This rank's items of n (all of them in a job of one).
  [[nodiscard]] dist::ItemRange share(std::size_t n) const noexcept { return dist::split_evenly(n, rank_, ranks_); }
  /// "rank R: " in a parallel job, for error messages.
  [[nodiscard]] std::string who() const { return parallel() ? fmt::format("rank {}: ", rank_) : std::string(); }

  /// Every rank's `mine` at rank 0, in rank order (empty elsewhere); {mine} in a job of one.
  std::vector<nlohmann::json> gather(const nlohmann::json& mine) {
    if (!parallel()) return {mine};
    std::vector<nlohmann::json> all;
#if INFER_HAVE_MPI
    const std::string text = mine.dump();
    for (const auto& bytes : world_->gather_bytes(std::as_bytes(std::span(text.data(), text.size())), 0))
      all.push_back(nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
#endif
    return all;
  }

  /// The exit code, after ending every rank of a parallel job (the others would wait for this one's results).
  int fail(int code) {
#if INFER_HAVE_MPI
    if (parallel()) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    return code;
  }

 private:
#if INFER_HAVE_MPI
  std::optional<dist::MpiSession> mpi_;
  std::optional<dist::Mpi> world_;
#endif
  bool ok_ = true;
  int rank_ = 0, ranks_ = 1;
};

}  // namespace infer::programs
