// CPU reference dequantization: the oracle for the CUDA kernel and the path gguf::File::dequantize
// takes. Plain per-block loops over the shared INFER_HD functions of quant/gguf_blocks.hpp.
#include "infer/quant/dequantize.hpp"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/quant/gguf_blocks.hpp"

namespace infer::kernels::cpu {
namespace {

/// Below this many values one thread is faster than starting more (a 28M-value embedding takes
/// ~40 ms on one core; splitting only pays off well above a few million values).
constexpr std::size_t kParallelThreshold = std::size_t{1} << 22;
constexpr std::size_t kMaxThreads = 16;

/// Runs fn(begin, end) over [0, n) in up to `threads` contiguous chunks; chunk 0 on this thread.
/// If the system refuses a thread, that chunk runs inline: the result never depends on threading.
template <class Fn>
void parallel_chunks(std::size_t n, std::size_t threads, Fn fn) {
  threads = std::max<std::size_t>(1, std::min(threads, n));
  const std::size_t per = (n + threads - 1) / threads;
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (std::size_t t = 1; t < threads; ++t) {
    const std::size_t b = t * per, e = std::min(n, b + per);
    if (b >= e) break;
    try {
      workers.emplace_back(fn, b, e);
    } catch (const std::system_error&) {
      fn(b, e);
    }
  }
  fn(std::size_t{0}, std::min(n, per));
  for (auto& w : workers) w.join();
}

std::size_t thread_count(std::size_t values) {
  if (values < kParallelThreshold) return 1;
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::min({hw, kMaxThreads, values / (kParallelThreshold / 4)});
}

template <class Block>
void dequantize_blocks(const std::byte* src, float* dst, std::size_t n_blocks) {
  constexpr std::size_t elems = quant::BlockTraits<Block>::elems;
  parallel_chunks(n_blocks, thread_count(n_blocks * elems), [=](std::size_t b0, std::size_t b1) {
    for (std::size_t i = b0; i < b1; ++i) {
      Block blk;  // copied out: src has no alignment guarantee
      std::memcpy(&blk, src + i * sizeof(Block), sizeof(Block));
      quant::dequantize_block(blk, dst + i * elems);
    }
  });
}

template <class Decode>
void dequantize_plain(const std::byte* src, float* dst, std::size_t n, std::size_t elem_bytes, Decode decode) {
  parallel_chunks(n, thread_count(n), [=](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) dst[i] = decode(src + i * elem_bytes);
  });
}

}  // namespace

void dequantize(DType type, std::span<const std::byte> src, std::span<float> dst) {
  if (type == DType::fp8_e4m3 || type == DType::int8 || type == DType::int32)
    throw UnsupportedError(detail::cat("dequantize: type ", name(type),
                                       " has no scale of its own; load it with a quantizer that reads its scale (e.g. int8-weight-only)"));
  const DTypeInfo ti = info(type);
  const auto need = row_bytes(type, dst.size());
  if (!need)
    throw InvalidArgument(detail::cat("dequantize(", ti.name, "): ", dst.size(),
                                      " output values is not a multiple of the block size ", ti.block_elems));
  if (*need != src.size())
    throw InvalidArgument(detail::cat("dequantize(", ti.name, "): ", dst.size(), " values occupy ", *need,
                                      " bytes, but the source holds ", src.size()));
  if (dst.empty()) return;
  const std::byte* s = src.data();
  float* d = dst.data();
  const std::size_t n_blocks = dst.size() / ti.block_elems;
  switch (type) {
    case DType::f32:
      return dequantize_plain(s, d, dst.size(), 4, [](const std::byte* p) {
        float v;
        std::memcpy(&v, p, 4);
        return v;
      });
    case DType::f16:
      return dequantize_plain(s, d, dst.size(), 2, [](const std::byte* p) {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        return f16_to_f32(h);
      });
    case DType::bf16:
      return dequantize_plain(s, d, dst.size(), 2, [](const std::byte* p) {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        return bf16_to_f32(h);
      });
    case DType::q8_0: return dequantize_blocks<quant::BlockQ8_0>(s, d, n_blocks);
    case DType::q4_0: return dequantize_blocks<quant::BlockQ4_0>(s, d, n_blocks);
    case DType::q4_1: return dequantize_blocks<quant::BlockQ4_1>(s, d, n_blocks);
    case DType::q5_0: return dequantize_blocks<quant::BlockQ5_0>(s, d, n_blocks);
    case DType::q5_1: return dequantize_blocks<quant::BlockQ5_1>(s, d, n_blocks);
    case DType::q4_k: return dequantize_blocks<quant::BlockQ4K>(s, d, n_blocks);
    case DType::q5_k: return dequantize_blocks<quant::BlockQ5K>(s, d, n_blocks);
    case DType::q6_k: return dequantize_blocks<quant::BlockQ6K>(s, d, n_blocks);
    case DType::iq4_nl: return dequantize_blocks<quant::BlockIQ4NL>(s, d, n_blocks);
    case DType::iq4_xs: return dequantize_blocks<quant::BlockIQ4XS>(s, d, n_blocks);
    case DType::fp8_e4m3:
    case DType::int8:
    case DType::int32: break;  // rejected above
  }
  throw UnsupportedError(detail::cat("dequantize: unknown type id ", static_cast<int>(type)));
}

}  // namespace infer::kernels::cpu
