// Streaming longest-match lookup in one index shard, and n-gram overlap for decontamination.
//
// index_lookup(text, sa, first, query, excl, eos, max_len, topk, max_support)
//   text  int16 (uint16 ids) or int32 (n,): the shard's tokens; sa int32 (n,): uint32 suffix array
//   first int64 (V + 1,): suffixes starting with token a are sa[first[a] : first[a + 1]]
//   query int64 (N,); excl int64 (N, 2) or (0, 2): per query position a shard range [s, e) of
//         occurrence starts that do not count (leave-one-out); eos: context resets after it (-1: never)
//   -> len int32 (N,): longest L <= max_len such that query[i-L+1 .. i] occurs at some start p with
//         p + L < n and [p, p + L] disjoint from excl[i], the context never reaching back past an eos at < i;
//      next int64 (N, topk), count int64 (N, topk): tokens text[p + L] over those occurrences,
//         by count (ties: smaller id first); -1 / 0 where fewer. Ranges over max_support entries
//         are sampled evenly and their counts scaled (the range is sorted by next token).
//   Streaming: a match is extended by one token by narrowing its SA range; when that fails the
//   context is shortened from the left and searched again. Independent chunks of the query run
//   in parallel, each warmed up on the max_len positions before it, so results do not depend
//   on the chunking.
//
// ngram_hashes(tokens, starts, n) -> int64 hashes of every n-gram inside a document (its final
//   eos excluded); docs_with_ngrams(tokens, starts, n, sorted_hashes) -> bool (D,): the documents
//   with at least one n-gram whose hash is in sorted_hashes.
// Reference twins: tscale/index/reference.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace tscale {
namespace {

constexpr int64_t kChunk = 16384;

template <typename T>
struct Shard {
  const T* text;
  const uint32_t* sa;
  int64_t n;
  const int64_t* first;
  int64_t vocab;

  int64_t tok(int64_t p) const { return static_cast<int64_t>(static_cast<std::make_unsigned_t<T>>(text[p])); }
  int64_t key(int64_t j, int64_t k) const {
    const int64_t p = static_cast<int64_t>(sa[j]) + k;
    return p < n ? tok(p) : -1;
  }
  // narrow [lo, hi), whose suffixes share their first k tokens, to those with token a at offset k
  void narrow(int64_t& lo, int64_t& hi, int64_t k, int64_t a) const {
    int64_t l = lo, h = hi;
    while (l < h) {
      const int64_t m = l + (h - l) / 2;
      if (key(m, k) < a) l = m + 1; else h = m;
    }
    const int64_t start = l;
    int64_t step = 1;  // gallop: the block of token a is usually short next to the range
    h = l;
    while (h < hi && key(h, k) <= a) {
      l = h + 1;
      h = std::min(hi, h + step);
      step *= 2;
    }
    while (l < h) {
      const int64_t m = l + (h - l) / 2;
      if (key(m, k) <= a) l = m + 1; else h = m;
    }
    lo = start;
    hi = l;
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
    lo = first[q[0]];
    hi = first[q[0] + 1];
    for (int64_t k = 1; k < len && lo < hi; ++k) {
      if (hi - lo == 1) {  // one candidate left: compare the rest directly
        const int64_t p = sa[lo];
        for (int64_t r = k; r < len; ++r)
          if (p + r >= n || tok(p + r) != q[r]) return false;
        break;
      }
      narrow(lo, hi, k, q[k]);
    }
    return lo < hi && valid(lo, hi, len, es, ee);
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

struct Out {
  int32_t* len;
  int64_t* next;
  int64_t* count;
  int64_t topk;
};

template <typename T>
void top_next(const Shard<T>& s, int64_t lo, int64_t hi, int64_t len, int64_t es, int64_t ee, int64_t max_support,
              std::vector<std::pair<int64_t, int64_t>>& runs, int64_t* next, int64_t* count, int64_t topk) {
  std::fill(next, next + topk, -1);
  std::fill(count, count + topk, 0);
  if (len == 0) return;
  const int64_t size = hi - lo;
  const bool sampled = size > max_support;
  const int64_t m = sampled ? max_support : size;
  runs.clear();
  int64_t cur = -1, c = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t j = sampled ? lo + (i * size) / m : lo + i;
    const int64_t p = s.sa[j];
    if (!s.counts(p, len, es, ee)) continue;
    const int64_t t = s.tok(p + len);
    if (t == cur) {
      ++c;
    } else {
      if (c) runs.emplace_back(-c, cur);
      cur = t;
      c = 1;
    }
  }
  if (c) runs.emplace_back(-c, cur);
  const int64_t k = std::min<int64_t>(topk, runs.size());
  std::partial_sort(runs.begin(), runs.begin() + k, runs.end());
  for (int64_t r = 0; r < k; ++r) {
    next[r] = runs[r].second;
    count[r] = sampled ? (-runs[r].first * size + m / 2) / m : -runs[r].first;
  }
}

template <typename T>
void lookup_chunk(const Shard<T>& s, const int64_t* q, const int64_t* excl, int64_t eos, int64_t max_len,
                  int64_t max_support, int64_t c0, int64_t c1, const Out& out) {
  std::vector<std::pair<int64_t, int64_t>> runs;
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
      top_next(s, lo, hi, len, es, ee, max_support, runs, out.next + i * out.topk, out.count + i * out.topk, out.topk);
    }
  }
}

