// Streaming longest-match lookup in one index shard (op schema + CPU kernel).
//
// index_lookup_levels(text, sa, first, pair_off, pair_next, pair_start, inline_tokens, query, excl, eos, caps, topk,
//                     max_support)
//   caps  the match caps, strictly descending (>= 1); level l of each result is capped at caps[l],
//         and max_len below is caps[0] (tscale.ops.index.index_lookup is the one-cap case)
//   text  int16 (uint16 ids) or int32 (n,): the shard's tokens; sa int32 (n,): uint32 suffix array
//   first int64 (V + 1,): suffixes starting with token a are sa[first[a] : first[a + 1]]
//   pair_*: the token-pair table of index_pairs (csrc/index/pairs.cpp)
//   inline_tokens int16 (n,) or (0,): each suffix's token at offset 2 (csrc/index/inline_tokens.cpp), read
//         instead of sa and the text where a search or an extension compares that offset; empty: those are read
//   query int64 (N,); excl int64 (N, 2) or (0, 2): per query position a shard range [s, e) of
//         occurrence starts that do not count (leave-one-out); eos: context resets after it (-1: never)
//   -> per level, len int32 (N,): longest L <= max_len such that query[i-L+1 .. i] occurs at some start p with
//         p + L < n and [p, p + L] disjoint from excl[i], the context never reaching back past an eos at < i;
//      next int64 (N, topk), count int64 (N, topk): tokens text[p + L] over those occurrences,
//         by count (ties: smaller id first); -1 / 0 where fewer. Exact when the match's SA range has
//         at most max_support entries; larger ranges are sampled evenly (max_support entries) and
//         their counts scaled. The levels are stacked: len (C, N), next and count (C, N, topk).
//   Streaming: a match is extended by one token by narrowing its SA range; when that fails the
//   context is shortened from the left and searched again, starting from the pair table and
//   binary-searching the whole remaining pattern. Next-token counts walk the blocks of equal next
//   tokens of the range (it is sorted by next token) with galloping searches, stopping once the
//   entries left cannot reach the top k; results for ranges of 16+ entries without an exclusion
//   are kept in a small per-thread cache (they depend on the range only). Independent chunks of the query run in parallel, each
//   warmed up on the max_len positions before it, so results do not depend on the chunking.
//   Levels: only caps[0] streams; a shorter cap reuses its results where the match fits under it
//   and searches its own c tokens where it does not (see shorter_levels).
// Reference twins: tscale/ops/index.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "inline_tokens.h"

namespace tscale {
namespace {

constexpr int64_t kChunk = 16384;

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
  const uint16_t* inl;  // per SA entry, its suffix's token at offset 2 (index_inline_tokens), or null

