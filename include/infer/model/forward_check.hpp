#pragma once
/// \file
/// `validate_step`: the checks every decoder makes on a step before it writes anything — the cache
/// matches the model, chunks are non-empty, ids are in the vocabulary, positions stay within the block
/// tables and the cache. `check_same_step`: a tensor-parallel rank's step is rank 0's. Shared by the CPU
/// and the CUDA decoder so both reject the same steps with the same messages.

#include <cstdint>
#include <iterator>
#include <limits>
#include <span>

#include "infer/attention/kv_view.hpp"
#include "infer/core/error.hpp"
#include "infer/dist/communicator.hpp"
#include "infer/memory/prefix_hash.hpp"
#include "infer/model/forward_batch.hpp"
#include "infer/model/model_config.hpp"

namespace infer {

/// Returns the step's total number of tokens. InvalidArgument naming the chunk and what is wrong;
/// UnsupportedError past a sliding window (not implemented). `Cache` is any KvCache<B>.
template <class Cache>
std::int64_t validate_step(const ModelConfig& config, std::span<const ForwardChunk> chunks,
                           const Cache& cache) {
  using detail::cat;
  require<InvalidArgument>(cache.num_layers() == config.num_layers && cache.kv_heads() == config.num_kv_heads &&
                               cache.head_dim() == config.head_dim,
                           "LlamaModel::forward: the KV cache has ", cache.num_layers(), " layers of ",
                           cache.kv_heads(), " heads x ", cache.head_dim(), "; this model needs ", config.num_layers,
                           " layers of ", config.num_kv_heads, " x ", config.head_dim);
  const std::int64_t bs = cache.block_size();
  std::int64_t total = 0;
  for (std::size_t ci = 0; ci < chunks.size(); ++ci) {
    const ForwardChunk& c = chunks[ci];
    const auto n = static_cast<std::int64_t>(c.tokens.size());
    if (n == 0) throw InvalidArgument(cat("LlamaModel::forward: chunk ", ci, " has no tokens"));
    if (c.start < 0) throw InvalidArgument(cat("LlamaModel::forward: chunk ", ci, " starts at ", c.start));
    for (std::size_t i = 0; i < c.tokens.size(); ++i)
      if (c.tokens[i] < 0 || c.tokens[i] >= config.vocab_size)
        throw InvalidArgument(cat("LlamaModel::forward: chunk ", ci, " token ", i, " is id ", c.tokens[i],
                                  ", outside the vocabulary [0, ", config.vocab_size, ")"));
    const std::int64_t end = c.start + n;
    if (end > std::numeric_limits<std::int32_t>::max())
      throw InvalidArgument(cat("LlamaModel::forward: chunk ", ci, " reaches position ", end));
    if (config.sliding_window && end > *config.sliding_window)
      throw UnsupportedError(cat("LlamaModel::forward: chunk ", ci, " reaches position ", end,
                                 ", beyond the model's sliding window of ", *config.sliding_window,
                                 " tokens; sliding-window attention is not implemented yet"));
    // Blocks the chunk's positions touch, one table entry per block_size tokens (a contiguous slot is
    // consecutive blocks: the same count).
    const std::int64_t needed = (end + bs - 1) / bs;
    if (static_cast<std::int64_t>(c.block_table.size()) * bs < end || std::ssize(c.block_table) < needed)
      throw InvalidArgument(cat("LlamaModel::forward: chunk ", ci, " reaches position ", end, " but its block table ",
                                "holds ", c.block_table.size(), " blocks of ", bs, " tokens"));
    for (std::int64_t b = 0; b < needed; ++b)
      if (c.block_table[static_cast<std::size_t>(b)] < 0 || c.block_table[static_cast<std::size_t>(b)] >= cache.num_blocks())
        throw InvalidArgument(cat("LlamaModel::forward: chunk ", ci, " block table entry ", b, " = ",
                                  c.block_table[static_cast<std::size_t>(b)], " is outside the cache's ",
                                  cache.num_blocks(), " blocks"));
    total += n;
  }
  require<InvalidArgument>(total <= std::numeric_limits<std::int32_t>::max(), "LlamaModel::forward: ", total,
                           " tokens in one step");
  return total;
}

/// Every tensor-parallel rank's step must be rank 0's (the same chunks: starts, tokens, which sample), or their
/// collectives would pair different data. A fingerprint of the step, compared with rank 0's on every rank; any
/// difference throws DistributedError on every rank, so none is left waiting in a collective.
inline void check_same_step(dist::Group& group, std::span<const ForwardChunk> chunks) {
  std::uint64_t h = kPrefixHashSeed;
  for (const auto& c : chunks) {  // each chunk's tokens, chained after its start, sampling and length
    const std::int32_t head[3] = {c.start, c.samples ? 1 : 0, static_cast<std::int32_t>(c.tokens.size())};
    h = hash_block(hash_block(h, head), c.tokens);
  }
  std::uint64_t root = h;
  group.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&root, 1)), 0);
  float differ = root == h ? 0.0f : 1.0f;
  group.all_reduce_sum(std::span<float>(&differ, 1));
  if (differ != 0.0f)
    throw DistributedError(detail::cat("tensor-parallel rank ", group.rank(), ": ", differ, " of ", group.size(),
                                       " ranks were given another step than rank 0 (different requests, or sampling",
                                       " that differs between ranks); every rank must run the same requests"));
}

}  // namespace infer
