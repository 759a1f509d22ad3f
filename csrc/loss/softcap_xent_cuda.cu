// The head's cross-entropy and its gradient in one pass over bf16 logits, on CUDA (schema: softcap_xent.cpp;
// the kernel: softcap_xent_kernel.cuh).
#include <torch/library.h>

#include "softcap_xent_cuda_backend.cuh"
#include "softcap_xent_kernel.cuh"

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("softcap_xent_grad", &tscale::xent::softcap_xent_grad_host); }
