// Witten-Bell backoff over the index's lookups at several match caps (op schema + CPU kernel).
//
// index_backoff(lens, next, count, vocab, topk, scale)
//   lens int32 (C, N), next int64 (C, N, k), count int64 (C, N, k): index_lookup's results for the
//     same N positions with C match caps, longest cap first (next -1 / count 0 where fewer than k)
//   -> next int64 (N, topk), weight int64 (N, topk): the topk most probable tokens of the
//      interpolated distribution, most probable first (ties: smaller id first), and
//      floor(p * scale); -1 / 0 where fewer tokens have a weight of at least 1.
//   The distribution, per position: starting from the uniform 1 / vocab, every level whose context
//   is longer than the last one taken (lens greater, and some count) replaces p with
//   (count(v) + u p(v)) / (n + u), n the sum of its counts and u how many tokens they list.
//   Expanded longest level first, p(v) = sum_l coef_l count_l(v) + rest / vocab with
//   coef_l = prod_{m longer than l} (u_m / (n_m + u_m)) / (n_l + u_l) and rest the product of all
//   u / (n + u): that sum, in that order (levels longest first, entries in list order, then the
//   uniform part) is what the kernel and the reference twin both compute in double precision.
// Reference twin: tscale/ops/index.py (index_backoff_reference).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tscale {
namespace {

std::tuple<at::Tensor, at::Tensor> index_backoff_cpu(const at::Tensor& lens, const at::Tensor& next,
                                                     const at::Tensor& count, int64_t vocab, int64_t topk,
                                                     int64_t scale) {
  TORCH_CHECK(lens.scalar_type() == at::kInt && lens.dim() == 2 && lens.is_contiguous(), "lens must be int32 (C, N)");
  TORCH_CHECK(next.scalar_type() == at::kLong && next.dim() == 3 && next.is_contiguous(), "next must be int64 (C, N, k)");
  TORCH_CHECK(count.scalar_type() == at::kLong && count.sizes() == next.sizes() && count.is_contiguous(),
              "count must be int64 with next's shape");
  TORCH_CHECK(next.size(0) == lens.size(0) && next.size(1) == lens.size(1), "lens and next disagree on (C, N)");
  TORCH_CHECK(vocab >= 1 && topk >= 1 && scale >= 1 && scale <= (int64_t{1} << 32),
              "vocab and topk must be >= 1, scale in [1, 2^32]");
  const int64_t levels = next.size(0), n = next.size(1), k = next.size(2);
  at::Tensor out_next = at::full({n, topk}, -1, next.options());
  at::Tensor out_weight = at::zeros({n, topk}, next.options());
  const int32_t* lp = lens.data_ptr<int32_t>();
  const int64_t* np_ = next.data_ptr<int64_t>();
  const int64_t* cp = count.data_ptr<int64_t>();
  int64_t* on = out_next.data_ptr<int64_t>();
  int64_t* ow = out_weight.data_ptr<int64_t>();
  at::parallel_for(0, n, 4096, [&](int64_t a, int64_t b) {
    std::vector<double> dense(vocab, 0.0);  // this chunk's scratch distribution, zero between positions
    std::vector<int64_t> touched;
    std::vector<int64_t> taken;             // the levels taken at this position, longest first
    std::vector<double> total(levels), listed(levels);
    touched.reserve(levels * k);
    for (int64_t i = a; i < b; ++i) {
      taken.clear();
      int64_t seen = 0;
      for (int64_t c = levels - 1; c >= 0; --c) {  // shortest cap first: which levels add a longer context
        double sum = 0, distinct = 0;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t t = np_[(c * n + i) * k + j], w = cp[(c * n + i) * k + j];
          if (t >= 0 && t < vocab && w > 0) {
            sum += static_cast<double>(w);
            distinct += 1;
          }
        }
        const int64_t len = lp[c * n + i];
        if (len > seen && sum > 0) {
          taken.push_back(c);
          total[c] = sum;
          listed[c] = distinct;
          seen = len;
        }
      }
      double mult = 1.0;
      touched.clear();
      for (auto it = taken.rbegin(); it != taken.rend(); ++it) {  // longest first
        const int64_t c = *it;
        const double coef = mult / (total[c] + listed[c]);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t t = np_[(c * n + i) * k + j], w = cp[(c * n + i) * k + j];
          if (t < 0 || t >= vocab || w <= 0) continue;
          if (dense[t] == 0.0) touched.push_back(t);
          dense[t] += coef * static_cast<double>(w);
        }
        mult *= listed[c] / (total[c] + listed[c]);
      }
      const double uniform = mult / static_cast<double>(vocab);
      const int64_t keep = std::min<int64_t>(topk, static_cast<int64_t>(touched.size()));
      auto more_probable = [&](int64_t x, int64_t y) { return dense[x] != dense[y] ? dense[x] > dense[y] : x < y; };
      std::partial_sort(touched.begin(), touched.begin() + keep, touched.end(), more_probable);
      for (int64_t j = 0, slot = 0; j < keep; ++j) {
        const int64_t t = touched[j];
        const auto w = static_cast<int64_t>(std::floor((dense[t] + uniform) * static_cast<double>(scale)));
        if (w < 1) break;
        on[i * topk + slot] = t;
        ow[i * topk + slot] = w;
        ++slot;
      }
      for (const int64_t t : touched) dense[t] = 0.0;
    }
  });
  return {out_next, out_weight};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("index_backoff(Tensor lens, Tensor next, Tensor count, int vocab, int topk, int scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("index_backoff", &index_backoff_cpu);
}

}  // namespace tscale
