// The token-pair table of an index shard: where each pair's block starts in the suffix array.
//
// index_pairs(text, sa, first) -> off int64 (V + 1,), next int32 (B,), start int32 (B,)
//   The B distinct token pairs (a, b) of the shard, by a then b: pair r = (a, next[r]) for
//   off[a] <= r < off[a + 1], and the suffixes starting with it are sa[start[r] : end) where end is
//   start[r + 1] inside a's block and first[a + 1] for a's last pair (`start` holds uint32 bits).
//   One pass over the suffix array (reading each suffix's second token), split over threads by
//   first token; index_lookup starts its searches here instead of bisecting
//   the first token's block. Reference twin: tscale/ops/index.py (pair_table_reference).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace tscale {
namespace {

// The pairs of first tokens [a0, a1): second tokens and block starts in order; counts into off[a + 1].
template <typename T>
void pairs_of(const T* tp, const uint32_t* sa, int64_t n, const int64_t* first, int64_t a0, int64_t a1, int64_t* off,
              std::vector<int32_t>& next, std::vector<int32_t>& start) {
  for (int64_t a = a0; a < a1; ++a) {
    int64_t prev = -1;
    for (int64_t j = first[a]; j < first[a + 1]; ++j) {
      const int64_t p = sa[j];
      if (p + 1 >= n) continue;  // the last suffix has no second token (and sorts first in its block)
      const int64_t b = static_cast<int64_t>(static_cast<std::make_unsigned_t<T>>(tp[p + 1]));
      if (b == prev) continue;
      next.push_back(static_cast<int32_t>(b));
      start.push_back(static_cast<int32_t>(static_cast<uint32_t>(j)));
      ++off[a + 1];
      prev = b;
    }
  }
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> pairs_for(const at::Tensor& text, const at::Tensor& sa, const at::Tensor& first) {
  const int64_t n = text.numel(), vocab = first.numel() - 1;
  const int64_t* fp = first.data_ptr<int64_t>();
  TORCH_CHECK(fp[vocab] == n, "index_pairs: first does not cover the shard's tokens");
  at::Tensor off = at::zeros({vocab + 1}, first.options());
  int64_t* op = off.data_ptr<int64_t>();
  // parts of about equal suffix-array length, each a run of first tokens, done in parallel
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(vocab, 4 * at::get_num_threads()));
  std::vector<int64_t> cut(parts + 1, vocab);
  cut[0] = 0;
  for (int64_t k = 1; k < parts; ++k) cut[k] = std::upper_bound(fp, fp + vocab, n * k / parts) - fp - 1;
  for (int64_t k = 1; k <= parts; ++k) cut[k] = std::max(cut[k], cut[k - 1]);
  std::vector<std::vector<int32_t>> next(parts), start(parts);
  at::parallel_for(0, parts, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      pairs_of(text.data_ptr<T>(), reinterpret_cast<const uint32_t*>(sa.data_ptr<int32_t>()), n, fp, cut[k], cut[k + 1],
               op, next[k], start[k]);
  });
  for (int64_t a = 0; a < vocab; ++a) op[a + 1] += op[a];
  at::Tensor nt = at::empty({op[vocab]}, sa.options()), stt = at::empty({op[vocab]}, sa.options());
  int32_t* np = nt.data_ptr<int32_t>();
  int32_t* sp = stt.data_ptr<int32_t>();
  for (int64_t k = 0; k < parts; ++k) {
    np = std::copy(next[k].begin(), next[k].end(), np);
    sp = std::copy(start[k].begin(), start[k].end(), sp);
  }
  return {off, nt, stt};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> index_pairs_cpu(const at::Tensor& text, const at::Tensor& sa,
                                                               const at::Tensor& first) {
  const auto st = text.scalar_type();
  TORCH_CHECK((st == at::kShort || st == at::kInt) && text.dim() == 1 && text.is_contiguous(),
              "index_pairs: text must be contiguous 1-D int16 (uint16 ids) or int32");
  TORCH_CHECK(sa.scalar_type() == at::kInt && sa.numel() == text.numel() && sa.is_contiguous(), "index_pairs: sa must be int32 like text");
  TORCH_CHECK(first.scalar_type() == at::kLong && first.dim() == 1 && first.numel() >= 2, "index_pairs: bad first");
  return text.scalar_type() == at::kShort ? pairs_for<int16_t>(text, sa, first) : pairs_for<int32_t>(text, sa, first);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("index_pairs(Tensor text, Tensor sa, Tensor first) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("index_pairs", &index_pairs_cpu);
}

}  // namespace tscale
