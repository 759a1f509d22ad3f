// CUDA registration of tscale::attention_bwd_cuda (the kernels and their host entry are in attention_bwd.cuh).
#include <torch/library.h>

#include "attention_cuda_backend.cuh"
#include "attention_bwd.cuh"

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("attention_bwd_cuda", &tscale::attn::attention_bwd_host); }
