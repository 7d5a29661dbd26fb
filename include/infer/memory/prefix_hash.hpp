#pragma once
/// \file
/// Chained hashes of full KV blocks, the keys of the prefix cache. A block's K/V depend on every token
/// before it, not only on its own tokens, so block i's key is hash(key of block i-1, tokens of block i):
/// equal tokens after a different earlier context get a different key and never hit. The first
/// block's parent is a fixed seed.
///
/// xxHash's XXH3 is used header-only (`XXH_INLINE_ALL`), so nothing is linked. The parent key is the
/// XXH3 seed: each parent selects an independent hash function over the block's token bytes. Keys are
/// 64-bit and a hit is not verified against the tokens; at the cache sizes of one GPU (~10^6 blocks)
/// the chance of any collision is ~10^-7. Keys are process-local (host byte order).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace infer {

/// The parent key of a sequence's first block.
inline constexpr std::uint64_t kPrefixHashSeed = 0x696e6665722e6b76ull;  // "infer.kv"

/// Key of one full block whose predecessor's key is `parent` (kPrefixHashSeed for the first block).
[[nodiscard]] inline std::uint64_t hash_block(std::uint64_t parent, std::span<const std::int32_t> tokens) noexcept {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

/// Appends to `keys` the keys of the full blocks of `tokens` after the first `keys.size()` ones, which
/// must already be `tokens`' keys: the chain is extended, never recomputed. Blocks are `block_size`
/// tokens; a trailing partial block gets no key.
inline void extend_block_hashes(std::span<const std::int32_t> tokens, std::int32_t block_size,
                                std::vector<std::uint64_t>& keys) {
  const std::size_t bs = static_cast<std::size_t>(block_size);
  const std::size_t full = tokens.size() / bs;
  for (std::size_t i = keys.size(); i < full; ++i) {
    const std::uint64_t parent = i == 0 ? kPrefixHashSeed : keys[i - 1];
    keys.push_back(hash_block(parent, tokens.subspan(i * bs, bs)));
  }
}

}  // namespace infer