  int64_t tok(int64_t p) const { return token_at(text, p); }
  // the token at offset 2 of suffix j from inl, without reading sa or the text; -1 past the end
  int64_t inline_key(int64_t j) const { return inline_token(inl[j]); }
  int64_t key(int64_t j, int64_t k) const {
    if (inl && k == 2) return inline_key(j);
    const int64_t p = static_cast<int64_t>(sa[j]) + k;
    return p < n ? tok(p) : -1;
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
    if (inl && k == 2 && k < len) {  // offset 2 from inl: often decides without sa[j]
      const int64_t t = inline_key(j);
      if (t != q[k]) return t < q[k] ? -1 : 1;
      ++k;
    }
    if (k >= len) return 0;
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
  bool find(const int64_t* q, int64_t len, int64_t es, int64_t ee, int64_t& lo, int64_t& hi) const {
    if (q[0] < 0 || q[0] >= vocab) return false;
    if (len == 1) {
      lo = first[q[0]];
      hi = first[q[0] + 1];
      return lo < hi && valid(lo, hi, len, es, ee);
    }
    if (q[1] < 0 || q[1] >= vocab || !pair(q[0], q[1], lo, hi)) return false;
    if (len > 2) {
      // lower bound of q among the pair's suffixes, skipping the prefix shared with both ends
      int64_t l = lo, h = hi, lk = 2, hk = 2;
      while (l < h) {
        const int64_t m = l + (h - l) / 2;
        const int64_t below = l + (m - l) / 2, above = m + 1 + (h - m - 1) / 2;  // the next midpoint, either way
        __builtin_prefetch(sa + below);
        __builtin_prefetch(sa + above);
        if (inl) {
          __builtin_prefetch(inl + below);
          __builtin_prefetch(inl + above);
        }
        int64_t k = std::min(lk, hk);
        if (compare(m, q, len, k) < 0) {
          l = m + 1;
          lk = k;
        } else {
          h = m;
          hk = k;
        }
      }
      int64_t k = 2;
      if (l == hi || compare(l, q, len, k) != 0) return false;
      int64_t e = l + 1, g = l + 1, step = 1;  // upper bound: gallop, then bisect
      for (k = 2; g < hi && compare(g, q, len, k) == 0; k = 2) {
        e = g + 1;
        step *= 2;
        g = std::min(hi, l + step);
      }
      while (e < g) {
        const int64_t m = e + (g - e) / 2;
        k = 2;
        if (compare(m, q, len, k) == 0) e = m + 1; else g = m;
      }
      lo = l;
      hi = e;
    }
    return valid(lo, hi, len, es, ee);
  }
};

// Longest l <= top with q[-l..0) found (existence is monotone in l); its range in lo, hi.
template <typename T>
int64_t longest(const Shard<T>& s, const int64_t* end, int64_t top, int64_t es, int64_t ee, int64_t& lo, int64_t& hi) {
  if (top < 1) return 0;
  if (s.find(end - top, top, es, ee, lo, hi)) return top;  // the usual case: one token dropped
  int64_t good = 0, bad = top, glo = 0, ghi = 0;
  while (bad - good > 1) {
    const int64_t mid = (good + bad) / 2;
    int64_t l, h;
    if (s.find(end - mid, mid, es, ee, l, h)) {
      good = mid;
      glo = l;
      ghi = h;
    } else {
      bad = mid;
    }
  }
  lo = glo;
  hi = ghi;
  return good;
}

// Results of every level: level l holds the lookups capped at caps[l] (caps[0] = max_len, the rest
// shorter, descending), at len[l * n + i] and next/count[(l * n + i) * topk ...].
struct Out {
  int32_t* len;
  int64_t* next;
  int64_t* count;
  int64_t n;
  int64_t topk;
  const std::vector<int64_t>& caps;
};

// best: (count, token) by count descending, ties by smaller token; tokens arrive in increasing order
void keep_top(std::vector<std::pair<int64_t, int64_t>>& best, int64_t topk, int64_t c, int64_t t) {
  if (static_cast<int64_t>(best.size()) == topk && c <= best.back().first) return;
  auto at = std::upper_bound(best.begin(), best.end(), c, [](int64_t v, const auto& e) { return v > e.first; });
  best.insert(at, {c, t});
  if (static_cast<int64_t>(best.size()) > topk) best.pop_back();
}

// Next-token counts of SA ranges, for one thread. Without an exclusion the result depends only on
// (lo, hi, len), so those of larger ranges are kept in a small direct-mapped cache.
template <typename T>
struct Counter {
  static constexpr int64_t kSlots = 4096;  // 2^12: the hash below keeps 12 bits
  static constexpr int64_t kCacheFrom = 16;  // smaller ranges are counted again (cheaper than a cache miss)
  const Shard<T>& s;
  int64_t topk, max_support;
  std::vector<std::pair<int64_t, int64_t>> best;
  std::vector<int64_t> pos, tok;
  std::vector<int64_t> keys, vals;  // per slot: lo, hi, len; topk (next, count)

  Counter(const Shard<T>& shard, int64_t k, int64_t support)
      : s(shard), topk(k), max_support(support) {
    best.reserve(k + 1);
  }

