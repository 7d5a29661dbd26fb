// CUDA dequantization of GGUF tensors to f32 or bf16. One thread per group of 8 output values
// (quant::kGroupSize), calling the same INFER_HD block functions as the CPU reference, so results
// match cpu::dequantize bit for bit. Grid-stride loops keep any tensor size within one launch.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/dequantize.hpp"
#include "infer/quant/gguf_blocks.hpp"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 256;
/// 4096 blocks of 256 threads fill any current GPU several times over; larger tensors grid-stride.
constexpr std::size_t kMaxGrid = 4096;

__device__ __forceinline__ void store_group(float* dst, const float* v, bool vec) {
  if (vec) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    for (int i = 0; i < quant::kGroupSize; ++i) dst[i] = v[i];
  }
}

__device__ __forceinline__ void store_group(std::uint16_t* dst, const float* v, bool vec) {
  std::uint16_t h[quant::kGroupSize];
  for (int i = 0; i < quant::kGroupSize; ++i) h[i] = f32_to_bf16(v[i]);
  if (vec) {
    uint4 p;
    p.x = h[0] | (static_cast<unsigned>(h[1]) << 16);
    p.y = h[2] | (static_cast<unsigned>(h[3]) << 16);
    p.z = h[4] | (static_cast<unsigned>(h[5]) << 16);
    p.w = h[6] | (static_cast<unsigned>(h[7]) << 16);
    *reinterpret_cast<uint4*>(dst) = p;
  } else {
    for (int i = 0; i < quant::kGroupSize; ++i) dst[i] = h[i];
  }
}

__device__ __forceinline__ void store_one(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void store_one(std::uint16_t* dst, float v) { *dst = f32_to_bf16(v); }

/// `vec`: dst is 16-byte aligned, so each group is written with 16-byte stores.
template <class Block, class Out>
__global__ void dequantize_blocks_kernel(const Block* __restrict__ src, Out* __restrict__ dst, std::size_t n_groups,
                                         bool vec) {
  constexpr int groups = quant::BlockTraits<Block>::groups;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_groups; i += stride) {
    float v[quant::kGroupSize];
    quant::dequantize_group(src[i / groups], static_cast<int>(i % groups), v);
    store_group(dst + i * quant::kGroupSize, v, vec);
  }
}

/// out[i][:] = row rows[i] of a [*, cols] block tensor, in f32 (zeros for a negative index): grid.y = the rows,
/// threads over its groups.
template <class Block>
__global__ void dequantize_rows_kernel(const Block* __restrict__ src, const std::int32_t* __restrict__ rows,
                                       std::int64_t cols, float* __restrict__ dst, bool vec) {
  constexpr int groups = quant::BlockTraits<Block>::groups;
  const std::int64_t row_groups = cols / quant::kGroupSize;
  const std::int64_t i = blockIdx.y;
  const bool none = rows[i] < 0;  // a row another tensor-parallel rank holds: zeros
  const Block* row = src + static_cast<std::int64_t>(none ? 0 : rows[i]) * (cols / quant::BlockTraits<Block>::elems);
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < row_groups;
       g += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float v[quant::kGroupSize];
    if (none)
      for (float& x : v) x = 0.0f;
    else
      quant::dequantize_group(row[g / groups], static_cast<int>(g % groups), v);
    store_group(dst + i * cols + g * quant::kGroupSize, v, vec);
  }
}

struct DecodeF32 {
  using In = float;
  __device__ static float decode(float x) { return x; }
};
struct DecodeF16 {
  using In = std::uint16_t;
  __device__ static float decode(std::uint16_t x) { return f16_to_f32(x); }
};
struct DecodeBf16 {
  using In = std::uint16_t;
  __device__ static float decode(std::uint16_t x) { return bf16_to_f32(x); }
};

template <class Decode, class Out>
__global__ void dequantize_plain_kernel(const typename Decode::In* __restrict__ src, Out* __restrict__ dst,
                                        std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_one(dst + i, Decode::decode(src[i]));
}

