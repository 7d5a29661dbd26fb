// Main for the [cuda] tests: listing works anywhere (ctest discovers the tests on CI's GPU-less
// machine), but running them without a CUDA device exits 77, which ctest reports as "skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "infer/kernels/cpu_ops.hpp"

int main(int argc, char** argv) {
  // Load every kernel module when the context is made, not at a kernel's first launch (CUDA's default
  // since 12.2): the leak test compares the device's free memory after 100 and after 10,000 requests, and
  // a kernel first used after the hundredth (a rarer sampling or GEMV variant) would load its module then,
  // which is not a leak. Before any CUDA call, so that the runtime reads it; a value the user set wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::string_view(argv[i]).starts_with("--list");
  int devices = 0;
  if (!listing && (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)) {
    std::puts("no CUDA device: [cuda] tests skipped");
    return 77;
  }
  // The engine tests' CPU reference (rounding_noise.hpp) is most of the suite's time: say what it runs on.
  if (!listing) std::printf("CPU reference: %s\n", infer::kernels::cpu::blas_info().c_str());
  return Catch::Session().run(argc, argv);
}
