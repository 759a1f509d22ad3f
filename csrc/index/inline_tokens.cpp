// The inline-token table of an index shard: each suffix's third token, in suffix-array order.
//
// index_inline_tokens(text, sa) -> int16 (n,) of uint16 ids: entry j = text[sa[j] + 2], kInlineEnd (0xFFFF,
//   inline_tokens.h) standing for a position past the shard's end (so token ids stay below it; uint16 text only). index_lookup reads it
//   beside sa: a search inside a token pair's block compares offset 2 first, and where that decides a probe (the
//   first narrowing of every search of three or more tokens, and every extension of a two-token match) neither
//   sa[j] nor the text is read: one cache miss instead of two dependent ones. 2 bytes a token, built in memory on
//   first use (one pass over sa, split over threads). Reference twin: tscale/ops/index.py (inline_tokens_reference).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "inline_tokens.h"

namespace tscale {
namespace {

at::Tensor index_inline_tokens_cpu(const at::Tensor& text_in, const at::Tensor& sa_in) {
  TORCH_CHECK(text_in.scalar_type() == at::kShort && text_in.dim() == 1,
              "index_inline_tokens: text must be 1-D int16 (uint16 ids)");
  TORCH_CHECK(sa_in.scalar_type() == at::kInt && sa_in.numel() == text_in.numel(),
              "index_inline_tokens: sa must be int32 like text");
  const at::Tensor text = text_in.contiguous(), sa = sa_in.contiguous();
  const int64_t n = text.numel();
  at::Tensor out = at::empty({n}, text.options());
  const auto* tp = reinterpret_cast<const uint16_t*>(text.data_ptr<int16_t>());
  const auto* sp = reinterpret_cast<const uint32_t*>(sa.data_ptr<int32_t>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>());
  at::parallel_for(0, n, 1 << 16, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t p = sp[j];
      op[j] = p + 2 < n ? tp[p + 2] : kInlineEnd;
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("index_inline_tokens(Tensor text, Tensor sa) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("index_inline_tokens", &index_inline_tokens_cpu);
}

}  // namespace tscale