template <typename T>
void lookup_all(const at::Tensor& text, const at::Tensor& sa, const at::Tensor& first, const at::Tensor& query,
                const at::Tensor& excl, int64_t eos, int64_t max_len, int64_t max_support, const Out& out) {
  const Shard<T> s{text.data_ptr<T>(), reinterpret_cast<const uint32_t*>(sa.data_ptr<int32_t>()), text.numel(),
                   first.data_ptr<int64_t>(), first.numel() - 1};
  const int64_t* q = query.data_ptr<int64_t>();
  const int64_t* ex = excl.numel() ? excl.data_ptr<int64_t>() : nullptr;
  const int64_t n = query.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t a, int64_t b) {
    for (int64_t c = a; c < b; ++c)
      lookup_chunk(s, q, ex, eos, max_len, max_support, c * kChunk, std::min(n, (c + 1) * kChunk), out);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> index_lookup_cpu(const at::Tensor& text_in, const at::Tensor& sa_in,
                                                                 const at::Tensor& first_in, const at::Tensor& query_in,
                                                                 const at::Tensor& excl_in, int64_t eos, int64_t max_len,
                                                                 int64_t topk, int64_t max_support) {
  const auto st = text_in.scalar_type();
  TORCH_CHECK(st == at::kShort || st == at::kInt, "index_lookup: text must be int16 (uint16 ids) or int32");
  TORCH_CHECK(sa_in.scalar_type() == at::kInt && sa_in.numel() == text_in.numel(), "index_lookup: sa must be int32 like text");
  TORCH_CHECK(first_in.scalar_type() == at::kLong && first_in.dim() == 1 && first_in.numel() >= 2, "index_lookup: bad first");
  TORCH_CHECK(query_in.scalar_type() == at::kLong && query_in.dim() == 1, "index_lookup: query must be 1-D int64");
  const int64_t n = query_in.numel();
  TORCH_CHECK(excl_in.scalar_type() == at::kLong && excl_in.dim() == 2 && excl_in.size(1) == 2 &&
                  (excl_in.size(0) == 0 || excl_in.size(0) == n),
              "index_lookup: excl must be int64 (N, 2) or (0, 2)");
  TORCH_CHECK(max_len >= 1 && topk >= 1 && max_support >= 1, "index_lookup: max_len, topk, max_support must be >= 1");
  const at::Tensor text = text_in.contiguous(), sa = sa_in.contiguous(), first = first_in.contiguous();
  const at::Tensor query = query_in.contiguous(), excl = excl_in.contiguous();
  at::Tensor len = at::zeros({n}, query.options().dtype(at::kInt));
  at::Tensor next = at::empty({n, topk}, query.options());
  at::Tensor count = at::empty({n, topk}, query.options());
  const Out out{len.data_ptr<int32_t>(), next.data_ptr<int64_t>(), count.data_ptr<int64_t>(), topk};
  if (st == at::kShort) {
    lookup_all<int16_t>(text, sa, first, query, excl, eos, max_len, max_support, out);
  } else {
    lookup_all<int32_t>(text, sa, first, query, excl, eos, max_len, max_support, out);
  }
  return {len, next, count};
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Calls f(doc, hash) for every n-gram inside each document (documents end at the next start).
template <typename F>
void for_ngrams(const at::Tensor& tokens, const at::Tensor& starts, int64_t n, F&& f) {
  const int64_t* t = tokens.data_ptr<int64_t>();
  const int64_t* st = starts.data_ptr<int64_t>();
  const int64_t docs = starts.numel(), total = tokens.numel();
  at::parallel_for(0, docs, 16, [&](int64_t a, int64_t b) {
    for (int64_t d = a; d < b; ++d) {
      const int64_t s = st[d], e = (d + 1 < docs ? st[d + 1] : total) - 1;  // final eos excluded
      for (int64_t i = s; i + n <= e; ++i) {
        uint64_t h = 0x9e3779b97f4a7c15ULL;
        for (int64_t k = 0; k < n; ++k) h = mix64(h ^ static_cast<uint64_t>(t[i + k] + 1));
        if (!f(d, static_cast<int64_t>(h))) break;
      }
    }
  });
}

void check_docs(const at::Tensor& tokens, const at::Tensor& starts, int64_t n) {
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.dim() == 1 && tokens.is_contiguous(), "tokens must be int64 1-D");
  TORCH_CHECK(starts.scalar_type() == at::kLong && starts.dim() == 1 && starts.is_contiguous(), "starts must be int64 1-D");
  TORCH_CHECK(n >= 1, "n must be >= 1");
}

at::Tensor ngram_hashes_cpu(const at::Tensor& tokens, const at::Tensor& starts, int64_t n) {
  check_docs(tokens, starts, n);
  const int64_t docs = starts.numel(), total = tokens.numel();
  const int64_t* st = starts.data_ptr<int64_t>();
  std::vector<int64_t> offset(docs + 1, 0);
  for (int64_t d = 0; d < docs; ++d) {
    const int64_t e = (d + 1 < docs ? st[d + 1] : total) - 1;
    offset[d + 1] = offset[d] + std::max<int64_t>(0, e - st[d] - n + 1);
  }
  at::Tensor out = at::empty({offset[docs]}, tokens.options());
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
  for_ngrams(tokens, starts, n, [&](int64_t d, int64_t h) {
    op[fill[d]++] = h;
    return true;
  });
  return out;
}

at::Tensor docs_with_ngrams_cpu(const at::Tensor& tokens, const at::Tensor& starts, int64_t n, const at::Tensor& hashes) {
  check_docs(tokens, starts, n);
  TORCH_CHECK(hashes.scalar_type() == at::kLong && hashes.dim() == 1 && hashes.is_contiguous(), "hashes must be int64 1-D");
  at::Tensor hit = at::zeros({starts.numel()}, tokens.options().dtype(at::kBool));
  bool* hp = hit.data_ptr<bool>();
  const int64_t* hs = hashes.data_ptr<int64_t>();
  const int64_t nh = hashes.numel();
  for_ngrams(tokens, starts, n, [&](int64_t d, int64_t h) {
    if (std::binary_search(hs, hs + nh, h)) {
      hp[d] = true;
      return false;
    }
    return true;
  });
  return hit;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("index_lookup(Tensor text, Tensor sa, Tensor first, Tensor query, Tensor excl, int eos, int max_len, "
        "int topk, int max_support) -> (Tensor, Tensor, Tensor)");
  m.def("ngram_hashes(Tensor tokens, Tensor starts, int n) -> Tensor");
  m.def("docs_with_ngrams(Tensor tokens, Tensor starts, int n, Tensor hashes) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("index_lookup", &index_lookup_cpu);
  m.impl("ngram_hashes", &ngram_hashes_cpu);
  m.impl("docs_with_ngrams", &docs_with_ngrams_cpu);
}

}  // namespace tscale
