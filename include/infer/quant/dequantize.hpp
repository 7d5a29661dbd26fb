#pragma once
/// \file
/// Whole-tensor dequantization to f32 (and, on the GPU, bf16) for every element type GGUF files carry:
/// f32, f16, bf16 and the block formats of quant/gguf_blocks.hpp. The CPU version is the reference
/// the CUDA kernel is tested against, and what `gguf::File::dequantize` uses.
///
/// Both are compiled into infer::kernels (kernels/cpu/dequantize.cpp, kernels/cuda/dequantize.cu);
/// this header needs no CUDA headers, so host-only code can call the GPU entry points.

#include <cstddef>
#include <cstdint>
#include <span>

#include "infer/core/dtype.hpp"

namespace infer::kernels::cpu {

/// Decodes `dst.size()` values of `type` from `src` (raw little-endian bytes, any alignment).
/// InvalidArgument when `dst.size()` is not a whole number of blocks or `src.size()` is not exactly
/// the bytes those values occupy; UnsupportedError for fp8_e4m3 / int8, which carry no scale here.
/// Large tensors are split over a few threads.
void dequantize(DType type, std::span<const std::byte> src, std::span<float> dst);

}  // namespace infer::kernels::cpu

#if defined(INFER_HAVE_CUDA)
namespace infer::kernels::cuda {

/// Enqueues decoding of `elems` values of `type` at `src_device` into `dst_device` on `stream`
/// (a cudaStream_t; nullptr = the legacy default stream). Asynchronous: the caller synchronizes.
/// Results equal `cpu::dequantize` bit for bit. InvalidArgument for null pointers or an `elems`
/// that is not a whole number of blocks; infer::Error with CUDA's message when the launch fails.
void dequantize(DType type, const void* src_device, float* dst_device, std::size_t elems, void* stream);

/// As above, writing bf16 bits (round to nearest even of the f32 result), the layout GEMM tiles use.
void dequantize(DType type, const void* src_device, std::uint16_t* dst_device, std::size_t elems, void* stream);

/// Gathers rows: dst[i][:] = row rows[i] of the [*, cols] GGUF block tensor at `src_device`, in f32, equal to
/// cpu::dequantize of that row bit for bit (an embedding kept in its file's blocks); zeros for a negative row
/// id (a row another tensor-parallel rank holds). Row ids are not checked otherwise (they come from the
/// tokenizer, checked on admission). n ≤ 65,535; UnsupportedError for a type that is not
/// a GGUF block type, InvalidArgument for a bad shape or null pointers.
void dequantize_rows(DType type, const void* src_device, const std::int32_t* rows, std::int64_t n, std::int64_t cols,
                     float* dst_device, void* stream);

}  // namespace infer::kernels::cuda
#endif
