// CUDA registration of tscale::attention_fwd_cuda (the kernel and its host entry are in attention_fwd.cuh).
#include <torch/library.h>

#include "attention_cuda_backend.cuh"
#include "attention_fwd.cuh"

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("attention_fwd_cuda", &tscale::attn::attention_fwd_host); }
