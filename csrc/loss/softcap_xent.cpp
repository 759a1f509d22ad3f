// Op schema of the head's cross-entropy kernel (CUDA only; the kernel lives in softcap_xent_cuda.cu).
//
// softcap_xent_grad(logits, targets, vocab_size, softcap, scale) -> (losses, grad)
//   logits   bf16 (N, V_padded), rows contiguous, V_padded a multiple of 8
//   targets  int64 (N,), each in [0, vocab_size); a row whose target is outside gets loss NaN
//   z        = softcap * tanh(logits / softcap) over the first vocab_size columns (logits when softcap is 0)
//   losses   fp32 (N,): logsumexp(z) - z[target]
//   grad     bf16 (N, V_padded): scale * d losses / d logits = scale * (softmax(z) - onehot(target)) * dz/dlogits
//            in the first vocab_size columns, 0 in the padding columns
// One kernel makes both (each row read twice, the second time from L2); the Python door and the reference
// twin are tscale/ops/head_loss.py.
// This file compiles without CUDA: a CPU build defines the schema and no kernel.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("softcap_xent_grad(Tensor logits, Tensor targets, int vocab_size, float softcap, float scale) "
        "-> (Tensor losses, Tensor grad)");
}
