// The switch between a step's fused epilogues and the separate kernels they replace
// (ops.hpp, step_fusions). One process-wide value, read from the environment once.
#include <atomic>
#include <cstdlib>

#include "infer/kernels/cuda/ops.hpp"

namespace infer::kernels::cuda {
namespace {

/// -1: not yet chosen (take INFER_STEP_FUSIONS), else 0 or 1.
std::atomic<int> g_fusions{-1};

}  // namespace

bool step_fusions() {
  const int v = g_fusions.load(std::memory_order_relaxed);
  if (v >= 0) return v != 0;
  static const bool env = [] {
    const char* e = std::getenv("INFER_STEP_FUSIONS");
    return e != nullptr && std::atoi(e) != 0;
  }();
  return env;
}

bool set_step_fusions(bool on) {
  const bool previous = step_fusions();
  g_fusions.store(on ? 1 : 0, std::memory_order_relaxed);
  return previous;
}

}  // namespace infer::kernels::cuda
