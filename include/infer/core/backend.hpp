#pragma once
/// \file
/// Backend tags: the first axis of an `Engine`. A tag carries no state; policies and kernels are
/// specialised on it, so `Engine<cpu, ...>` and `Engine<cuda, ...>` share every host-side policy.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace infer {

namespace kernels::cuda {
class Gemm;
}

/// The reference backend: f32 on the host, OpenBLAS GEMMs. The oracle every CUDA kernel is tested against.
struct cpu {
  static constexpr std::string_view name = "cpu";
};

/// NVIDIA GPUs through the CUDA runtime, cuBLAS and infer's kernels.
struct cuda {
  static constexpr std::string_view name = "cuda";
};

template <class B>
concept Backend = std::same_as<B, cpu> || std::same_as<B, cuda>;

/// What a Quantizer's matmul needs on the GPU besides its operands: the cuBLASLt handle (plans cached
/// per shape), the stream everything of the step is enqueued on, and a bf16 scratch for weights that are
/// dequantized before a GEMM (GGUF blocks at prefill batch sizes). The model owns all three.
struct CudaMatmulContext {
  kernels::cuda::Gemm* gemm = nullptr;
  void* stream = nullptr;               ///< cudaStream_t
  std::uint16_t* scratch = nullptr;     ///< bf16, `scratch_elems` values, device
  std::size_t scratch_elems = 0;
};

class CudaWeightStore;

/// The types a backend's policies exchange: activations a matmul reads and writes (f32 on the host;
/// bf16 bits in device memory on the GPU), the context a matmul runs in, and where loaded weights go.
template <class B>
struct BackendTraits;

template <>
struct BackendTraits<cpu> {
  using activation = float;
  using matmul_context = cpu;  ///< the CPU needs nothing but the tag
  using weight_store = cpu;    ///< weights live in host vectors the Quantizer owns
};

template <>
struct BackendTraits<cuda> {
  using activation = std::uint16_t;  ///< bf16 bits, device memory
  using matmul_context = CudaMatmulContext;
  using weight_store = CudaWeightStore;  ///< one device arena for all weights (backend/weight_store.hpp)
};

}  // namespace infer
