#pragma once
/// \file
/// Portability macros shared by host and device code. This header must stay free of CUDA includes so
/// that host-only metadata code can include it; under nvcc the CUDA qualifiers are simply defined.

#if defined(__CUDACC__)
#define INFER_HD __host__ __device__ __forceinline__
#else
#define INFER_HD inline
#endif
