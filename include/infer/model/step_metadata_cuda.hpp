#pragma once
/// \file
/// The GPU decoder's per-step metadata: what the kernels read besides activations (token ids, positions,
/// cache slots, block tables, lengths, prefill offsets, sampled rows), packed by the host into one pinned
/// buffer and copied to the device in one transfer per step. A CUDA graph captures kernels that read the
/// device copy at fixed offsets, so a padded decode step of a bucket always has the same layout and a
/// replay needs only the copy before it.

#if defined(INFER_HAVE_CUDA)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "infer/model/forward_batch.hpp"

namespace infer {

/// The shape of a step as the kernels see it: T token rows, C chunks (the first num_decode are decode
/// chunks of one row), S sampled rows, block tables of `width` entries.
struct StepShape {
  std::int32_t T = 0, C = 0, S = 0, width = 0, num_decode = 0, prefill_rows = 0;
  bool identity_samples = false;  ///< every row samples (rows == sampled rows): no gather

  /// A decode step of `b` rows padded to a graph's shape: every row a sequence that samples, tables at
  /// full `width`.
  static StepShape padded_decode(std::int32_t b, std::int32_t width) {
    StepShape sh;
    sh.T = sh.C = sh.S = sh.num_decode = b;
    sh.width = width;
    sh.identity_samples = true;
    return sh;
  }
};

/// Where each array lies in the metadata buffer (pinned and device copies alike), 8-byte aligned.
struct StepMetadataLayout {
  std::size_t ids = 0, pos = 0, slots = 0, tables = 0, lens = 0, indptr = 0, starts = 0, samples = 0, bytes = 0;

  /// The layout of a step of T tokens, C chunks (tables of `width` entries) and S sampled rows.
  StepMetadataLayout(std::int64_t T, std::int64_t C, std::int64_t width, std::int64_t S) {
    std::size_t at = 0;
    auto take = [&](std::size_t n, std::size_t elem) {
      at = (at + 7) / 8 * 8;
      const std::size_t r = at;
      at += n * elem;
      return r;
    };
    slots = take(static_cast<std::size_t>(T), 8);
    ids = take(static_cast<std::size_t>(T), 4);
    pos = take(static_cast<std::size_t>(T), 4);
    tables = take(static_cast<std::size_t>(C * width), 4);
    lens = take(static_cast<std::size_t>(C), 4);
    indptr = take(static_cast<std::size_t>(C + 1), 4);
    starts = take(static_cast<std::size_t>(C), 4);
    samples = take(static_cast<std::size_t>(S), 4);
    bytes = at;
  }
};

/// Typed views of one copy of the metadata.
struct StepMetadata {
  std::int32_t* ids;      ///< [T] token ids
  std::int32_t* pos;      ///< [T] positions
  std::int64_t* slots;    ///< [T] cache slot (block · block_size + offset); -1 writes nothing
  std::int32_t* tables;   ///< [C][width] block tables: decode chunks first, then prefill chunks
  std::int32_t* lens;     ///< [C] context length of each decode chunk (0: a padding row, attends to nothing)
  std::int32_t* indptr;   ///< [prefill chunks + 1] row offsets of the prefill chunks, from 0
  std::int32_t* starts;   ///< [prefill chunks] first position of each prefill chunk
  std::int32_t* samples;  ///< [S] row of each sampled row

  static StepMetadata at(void* base, const StepMetadataLayout& m) {
    auto* b = static_cast<std::byte*>(base);
    return {reinterpret_cast<std::int32_t*>(b + m.ids),    reinterpret_cast<std::int32_t*>(b + m.pos),
            reinterpret_cast<std::int64_t*>(b + m.slots),  reinterpret_cast<std::int32_t*>(b + m.tables),
            reinterpret_cast<std::int32_t*>(b + m.lens),   reinterpret_cast<std::int32_t*>(b + m.indptr),
            reinterpret_cast<std::int32_t*>(b + m.starts), reinterpret_cast<std::int32_t*>(b + m.samples)};
  }
};

/// Writes the metadata of `chunks` at shape `sh` into `pinned` (at least the layout's bytes); rows beyond
/// the chunks (graph padding) get token 0 at position 0, slot -1 (no cache write), length 0 (attends to
/// nothing). Returns the layout.
inline StepMetadataLayout pack_step_metadata(std::span<const ForwardChunk> chunks, const StepShape& sh,
                                             std::int32_t bs, void* pinned) {
  const StepMetadataLayout m(sh.T, sh.C, sh.width, sh.S);
  const StepMetadata d = StepMetadata::at(pinned, m);
  std::int32_t row = 0, s = 0, prefill = 0;
  d.indptr[0] = 0;
  for (std::size_t ci = 0; ci < chunks.size(); ++ci) {
    const ForwardChunk& c = chunks[ci];
    const auto n = static_cast<std::int32_t>(c.tokens.size());
    for (std::int32_t i = 0; i < n; ++i, ++row) {
      const std::int32_t p = c.start + i;
      d.ids[row] = c.tokens[static_cast<std::size_t>(i)];
      d.pos[row] = p;
      d.slots[row] = static_cast<std::int64_t>(c.block_table[static_cast<std::size_t>(p / bs)]) * bs + p % bs;
    }
    std::int32_t* t = d.tables + ci * static_cast<std::size_t>(sh.width);
    const auto used = std::min<std::size_t>(c.block_table.size(), static_cast<std::size_t>(sh.width));
    std::memcpy(t, c.block_table.data(), used * sizeof(std::int32_t));
    std::fill(t + used, t + sh.width, 0);
    if (static_cast<std::int32_t>(ci) < sh.num_decode) {
      d.lens[ci] = c.start + 1;
    } else {
      // Prefill chunks are numbered from 0 in their own arrays (after the decode chunks' tables).
      d.starts[prefill] = c.start;
      d.indptr[prefill + 1] = d.indptr[prefill] + n;
      prefill++;
    }
    if (c.samples) d.samples[s++] = row - 1;
  }
  for (; row < sh.T; ++row) {  // graph padding
    d.ids[row] = 0;
    d.pos[row] = 0;
    d.slots[row] = -1;
    d.samples[row] = row;
  }
  for (auto ci = static_cast<std::int32_t>(chunks.size()); ci < sh.C; ++ci) {
    d.lens[ci] = 0;
    std::fill(d.tables + ci * static_cast<std::size_t>(sh.width), d.tables + (ci + 1) * static_cast<std::size_t>(sh.width), 0);
  }
  return m;
}

}  // namespace infer

#endif  // INFER_HAVE_CUDA
