// Streaming longest-match lookup in one index shard (op schema + CPU kernel).
//
// index_lookup_levels(text, sa, first, pair_off, pair_next, pair_start, query, excl, eos, caps, topk, max_support)
//   caps  the match caps, strictly descending (>= 1); level l of each result is capped at caps[l],
//         and max_len below is caps[0] (tscale.ops.index.index_lookup is the one-cap case)
//   text  int16 (uint16 ids) or int32 (n,): the shard's tokens; sa int32 (n,): uint32 suffix array
//   first int64 (V + 1,): suffixes starting with token a are sa[first[a] : first[a + 1]]
//   pair_*: the token-pair table of index_pairs (csrc/index/pairs.cpp)
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
//   binary-searching the whole remaining pattern (shard_search.h). Next-token counts: next_counts.h.
//   The query is cut into independent chunks, each warmed up on the max_len positions before it, so
//   results do not depend on the chunking. Threads take runs of chunks; on each thread kStreams
//   chunks are looked up at once, interleaved (interleave.h), so that their cache misses overlap.
//   Levels: only caps[0] streams; a shorter cap reuses its results where the match fits under it
//   and searches its own c tokens where it does not (see shorter_levels).
// Reference twins: tscale/ops/index.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "next_counts.h"

namespace tscale::index {
namespace {

constexpr int64_t kMaxChunk = 16384, kMinChunk = 1024;  // query tokens a chunk; its warm-up is max_len more
constexpr int64_t kStreamsDefault = 8;  // chunks interleaved on a thread

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

// Levels 1.. at position i, from level 0's match of `len` tokens ending before `end`: existence is
// monotone in the length, so a level capped at c >= len has the same match (its results are copied)
// and one capped below it matches exactly c tokens, searched directly.
template <typename T>
Task<void> shorter_levels(const Shard<T>& s, Counter<T>& counter, const int64_t* end, int64_t len, int64_t es,
                          int64_t ee, int64_t i, const Out& out) {
  const int64_t k = out.topk;
  for (size_t l = 1; l < out.caps.size(); ++l) {
    const int64_t c = out.caps[l], at = static_cast<int64_t>(l) * out.n + i;
    if (len <= c) {
      out.len[at] = out.len[i];
      std::copy(out.next + i * k, out.next + (i + 1) * k, out.next + at * k);
      std::copy(out.count + i * k, out.count + (i + 1) * k, out.count + at * k);
    } else {
      int64_t lo = 0, hi = 0;
      const int64_t got = co_await s.longest(end, c, es, ee, lo, hi);
      out.len[at] = static_cast<int32_t>(got);
      counter.run(lo, hi, got, es, ee, out.next + at * k, out.count + at * k);
    }
  }
}

// Positions [c0, c1) of the query, streaming from c0 - max_len.
template <typename T>
Task<void> lookup_chunk(const Shard<T>& s, Counter<T>& counter, const int64_t* q, const int64_t* excl, int64_t eos,
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
    if (!done) len = co_await s.longest(q + i + 1, std::min(start, cap), es, ee, lo, hi);
    if (i >= c0) {
      out.len[i] = static_cast<int32_t>(len);
      counter.run(lo, hi, len, es, ee, out.next + i * out.topk, out.count + i * out.topk);
      if (out.caps.size() > 1) co_await shorter_levels(s, counter, q + i + 1, len, es, ee, i, out);
    }
  }
}

template <typename T>
Shard<T> make_shard(const at::Tensor& text, const at::Tensor& sa, const at::Tensor& first, const at::Tensor& off,
                    const at::Tensor& next, const at::Tensor& start) {
  return {text.data_ptr<T>(), reinterpret_cast<const uint32_t*>(sa.data_ptr<int32_t>()), text.numel(),
          first.data_ptr<int64_t>(), first.numel() - 1, off.data_ptr<int64_t>(), next.data_ptr<int32_t>(),
          reinterpret_cast<const uint32_t*>(start.data_ptr<int32_t>())};
}

// Chunks of at most kMaxChunk tokens, at least kMinChunk, enough for every thread's streams where the
// query is long enough; a thread's run of chunks is looked up kStreams at a time, interleaved.
template <typename T>
void lookup_all(const Shard<T>& s, const at::Tensor& query, const at::Tensor& excl, int64_t eos, int64_t max_support,
                const Out& out) {
  const int64_t max_len = out.caps[0];
  const int64_t* q = query.data_ptr<int64_t>();
  const int64_t* ex = excl.numel() ? excl.data_ptr<int64_t>() : nullptr;
  const int64_t n = query.numel();
  const char* env = std::getenv("TSCALE_INDEX_STREAMS");
  const int64_t kStreams = env ? std::atoi(env) : kStreamsDefault;
  const int64_t wanted = at::get_num_threads() * kStreams;
  const int64_t size = std::clamp((n + wanted - 1) / wanted, kMinChunk, kMaxChunk);
  const int64_t chunks = (n + size - 1) / size;
  at::parallel_for(0, chunks, 1, [&](int64_t a, int64_t b) {
    CountCache cache(out.topk);
    std::vector<Counter<T>> counters;
    for (int64_t k = 0; k < std::min(kStreams, b - a); ++k) counters.emplace_back(s, cache, out.topk, max_support);
    interleave::run_interleaved(b - a, kStreams, [&](int64_t job, int64_t slot) {
      const int64_t c = a + job;
      return lookup_chunk(s, counters[slot], q, ex, eos, max_len, c * size, std::min(n, (c + 1) * size), out);
    });
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
    const at::Tensor& pnext_in, const at::Tensor& pstart_in, const at::Tensor& query_in, const at::Tensor& excl_in,
    int64_t eos, at::IntArrayRef caps_in, int64_t topk, int64_t max_support) {
  const at::Tensor text = text_in.contiguous(), sa = sa_in.contiguous(), first = first_in.contiguous();
  check_shard(text, sa, first);
  const at::Tensor off = off_in.contiguous(), pnext = pnext_in.contiguous(), pstart = pstart_in.contiguous();
  TORCH_CHECK(off.scalar_type() == at::kLong && off.numel() == first.numel(), "index_lookup: pair_off must be int64 like first");
  TORCH_CHECK(pnext.scalar_type() == at::kInt && pstart.scalar_type() == at::kInt && pnext.numel() == pstart.numel(),
              "index_lookup: pair_next and pair_start must be int32 of one length");
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
    lookup_all(make_shard<int16_t>(text, sa, first, off, pnext, pstart), query, excl, eos, max_support, out);
  } else {
    lookup_all(make_shard<int32_t>(text, sa, first, off, pnext, pstart), query, excl, eos, max_support, out);
  }
  return {len, next, count};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("index_lookup_levels(Tensor text, Tensor sa, Tensor first, Tensor pair_off, Tensor pair_next, "
        "Tensor pair_start, Tensor query, Tensor excl, int eos, int[] caps, int topk, int max_support) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("index_lookup_levels", &index_lookup_levels_cpu);
}

}  // namespace tscale::index
