#pragma once
/// \file
/// Data parallelism's bookkeeping, shared by the programs that run one engine per rank (`mpirun -np N
/// infer-generate --data-parallel`): which items a rank takes, and which GPU. No MPI here: the ranks'
/// exchange is dist/mpi.hpp's.
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

namespace infer::dist {

/// Items [begin, end) of `n` that rank `rank` of `ranks` takes: contiguous chunks, the first n % ranks
/// ranks one item more (the classic batch job's split of a prompt list, so gathering in rank order is
/// prompt order).
struct ItemRange {
  std::size_t begin = 0, end = 0;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
};
[[nodiscard]] inline ItemRange split_evenly(std::size_t n, int rank, int ranks) noexcept {
  const auto r = static_cast<std::size_t>(rank), k = static_cast<std::size_t>(ranks);
  const std::size_t base = n / k, extra = n % k;
  const std::size_t begin = r * base + (r < extra ? r : extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

/// Makes this process see one GPU, the local rank's: CUDA_VISIBLE_DEVICES becomes the local rank's entry of
/// its list (or the local rank itself when unset), modulo the list's length. Call before anything touches
/// CUDA. Returns the device it chose, as CUDA_VISIBLE_DEVICES now says.
inline std::string select_local_gpu(int local_rank) {
  std::vector<std::string> devices;
  if (const char* e = std::getenv("CUDA_VISIBLE_DEVICES"); e != nullptr && *e != '\0') {
    std::string list = e;
    std::size_t at = 0;
    while (at <= list.size()) {
      const std::size_t comma = list.find(',', at);
      devices.push_back(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  const std::string chosen = devices.empty()
                                 ? std::to_string(local_rank)
                                 : devices[static_cast<std::size_t>(local_rank) % devices.size()];
  setenv("CUDA_VISIBLE_DEVICES", chosen.c_str(), 1);
  return chosen;
}

}  // namespace infer::dist
