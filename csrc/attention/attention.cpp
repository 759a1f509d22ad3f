// Op schemas of the fused attention kernels (CUDA only; the kernels live in attention_fwd.cu / attention_bwd.cu).
//
// attention_fwd_cuda(q, k, v, doc_ids, window, sink, scale) -> (out, lse)
//   q, k, v  bf16 (B, H, T, D), D 64 or 128, last dim contiguous (other layouts are copied)
//   doc_ids  int32 (B, T) or None; window 0 = unlimited; sink adds a null slot (logit 0, value 0)
//   out      bf16 (B, H, T, D) in (B, T, H, D) storage; lse fp32 (B, H, T), natural-log logsumexp of each
//            row's scaled logits including the sink's 0 (+inf for a row with no visible key and no sink)
// attention_bwd_cuda(dout, q, k, v, out, lse, doc_ids, window, sink, scale) -> (dq, dk, dv), bf16, each
//   (B, H, T, D) in (B, T, H, D) storage like out
// Query p sees key j iff j <= p, p - j < window (window 0: no limit), doc_ids[j] == doc_ids[p].
// The Python door is tscale/ops/attention.py, which also holds the reference semantics.
// This file compiles without CUDA: a CPU build defines the schemas and no kernel.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("attention_fwd_cuda(Tensor q, Tensor k, Tensor v, Tensor? doc_ids, int window, bool sink, float scale) "
        "-> (Tensor out, Tensor lse)");
  m.def("attention_bwd_cuda(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? doc_ids, "
        "int window, bool sink, float scale) -> (Tensor dq, Tensor dk, Tensor dv)");
}
