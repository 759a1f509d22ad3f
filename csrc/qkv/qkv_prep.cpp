// Op schema of the attention-input kernel (CUDA only; the kernel lives in qkv_prep_kernel.cuh, registered by
// qkv_prep_cuda.cu). The Python door and the reference twin are tscale/ops/qkv_prep.py.
//
// qkv_prep(qkv, cos, sin, eps, norm, rope) -> (q, k, v)
//   qkv bf16 (B, T, 3, H, D) contiguous, D 64 or 128; cos, sin float32 (T, D) contiguous
//   q, k: RMS-normalised over D (norm) and rotated by RoPE at their position t < T (rope); v copied; each (B, T, H, D)
// qkv_prep_backward(dq, dk, dv, qkv, cos, sin, eps, norm, rope) -> dqkv (B, T, 3, H, D)
// This file compiles without CUDA: a CPU build defines the schema and no kernel.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("qkv_prep(Tensor qkv, Tensor cos, Tensor sin, float eps, bool norm, bool rope) -> (Tensor, Tensor, Tensor)");
  m.def("qkv_prep_backward(Tensor dq, Tensor dk, Tensor dv, Tensor qkv, Tensor cos, Tensor sin, float eps, "
        "bool norm, bool rope) -> Tensor");
}
