// CUDA registration of tscale::qkv_prep and its backward (schema: qkv_prep.cpp; the kernels: qkv_prep_kernel.cuh).
#include <torch/library.h>

#include "../attention/attention_cuda_backend.cuh"
#include "qkv_prep_kernel.cuh"

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("qkv_prep", &tscale::qkv::qkv_prep_host);
  m.impl("qkv_prep_backward", &tscale::qkv::qkv_prep_backward_host);
}