unsigned grid_for(std::size_t work) {
  const std::size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

template <class Block, class Out>
void launch_blocks(const void* src, Out* dst, std::size_t elems, cudaStream_t stream) {
  const std::size_t n_groups = elems / quant::kGroupSize;
  const bool vec = reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  dequantize_blocks_kernel<Block, Out>
      <<<grid_for(n_groups), kThreads, 0, stream>>>(static_cast<const Block*>(src), dst, n_groups, vec);
}

template <class Block>
void launch_rows(const void* src, const std::int32_t* rows, std::int64_t n, std::int64_t cols, float* dst,
                 cudaStream_t stream) {
  const bool vec = reinterpret_cast<std::uintptr_t>(dst) % 16 == 0 && cols % 4 == 0;
  const dim3 grid(grid_for(static_cast<std::size_t>(cols / quant::kGroupSize)), static_cast<unsigned>(n));
  dequantize_rows_kernel<Block><<<grid, kThreads, 0, stream>>>(static_cast<const Block*>(src), rows, cols, dst, vec);
}

template <class Decode, class Out>
void launch_plain(const void* src, Out* dst, std::size_t elems, cudaStream_t stream) {
  dequantize_plain_kernel<Decode, Out>
      <<<grid_for(elems), kThreads, 0, stream>>>(static_cast<const typename Decode::In*>(src), dst, elems);
}

std::size_t source_alignment(DType type) {
  switch (type) {
    case DType::f32:
    case DType::int32: return 4;
    case DType::int8:
    case DType::fp8_e4m3: return 1;
    default: return 2;  // f16/bf16 and every block (their f16 fields)
  }
}

template <class Out>
void run(DType type, const void* src, Out* dst, std::size_t elems, void* stream_ptr, const char* out_name) {
  const DTypeInfo ti = info(type);
  if (type == DType::fp8_e4m3 || type == DType::int8 || type == DType::int32)
    throw UnsupportedError(detail::cat("cuda::dequantize: type ", ti.name,
                                       " has no scale of its own; dequantize it through its quantizer"));
  if (elems % ti.block_elems != 0)
    throw InvalidArgument(detail::cat("cuda::dequantize(", ti.name, " -> ", out_name, "): ", elems,
                                      " values is not a multiple of the block size ", ti.block_elems));
  if (elems == 0) return;
  if (src == nullptr || dst == nullptr)
    throw InvalidArgument(detail::cat("cuda::dequantize(", ti.name, " -> ", out_name, "): null ",
                                      src == nullptr ? "source" : "destination", " pointer for ", elems, " values"));
  if (reinterpret_cast<std::uintptr_t>(src) % source_alignment(type) != 0)
    throw InvalidArgument(detail::cat("cuda::dequantize(", ti.name, " -> ", out_name, "): source pointer ", src,
                                      " is not ", source_alignment(type), "-byte aligned"));
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (type) {
    case DType::f32: launch_plain<DecodeF32>(src, dst, elems, stream); break;
    case DType::f16: launch_plain<DecodeF16>(src, dst, elems, stream); break;
    case DType::bf16: launch_plain<DecodeBf16>(src, dst, elems, stream); break;
    case DType::q8_0: launch_blocks<quant::BlockQ8_0>(src, dst, elems, stream); break;
    case DType::q4_0: launch_blocks<quant::BlockQ4_0>(src, dst, elems, stream); break;
    case DType::q4_1: launch_blocks<quant::BlockQ4_1>(src, dst, elems, stream); break;
    case DType::q5_0: launch_blocks<quant::BlockQ5_0>(src, dst, elems, stream); break;
    case DType::q5_1: launch_blocks<quant::BlockQ5_1>(src, dst, elems, stream); break;
    case DType::q4_k: launch_blocks<quant::BlockQ4K>(src, dst, elems, stream); break;
    case DType::q5_k: launch_blocks<quant::BlockQ5K>(src, dst, elems, stream); break;
    case DType::q6_k: launch_blocks<quant::BlockQ6K>(src, dst, elems, stream); break;
    case DType::iq4_nl: launch_blocks<quant::BlockIQ4NL>(src, dst, elems, stream); break;
    case DType::iq4_xs: launch_blocks<quant::BlockIQ4XS>(src, dst, elems, stream); break;
    case DType::fp8_e4m3:
    case DType::int8:
    case DType::int32: break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw Error(Errc::invalid_argument,
                detail::cat("cuda::dequantize(", ti.name, " -> ", out_name, ", ", elems,
                            " values): kernel launch failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace

void dequantize(DType type, const void* src_device, float* dst_device, std::size_t elems, void* stream) {
  run(type, src_device, dst_device, elems, stream, "f32");
}

void dequantize(DType type, const void* src_device, std::uint16_t* dst_device, std::size_t elems, void* stream) {
  run(type, src_device, dst_device, elems, stream, "bf16");
}

void dequantize_rows(DType type, const void* src_device, const std::int32_t* rows, std::int64_t n, std::int64_t cols,
                     float* dst_device, void* stream_ptr) {
  const DTypeInfo ti = info(type);
  if (!ti.quantized)
    throw UnsupportedError(detail::cat("cuda::dequantize_rows: type ", ti.name, " is not a GGUF block type"));
  if (n < 0 || n > 65535 || cols < 1 || cols % ti.block_elems != 0)
    throw InvalidArgument(detail::cat("cuda::dequantize_rows(", ti.name, "): bad shape n=", n, " cols=", cols,
                                      " (n at most 65,535; cols a positive multiple of the block size ", ti.block_elems,
                                      ")"));
  if (n == 0) return;
  if (src_device == nullptr || rows == nullptr || dst_device == nullptr)
    throw InvalidArgument(detail::cat("cuda::dequantize_rows(", ti.name, "): null pointer"));
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (type) {
    case DType::q8_0: launch_rows<quant::BlockQ8_0>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q4_0: launch_rows<quant::BlockQ4_0>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q4_1: launch_rows<quant::BlockQ4_1>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q5_0: launch_rows<quant::BlockQ5_0>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q5_1: launch_rows<quant::BlockQ5_1>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q4_k: launch_rows<quant::BlockQ4K>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q5_k: launch_rows<quant::BlockQ5K>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::q6_k: launch_rows<quant::BlockQ6K>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::iq4_nl: launch_rows<quant::BlockIQ4NL>(src_device, rows, n, cols, dst_device, stream); break;
    case DType::iq4_xs: launch_rows<quant::BlockIQ4XS>(src_device, rows, n, cols, dst_device, stream); break;
    default: break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw DeviceError(detail::cat("cuda::dequantize_rows(", ti.name, "): kernel launch failed: ", cudaGetErrorName(err),
                                  ": ", cudaGetErrorString(err)));
}

}  // namespace infer::kernels::cuda
