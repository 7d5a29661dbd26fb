#pragma once
/// What every [cuda] test needs: checked runtime calls, a scoped device allocation, host<->device copies,
/// and random inputs (bf16 values, GGUF blocks with finite scales). Compiled by g++ with <cuda_runtime.h>.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"
#include "support/random_tensor.hpp"
#include "support/test_seed.hpp"

/// REQUIREs that a CUDA runtime call succeeded, showing the call and CUDA's message otherwise.
#define CUDA_REQUIRE(expr)                                                    \
  do {                                                                        \
    const cudaError_t e_ = (expr);                                            \
    INFO(#expr << ": " << cudaGetErrorString(e_));                            \
    REQUIRE(e_ == cudaSuccess);                                               \
  } while (0)

namespace infer::test {

/// A device allocation freed on scope exit (16 bytes for an empty request, so the pointer is valid).
struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(std::size_t bytes) { CUDA_REQUIRE(cudaMalloc(&p, bytes == 0 ? 16 : bytes)); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  template <class T>
  T* as(std::size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p) + byte_offset);
  }
};

template <class T>
void upload(void* dst, const std::vector<T>& v) {
  CUDA_REQUIRE(cudaMemcpy(dst, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T>
void upload(const DeviceMem& dst, const std::vector<T>& v) {
  upload(dst.p, v);
}
template <class T>
std::vector<T> download(const void* src, std::size_t n) {
  std::vector<T> v(n);
  CUDA_REQUIRE(cudaMemcpy(v.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// bf16 bits of N(0, stddev) draws.
inline std::vector<std::uint16_t> random_bf16(std::size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

inline std::vector<float> to_f32(const std::vector<std::uint16_t>& bf16) {
  std::vector<float> f(bf16.size());
  for (std::size_t i = 0; i < bf16.size(); ++i) f[i] = bf16_to_f32(bf16[i]);
  return f;
}


}  // namespace infer::test