  void run(int64_t lo, int64_t hi, int64_t len, int64_t es, int64_t ee, int64_t* next, int64_t* count) {
    std::fill(next, next + topk, -1);
    std::fill(count, count + topk, 0);
    if (len == 0) return;
    const int64_t size = hi - lo;
    const bool excluding = ee > 0;  // counts() can reject an occurrence only then
    const bool cacheable = !excluding && size >= kCacheFrom;
    if (cacheable && keys.empty()) {  // allocated on first use: short queries never pay for it
      keys.assign(3 * kSlots, -1);
      vals.assign(2 * topk * kSlots, 0);
    }
    const uint64_t h = (static_cast<uint64_t>(lo) * 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(hi) * 0xc2b2ae3d27d4eb4fULL ^
                        static_cast<uint64_t>(len)) >> 52;
    int64_t* key = cacheable ? keys.data() + 3 * h : nullptr;
    int64_t* val = cacheable ? vals.data() + 2 * topk * h : nullptr;
    if (cacheable && key[0] == lo && key[1] == hi && key[2] == len) {
      std::copy(val, val + topk, next);
      std::copy(val + topk, val + 2 * topk, count);
      return;
    }
    if (size <= max_support) {
      exact(lo, hi, len, es, ee, excluding);
      emit(next, count, 0, 0);
    } else {
      sampled(lo, size, len, es, ee);
      emit(next, count, size, max_support);
    }
    if (cacheable) {
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

// Levels 1.. at position i, from level 0's match of `len` tokens ending before `end`: existence is
// monotone in the length, so a level capped at c >= len has the same match (its results are copied)
// and one capped below it matches exactly c tokens, searched directly.
template <typename T>
void shorter_levels(const Shard<T>& s, Counter<T>& counter, const int64_t* end, int64_t len, int64_t es, int64_t ee,
                    int64_t i, const Out& out) {
  const int64_t k = out.topk;
  for (size_t l = 1; l < out.caps.size(); ++l) {
    const int64_t c = out.caps[l], at = static_cast<int64_t>(l) * out.n + i;
    if (len <= c) {
      out.len[at] = out.len[i];
      std::copy(out.next + i * k, out.next + (i + 1) * k, out.next + at * k);
      std::copy(out.count + i * k, out.count + (i + 1) * k, out.count + at * k);
    } else {
      int64_t lo = 0, hi = 0;
      const int64_t got = longest(s, end, c, es, ee, lo, hi);
      out.len[at] = static_cast<int32_t>(got);
      counter.run(lo, hi, got, es, ee, out.next + at * k, out.count + at * k);
    }
  }
}

template <typename T>
void lookup_chunk(const Shard<T>& s, Counter<T>& counter, const int64_t* q, const int64_t* excl, int64_t eos,
                  int64_t max_len, int64_t c0, int64_t c1, const Out& out) {
  const int64_t w = std::max<int64_t>(0, c0 - max_len);
  int64_t len = 0, lo = 0, hi = 0, ctx = w;
  int64_t pes = -1, pee = -1;
  for (int64_t i = w; i < c1; ++i) {
    if (i > w && eos >= 0 && q[i - 1] == eos) {
      ctx = i;
      len = 0;
    }
    const int64_t es = excl ? excl[2 * i] : -1, ee = excl ? excl[2 * i + 1] : -1;
    const bool changed = i == w || es != pes || ee != pee;
    pes = es;
    pee = ee;
    const int64_t cap = std::min(max_len, i - ctx + 1);
    int64_t start;
    bool done = false;
    if (changed) {
      start = cap;
    } else if (len + 1 <= cap) {
      int64_t nlo = lo, nhi = hi;
      if (len > 0) {
        s.narrow(nlo, nhi, len, q[i]);
        if (nlo < nhi && s.valid(nlo, nhi, len + 1, es, ee)) {
          lo = nlo;
          hi = nhi;
          ++len;
          done = true;
        }
      }
      start = std::max<int64_t>(len, 1);
    } else {
      start = cap;
    }
    if (!done) len = longest(s, q + i + 1, std::min(start, cap), es, ee, lo, hi);
    if (i >= c0) {
      out.len[i] = static_cast<int32_t>(len);
      counter.run(lo, hi, len, es, ee, out.next + i * out.topk, out.count + i * out.topk);
      shorter_levels(s, counter, q + i + 1, len, es, ee, i, out);
    }
  }
}

template <typename T>
Shard<T> make_shard(const at::Tensor& text, const at::Tensor& sa, const at::Tensor& first, const at::Tensor& off,
                    const at::Tensor& next, const at::Tensor& start, const at::Tensor& inl) {
  return {text.data_ptr<T>(), reinterpret_cast<const uint32_t*>(sa.data_ptr<int32_t>()), text.numel(),
          first.data_ptr<int64_t>(), first.numel() - 1, off.data_ptr<int64_t>(), next.data_ptr<int32_t>(),
          reinterpret_cast<const uint32_t*>(start.data_ptr<int32_t>()),
          inl.numel() ? reinterpret_cast<const uint16_t*>(inl.data_ptr<int16_t>()) : nullptr};
}

template <typename T>
void lookup_all(const Shard<T>& s, const at::Tensor& query, const at::Tensor& excl, int64_t eos, int64_t max_support,
                const Out& out) {
  const int64_t max_len = out.caps[0];
  const int64_t* q = query.data_ptr<int64_t>();
  const int64_t* ex = excl.numel() ? excl.data_ptr<int64_t>() : nullptr;
  const int64_t n = query.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t a, int64_t b) {
    Counter<T> counter(s, out.topk, max_support);
    for (int64_t c = a; c < b; ++c)
      lookup_chunk(s, counter, q, ex, eos, max_len, c * kChunk, std::min(n, (c + 1) * kChunk), out);
  });
}

void check_shard(const at::Tensor& text, const at::Tensor& sa, const at::Tensor& first) {
  const auto st = text.scalar_type();
  TORCH_CHECK(st == at::kShort || st == at::kInt, "index: text must be int16 (uint16 ids) or int32");
  TORCH_CHECK(text.dim() == 1 && text.is_contiguous(), "index: text must be contiguous 1-D");
  TORCH_CHECK(sa.scalar_type() == at::kInt && sa.numel() == text.numel() && sa.is_contiguous(), "index: sa must be int32 like text");
  TORCH_CHECK(first.scalar_type() == at::kLong && first.dim() == 1 && first.numel() >= 2 && first.is_contiguous(),
              "index: bad first");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> index_lookup_levels_cpu(
    const at::Tensor& text_in, const at::Tensor& sa_in, const at::Tensor& first_in, const at::Tensor& off_in,
    const at::Tensor& pnext_in, const at::Tensor& pstart_in, const at::Tensor& inl_in, const at::Tensor& query_in,
    const at::Tensor& excl_in, int64_t eos, at::IntArrayRef caps_in, int64_t topk, int64_t max_support) {
  const at::Tensor text = text_in.contiguous(), sa = sa_in.contiguous(), first = first_in.contiguous();
  check_shard(text, sa, first);
  const at::Tensor off = off_in.contiguous(), pnext = pnext_in.contiguous(), pstart = pstart_in.contiguous();
  TORCH_CHECK(off.scalar_type() == at::kLong && off.numel() == first.numel(), "index_lookup: pair_off must be int64 like first");
  TORCH_CHECK(pnext.scalar_type() == at::kInt && pstart.scalar_type() == at::kInt && pnext.numel() == pstart.numel(),
              "index_lookup: pair_next and pair_start must be int32 of one length");
  const at::Tensor inl = inl_in.contiguous();
  TORCH_CHECK(inl.scalar_type() == at::kShort && (inl.numel() == 0 || (inl.numel() == text.numel() &&
                                                                    text.scalar_type() == at::kShort)),
              "index_lookup: inline_tokens must be int16 like the text (uint16 ids) or empty");
  TORCH_CHECK(query_in.scalar_type() == at::kLong && query_in.dim() == 1, "index_lookup: query must be 1-D int64");
  const int64_t n = query_in.numel();
  TORCH_CHECK(excl_in.scalar_type() == at::kLong && excl_in.dim() == 2 && excl_in.size(1) == 2 &&
                  (excl_in.size(0) == 0 || excl_in.size(0) == n),
              "index_lookup: excl must be int64 (N, 2) or (0, 2)");
  const std::vector<int64_t> caps(caps_in.begin(), caps_in.end());
  TORCH_CHECK(!caps.empty() && caps.back() >= 1 && std::is_sorted(caps.rbegin(), caps.rend()) &&
                  std::adjacent_find(caps.begin(), caps.end()) == caps.end(),
              "index_lookup: the match caps must be >= 1 and strictly descending");
  TORCH_CHECK(topk >= 1 && max_support >= 1, "index_lookup: topk and max_support must be >= 1");
  const at::Tensor query = query_in.contiguous(), excl = excl_in.contiguous();
  const auto levels = static_cast<int64_t>(caps.size());
  at::Tensor len = at::zeros({levels, n}, query.options().dtype(at::kInt));
  at::Tensor next = at::empty({levels, n, topk}, query.options());
  at::Tensor count = at::empty({levels, n, topk}, query.options());
  const Out out{len.data_ptr<int32_t>(), next.data_ptr<int64_t>(), count.data_ptr<int64_t>(), n, topk, caps};
  if (text.scalar_type() == at::kShort) {
    lookup_all(make_shard<int16_t>(text, sa, first, off, pnext, pstart, inl), query, excl, eos, max_support, out);
  } else {
    lookup_all(make_shard<int32_t>(text, sa, first, off, pnext, pstart, inl), query, excl, eos, max_support, out);
  }
  return {len, next, count};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("index_lookup_levels(Tensor text, Tensor sa, Tensor first, Tensor pair_off, Tensor pair_next, "
        "Tensor pair_start, Tensor inline_tokens, Tensor query, Tensor excl, int eos, int[] caps, int topk, "
        "int max_support) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("index_lookup_levels", &index_lookup_levels_cpu);
}

}  // namespace tscale
