// Main for the [cuda] tests: listing works anywhere (ctest discovers the tests on CI's GPU-less
// machine), but running them without a CUDA device exits 77, which ctest reports as "skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing |= std::string_view(argv[i]).starts_with("--list");
  int devices = 0;
  if (!listing && (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)) {
    std::puts("no CUDA device: [cuda] tests skipped");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
