// Next-token counts of a match's SA range, top k, as interleavable coroutines (interleave.h).
//
// The entries of a range whose suffixes share their first len tokens are sorted by the token at
// offset len: the counts walk its blocks of equal tokens with galloping searches, stopping once the
// entries left cannot reach the top k. Ranges above max_support entries are sampled evenly
// (max_support entries) and their counts scaled. Without an exclusion a result depends only on
// (lo, hi, len), so those of ranges of kCacheFrom+ entries are kept in a small per-thread cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "shard_search.h"

namespace tscale::index {

// best: (count, token) by count descending, ties by smaller token; tokens arrive in increasing order
inline void keep_top(std::vector<std::pair<int64_t, int64_t>>& best, int64_t topk, int64_t c, int64_t t) {
  if (static_cast<int64_t>(best.size()) == topk && c <= best.back().first) return;
  auto at = std::upper_bound(best.begin(), best.end(), c, [](int64_t v, const auto& e) { return v > e.first; });
  best.insert(at, {c, t});
  if (static_cast<int64_t>(best.size()) > topk) best.pop_back();
}

// Direct-mapped cache of counted ranges, shared by the streams of one thread.
struct CountCache {
  static constexpr int64_t kSlots = 4096;  // 2^12: the hash below keeps 12 bits
  int64_t topk;
  std::vector<int64_t> keys, vals;  // per slot: lo, hi, len; topk (next, count)

  explicit CountCache(int64_t k) : topk(k) {}
  // the slot of (lo, hi, len): its key (3 entries) and value (2 * topk), allocated on first use
  std::pair<int64_t*, int64_t*> slot(int64_t lo, int64_t hi, int64_t len) {
    if (keys.empty()) {
      keys.assign(3 * kSlots, -1);
      vals.assign(2 * topk * kSlots, 0);
    }
    const uint64_t h = (static_cast<uint64_t>(lo) * 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(hi) * 0xc2b2ae3d27d4eb4fULL ^
                        static_cast<uint64_t>(len)) >> 52;
    return {keys.data() + 3 * h, vals.data() + 2 * topk * h};
  }
};

// One stream's counter: its scratch, and the thread's cache.
template <typename T>
struct Counter {
  static constexpr int64_t kCacheFrom = 16;  // smaller ranges are counted again (cheaper than a cache miss)
  const Shard<T>& s;
  CountCache& cache;
  int64_t topk, max_support;
  std::vector<std::pair<int64_t, int64_t>> best;
  std::vector<int64_t> pos, tok;

  Counter(const Shard<T>& shard, CountCache& c, int64_t k, int64_t support)
      : s(shard), cache(c), topk(k), max_support(support) {
    best.reserve(k + 1);
  }

  void run(int64_t lo, int64_t hi, int64_t len, int64_t es, int64_t ee, int64_t* next, int64_t* count) {
    std::fill(next, next + topk, -1);
    std::fill(count, count + topk, 0);
    if (len == 0) return;
    const int64_t size = hi - lo;
    const bool excluding = ee > 0;  // counts() can reject an occurrence only then
    const bool cacheable = !excluding && size >= kCacheFrom;
    if (cacheable) {
      const auto [key, val] = cache.slot(lo, hi, len);
      if (key[0] == lo && key[1] == hi && key[2] == len) {
        std::copy(val, val + topk, next);
        std::copy(val + topk, val + 2 * topk, count);
        return;
      }
    }
    if (size <= max_support) {
      exact(lo, hi, len, es, ee, excluding);
      emit(next, count, 0, 0);
    } else {
      sampled(lo, size, len, es, ee);
      emit(next, count, size, max_support);
    }
    if (cacheable) {
      const auto [key, val] = cache.slot(lo, hi, len);
      key[0] = lo;
      key[1] = hi;
      key[2] = len;
      std::copy(next, next + topk, val);
      std::copy(count, count + topk, val + topk);
    }
  }

  // every entry: walk the blocks of equal next tokens, stopping once the rest cannot enter the top k
  void exact(int64_t lo, int64_t hi, int64_t len, int64_t es, int64_t ee, bool excluding) {
    best.clear();
    for (int64_t j = lo; j < hi;) {
      if (static_cast<int64_t>(best.size()) == topk && hi - j <= best.back().first) break;
      const int64_t t = s.key(j, len);
      const int64_t e = s.block_end(j, hi, len, t);
      if (t >= 0) {
        int64_t c = e - j;
        if (excluding) {
          c = 0;
          for (int64_t r = j; r < e; ++r) c += s.counts(s.sa[r], len, es, ee);
        }
        if (c) keep_top(best, topk, c, t);
      }
      j = e;
    }
  }

  // runs of equal next tokens among max_support evenly spaced entries (gathered first: independent loads)
  void sampled(int64_t lo, int64_t size, int64_t len, int64_t es, int64_t ee) {
    const int64_t m = max_support;
    pos.resize(m);
    tok.resize(m);
    for (int64_t i = 0; i < m; ++i) pos[i] = s.sa[lo + (i * size) / m];
    for (int64_t i = 0; i < m; ++i) tok[i] = s.counts(pos[i], len, es, ee) ? s.tok(pos[i] + len) : -1;
    best.clear();
    int64_t cur = -1, c = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (tok[i] < 0) continue;
      if (tok[i] == cur) {
        ++c;
        continue;
      }
      if (c) keep_top(best, topk, c, cur);
      cur = tok[i];
      c = 1;
    }
    if (c) keep_top(best, topk, c, cur);
  }

  // counts scaled by size / m (rounded) when sampled; m == 0: exact
  void emit(int64_t* next, int64_t* count, int64_t size, int64_t m) const {
    for (size_t r = 0; r < best.size(); ++r) {
      next[r] = best[r].second;
      count[r] = m == 0 ? best[r].first : (best[r].first * size + m / 2) / m;
    }
  }
};

}  // namespace tscale::index
