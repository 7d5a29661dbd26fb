// Chained launches (Hopper's programmatic dependent launch) for the kernels of one decode step.
//
// Why: a batch-1 decode step of Llama-3-8B is ~290 dependent kernels of 3-60 µs. With plain stream order
// each kernel's blocks start only after the previous kernel has fully drained, then pay their own launch
// latency. A chained kernel may be launched while its predecessor still runs: its first statement,
// `wait_for_previous_kernel()`, waits until the predecessor has completed and its writes are visible, and
// then lets the next chained kernel start launching (so at most two kernels of the chain are in flight).
// A kernel launched with chained::launch must make that call before it touches memory; a thread that
// returns before it touches nothing. Completion is transitive: the next kernel's wait returns only after
// this one completed, and this one completed only after its own wait, so a chained kernel may read what
// any earlier kernel wrote. A kernel launched plainly after a chained one, or a copy, is ordered as usual;
// so is a chained kernel after a plain kernel or a copy. Stream capture keeps the chaining as programmatic
// edges of the graph. On GPUs before sm_90 the call compiles to nothing and the launch attribute is ignored.
//
// Measured on the H200 (docs/benchmarks.md, "Chained decode kernels"): chaining the norms, RoPE,
// attention, SwiGLU and the GGUF GEMV took SmolLM2-135M's batch-1 step from 0.87 to 0.80 ms of device
// time; chaining the bf16 GEMV as well (its first weight loads issued before the wait) made Llama-3-8B's
// step 5% slower (5.13-5.23 vs 4.91 ms). Chained without loads before the wait, the GEMVs gained ~1%
// (gemv_split.cuh, 2026-12-05), and the FP8 activation quantization is chained too.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace infer::kernels::cuda::chained {

/// A chained kernel's first statement: waits for the previous kernel, then lets the next one launch.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Launches `kernel` on `stream` so that it may start before the stream's previous kernel has finished
/// (the kernel must begin with wait_for_previous_kernel()). Launch errors are left in cudaGetLastError(),
/// as a <<<>>> launch leaves them.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem_bytes, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace infer::kernels::cuda::chained
