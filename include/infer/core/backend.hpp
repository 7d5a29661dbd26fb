#pragma once
/// \file
/// Backend tags: the first axis of an `Engine`. A tag carries no state; policies and kernels are
/// specialised on it, so `Engine<cpu, ...>` and `Engine<cuda, ...>` share every host-side policy.

#include <concepts>
#include <string_view>

namespace infer {

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

}  // namespace infer
