// Searches in one index shard's suffix array, as interleavable coroutines (interleave.h).
//
// A shard is its text (uint16 or int32 ids), its suffix array sa (uint32), the first-token table
// (suffixes starting with a are sa[first[a] : first[a + 1]]) and the token-pair table of
// index_pairs (csrc/index/pairs.cpp). The searches prefetch and suspend before each load of the
// text at an SA entry, the load that misses on a large index.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "interleave.h"

namespace tscale::index {

using interleave::fetch;
using interleave::Task;

template <typename T>
int64_t token_at(const T* p, int64_t i) {
  return static_cast<int64_t>(static_cast<std::make_unsigned_t<T>>(p[i]));
}

template <typename T>
struct Shard {
  const T* text;
  const uint32_t* sa;
  int64_t n;
  const int64_t* first;
  int64_t vocab;
  const int64_t* pair_off;
  const int32_t* pair_next;
  const uint32_t* pair_start;

  int64_t tok(int64_t p) const { return token_at(text, p); }
  int64_t key(int64_t j, int64_t k) const {
    const int64_t p = static_cast<int64_t>(sa[j]) + k;
    return p < n ? tok(p) : -1;
  }
  const T* at(int64_t j, int64_t k) const {  // key(j, k)'s address (the text's last token past its end), to prefetch
    return text + std::min(static_cast<int64_t>(sa[j]) + k, n - 1);
  }

  // first e in (j, hi] whose key at offset k differs from t = key(j, k) (the range is sorted there)
  int64_t block_end(int64_t j, int64_t hi, int64_t k, int64_t t) const {
    int64_t l = j + 1, h = j + 1, step = 1;
    while (h < hi && key(h, k) == t) {  // gallop: blocks are usually short next to the range
      l = h + 1;
      step *= 2;
      h = std::min(hi, j + step);
    }
    while (l < h) {
      const int64_t m = l + (h - l) / 2;
      if (key(m, k) == t) l = m + 1; else h = m;
    }
    return l;
  }
  // narrow [lo, hi), whose suffixes share their first k tokens, to those with token a at offset k
  void narrow(int64_t& lo, int64_t& hi, int64_t k, int64_t a) const {
    int64_t l = lo, h = hi;
    while (l < h) {
      const int64_t m = l + (h - l) / 2;
      if (key(m, k) < a) l = m + 1; else h = m;
    }
    lo = l;
    hi = l < hi && key(l, k) == a ? block_end(l, hi, k, a) : l;
  }

  // the suffixes starting with tokens a, b
  bool pair(int64_t a, int64_t b, int64_t& lo, int64_t& hi) const {
    const int32_t* x = pair_next + pair_off[a];
    const int32_t* y = pair_next + pair_off[a + 1];
    const int32_t* f = std::lower_bound(x, y, static_cast<int32_t>(b));
    if (f == y || *f != b) return false;
    const int64_t r = f - pair_next;
    lo = pair_start[r];
    hi = f + 1 < y ? static_cast<int64_t>(pair_start[r + 1]) : first[a + 1];
    return true;
  }

  // compare the suffix at sa[j] with q[0..len) from offset k (the first k tokens are known equal);
  // k ends at their common prefix; < 0, 0 (q is a prefix of the suffix), > 0
  int compare(int64_t j, const int64_t* q, int64_t len, int64_t& k) const {
    const int64_t p = sa[j];
    for (; k < len; ++k) {
      const int64_t t = p + k < n ? tok(p + k) : -1;
      if (t != q[k]) return t < q[k] ? -1 : 1;
    }
    return 0;
  }

  // an occurrence counts when it has a next token and its span [p, p + len] misses [es, ee)
  bool counts(int64_t p, int64_t len, int64_t es, int64_t ee) const { return p + len < n && !(p + len >= es && p < ee); }
  bool valid(int64_t lo, int64_t hi, int64_t len, int64_t es, int64_t ee) const {
    for (int64_t j = lo; j < hi; ++j)
      if (counts(sa[j], len, es, ee)) return true;
    return false;
  }

  // SA range of q[0..len) with at least one counting occurrence, or false
  Task<bool> find(const int64_t* q, int64_t len, int64_t es, int64_t ee, int64_t& lo, int64_t& hi) const {
    if (q[0] < 0 || q[0] >= vocab) co_return false;
    if (len == 1) {
      lo = first[q[0]];
      hi = first[q[0] + 1];
      co_return lo < hi && valid(lo, hi, len, es, ee);
    }
    if (q[1] < 0 || q[1] >= vocab || !pair(q[0], q[1], lo, hi)) co_return false;
    if (len > 2) {
      // lower bound of q among the pair's suffixes, skipping the prefix shared with both ends
      int64_t l = lo, h = hi, lk = 2, hk = 2;
      while (l < h) {
        const int64_t m = l + (h - l) / 2;
        __builtin_prefetch(sa + l + (m - l) / 2);
        __builtin_prefetch(sa + m + 1 + (h - m - 1) / 2);
        int64_t k = std::min(lk, hk);
        co_await fetch(at(m, k));
        if (compare(m, q, len, k) < 0) {
          l = m + 1;
          lk = k;
        } else {
          h = m;
          hk = k;
        }
      }
      int64_t k = 2;
      if (l == hi) co_return false;
      co_await fetch(at(l, k));
      if (compare(l, q, len, k) != 0) co_return false;
      int64_t e = l + 1, g = l + 1, step = 1;  // upper bound: gallop, then bisect
      while (g < hi) {
        k = 2;
        co_await fetch(at(g, k));
        if (compare(g, q, len, k) != 0) break;
        e = g + 1;
        step *= 2;
        g = std::min(hi, l + step);
      }
      while (e < g) {
        const int64_t m = e + (g - e) / 2;
        k = 2;
        co_await fetch(at(m, k));
        if (compare(m, q, len, k) == 0) e = m + 1; else g = m;
      }
      lo = l;
      hi = e;
    }
    co_return valid(lo, hi, len, es, ee);
  }

  // Longest l <= top with q[-l..0) found (existence is monotone in l); its range in lo, hi.
  Task<int64_t> longest(const int64_t* end, int64_t top, int64_t es, int64_t ee, int64_t& lo, int64_t& hi) const {
    if (top < 1) co_return 0;
    if (co_await find(end - top, top, es, ee, lo, hi)) co_return top;  // the usual case: one token dropped
    int64_t good = 0, bad = top, glo = 0, ghi = 0;
    while (bad - good > 1) {
      const int64_t mid = (good + bad) / 2;
      int64_t l, h;
      if (co_await find(end - mid, mid, es, ee, l, h)) {
        good = mid;
        glo = l;
        ghi = h;
      } else {
        bad = mid;
      }
    }
    lo = glo;
    hi = ghi;
    co_return good;
  }
};

}  // namespace tscale::index
