// The switches between a step's fused epilogues and the separate kernels they replace (ops.hpp, StepFusion):
// one process-wide mask, read from the environment once.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "infer/kernels/cuda/ops.hpp"

namespace infer::kernels::cuda {
namespace {

constexpr unsigned kAll = static_cast<unsigned>(StepFusion::merge) | static_cast<unsigned>(StepFusion::rope);

/// INFER_STEP_FUSIONS as a mask: "1" all, "0" or unset none, else the named fusions of a comma-separated list
/// (unknown names are ignored).
unsigned mask_from_env() {
  const char* e = std::getenv("INFER_STEP_FUSIONS");
  if (e == nullptr || *e == '\0') return 0;
  if (std::strcmp(e, "1") == 0) return kAll;
  unsigned mask = 0;
  const std::string list = e;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, end - start);
    if (name == "merge") mask |= static_cast<unsigned>(StepFusion::merge);
    if (name == "rope") mask |= static_cast<unsigned>(StepFusion::rope);
    start = end + 1;
  }
  return mask;
}

/// -1: not yet chosen (take the environment), else the mask.
std::atomic<int> g_mask{-1};

unsigned mask() {
  const int v = g_mask.load(std::memory_order_relaxed);
  if (v >= 0) return static_cast<unsigned>(v);
  static const unsigned env = mask_from_env();
  return env;
}

}  // namespace

bool step_fusion(StepFusion f) { return (mask() & static_cast<unsigned>(f)) != 0; }

bool step_fusions() { return mask() != 0; }

bool set_step_fusions(bool on) {
  const bool previous = step_fusions();
  g_mask.store(on ? static_cast<int>(kAll) : 0, std::memory_order_relaxed);
  return previous;
}

}  // namespace infer::kernels::cuda
