#pragma once
/// \file
/// The byte-level BPE model: vocabulary (token ↔ id), merge ranks, and the merge algorithm for one
/// pre-token ("word"). A word starts as one symbol per byte (the id of that byte's byte-level
/// character); the adjacent pair with the lowest merge rank is merged, leftmost first on ties, until no
/// adjacent pair has a merge. That is HF `tokenizers`' order, so ids match it exactly.
///
/// The symbols are a doubly linked list over an array and candidate pairs sit in a min-heap keyed by
/// (rank, position); a popped candidate is used only if both of its symbols are still what they were
/// when it was pushed. Each merge costs O(log n), a word O(n log n). Words repeat heavily in real text,
/// so results are cached per word behind a shared_mutex (many readers, rare writers): the model is
/// immutable apart from the cache and is safe to use from any number of threads.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "infer/core/error.hpp"
#include "infer/tokenizer/byte_level.hpp"

namespace infer::detail {

/// Hash and equality that accept std::string and std::string_view alike (no temporary strings on lookup).
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
struct StringEqual {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, StringEqual>;

class BpeModel {
 public:
  /// Builds the tables. `tokens` is id → byte-level text; TokenizerError names the first duplicate token,
  /// or the first merge whose parts (or result) are not in the vocabulary. `source` prefixes messages.
  BpeModel(const std::vector<std::string>& tokens, const std::vector<std::pair<std::string, std::string>>& merges,
           std::optional<std::int32_t> unknown_id, bool ignore_merges, std::string_view source)
      : unknown_id_(unknown_id), ignore_merges_(ignore_merges), cache_(std::make_unique<Cache>()) {
    ids_.reserve(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto [it, inserted] = ids_.emplace(tokens[i], static_cast<std::int32_t>(i));
      if (!inserted) {
        throw TokenizerError(cat(source, ": duplicate token '", tokens[i], "' at ids ", it->second, " and ", i));
      }
    }
    for (unsigned b = 0; b < 256; ++b) {
      std::string ch;
      utf8::append(ch, byte_level::to_code_point(static_cast<std::uint8_t>(b)));
      const auto it = ids_.find(ch);
      byte_ids_[b] = it == ids_.end() ? -1 : it->second;
    }
    merges_.reserve(merges.size());
    std::string joined;
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const auto& [a, b] = merges[r];
      const auto ia = ids_.find(a);
      const auto ib = ids_.find(b);
      if (ia == ids_.end() || ib == ids_.end()) {
        throw TokenizerError(cat(source, ": merge #", r, " '", a, " ", b, "' names '", ia == ids_.end() ? a : b,
                                 "', which is not in the vocabulary"));
      }
      joined.assign(a).append(b);
      const auto im = ids_.find(joined);
      if (im == ids_.end()) {
        throw TokenizerError(cat(source, ": merge #", r, " '", a, " ", b, "' produces '", joined,
                                 "', which is not in the vocabulary"));
      }
      // A repeated pair keeps its first (lowest) rank, as HF does.
      merges_.try_emplace(pair_key(ia->second, ib->second), Merge{static_cast<std::int32_t>(r), im->second});
    }
  }

  [[nodiscard]] std::optional<std::int32_t> find(std::string_view token) const {
    const auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }

  /// Appends the ids of one pre-token given as raw bytes. TokenizerError when a byte has no token and
  /// the vocabulary has no unknown token to stand in for it.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
    if (word.empty()) return;
    const bool cacheable = word.size() <= kMaxCachedWordBytes;
    if (cacheable) {
      std::shared_lock lock(cache_->mutex);
      const auto it = cache_->map.find(word);
      if (it != cache_->map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::int32_t> ids;
    merge_word(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      std::unique_lock lock(cache_->mutex);
      // A crude bound keeps memory flat on adversarial input; refilling costs little.
      if (cache_->map.size() >= kMaxCachedWords) cache_->map.clear();
      cache_->map.try_emplace(std::string(word), std::move(ids));
    }
  }

  [[nodiscard]] std::size_t merge_count() const noexcept { return merges_.size(); }

 private:
  static constexpr std::size_t kMaxCachedWordBytes = 256;
  static constexpr std::size_t kMaxCachedWords = 1 << 16;

  struct Merge {
    std::int32_t rank;
    std::int32_t result;
  };
  struct Symbol {
    std::int32_t id;    ///< -1: a byte without a token (becomes the unknown token, never merges)
    std::int32_t prev;  ///< index of the previous live symbol, -1 at the start
    std::int32_t next;  ///< index of the next live symbol, -1 at the end
  };
  struct Candidate {
    std::int32_t rank, left, right, left_id, right_id;
    bool operator>(const Candidate& o) const noexcept {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  struct Cache {
    std::shared_mutex mutex;
    StringMap<std::vector<std::int32_t>> map;
  };

  static constexpr std::uint64_t pair_key(std::int32_t a, std::int32_t b) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  const Merge* find_merge(std::int32_t a, std::int32_t b) const {
    if (a < 0 || b < 0) return nullptr;
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
    if (ignore_merges_) {
      const std::string text = byte_level::encode(word);
      if (const auto it = ids_.find(text); it != ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const auto n = static_cast<std::int32_t>(word.size());
    std::vector<Symbol> sym(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) {
      sym[i] = Symbol{byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
    }
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](std::int32_t left) {
      const std::int32_t right = sym[left].next;
      if (right < 0) return;
      if (const Merge* m = find_merge(sym[left].id, sym[right].id)) {
        heap.push(Candidate{m->rank, left, right, sym[left].id, sym[right].id});
      }
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      // Stale when either side has merged since: ids only ever grow, so equal ids mean untouched.
      if (sym[c.left].id != c.left_id || sym[c.left].next != c.right || sym[c.right].id != c.right_id) continue;
      const Merge* m = find_merge(c.left_id, c.right_id);
      sym[c.left].id = m->result;
      const std::int32_t after = sym[c.right].next;
      sym[c.left].next = after;
      if (after >= 0) sym[after].prev = c.left;
      sym[c.right].id = -2;  // dead
      if (sym[c.left].prev >= 0) push(sym[c.left].prev);
      push(c.left);
    }
    for (std::int32_t i = 0; i >= 0; i = sym[i].next) {
      if (sym[i].id >= 0) {
        out.push_back(sym[i].id);
      } else if (unknown_id_) {
        out.push_back(*unknown_id_);
      } else {
        throw TokenizerError(cat("byte 0x", std::hex, static_cast<unsigned>(static_cast<unsigned char>(word[i])),
                                 std::dec, " has no token in the vocabulary and there is no unknown token"));
      }
    }
  }

  StringMap<std::int32_t> ids_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::int32_t byte_ids_[256] = {};
  std::optional<std::int32_t> unknown_id_;
  bool ignore_merges_ = false;
  std::unique_ptr<Cache> cache_;
};

}  // namespace infer::detail
