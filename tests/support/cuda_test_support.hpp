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

/// Offsets of the f16 scales within a GGUF block (kept finite and small; random bits would give inf/NaN).
/// IQ4_XS's u16 at offset 2 holds bits of its sub-block scales, where any value is valid.
inline std::vector<std::size_t> scale_offsets(DType t) {
  switch (t) {
    case DType::q8_0:
    case DType::q4_0:
    case DType::q5_0:
    case DType::iq4_nl:
    case DType::iq4_xs: return {0};
    case DType::q4_1:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q6_k: return {208};
    default: return {};
  }
}

/// `elems` values of type `t`: N(0, 2) for f32/f16/bf16; for block types random code bytes with f16
/// scales uniform in ±0.05.
inline std::vector<std::byte> random_tensor(DType t, std::size_t elems, std::mt19937& rng) {
  const DTypeInfo ti = info(t);
  std::vector<std::byte> b(*row_bytes(t, elems));
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::normal_distribution<float> n(0.0f, 2.0f);
  auto put16 = [&](std::size_t at, std::uint16_t h) { std::memcpy(b.data() + at, &h, 2); };
  if (t == DType::f32) {
    for (std::size_t i = 0; i < elems; ++i) {
      const float v = n(rng);
      std::memcpy(b.data() + 4 * i, &v, 4);
    }
  } else if (t == DType::f16) {
    for (std::size_t i = 0; i < elems; ++i) put16(2 * i, f32_to_f16(n(rng)));
  } else if (t == DType::bf16) {
    for (std::size_t i = 0; i < elems; ++i) put16(2 * i, f32_to_bf16(n(rng)));
  } else {
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
    for (std::size_t blk = 0; blk < elems / ti.block_elems; ++blk)
      for (std::size_t off : scale_offsets(t)) put16(blk * ti.block_bytes + off, f32_to_f16(u(rng)));
  }
  return b;
}

}  // namespace infer::test
