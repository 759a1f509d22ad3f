// N-gram overlap between documents, for decontamination (op schemas + CPU kernels).
//
// ngram_hashes(tokens, starts, n) -> int64 hashes of every n-gram inside a document (its final
//   eos excluded); docs_with_ngrams(tokens, starts, n, sorted_hashes) -> bool (D,): the documents
//   with at least one n-gram whose hash is in sorted_hashes.
// Reference twins: tscale/ops/index.py (exact n-gram sets).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tscale {
namespace {

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
  m.def("ngram_hashes(Tensor tokens, Tensor starts, int n) -> Tensor");
  m.def("docs_with_ngrams(Tensor tokens, Tensor starts, int n, Tensor hashes) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("ngram_hashes", &ngram_hashes_cpu);
  m.impl("docs_with_ngrams", &docs_with_ngrams_cpu);
}

}  // namespace tscale
