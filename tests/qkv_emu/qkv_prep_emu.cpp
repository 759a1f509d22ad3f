// The attention-input kernels of csrc/qkv, compiled for the CPU emulator of tests/attention_emu (tests only).
//
// qkv_prep / qkv_prep_backward take CPU tensors and run the very kernel source of the CUDA build, thread by thread;
// tests/test_qkv_prep.py builds this with torch.utils.cpp_extension.load and compares it with the reference twin.
#include <torch/extension.h>

#include "emu_backend.h"

#include "qkv_prep_kernel.cuh"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("qkv_prep", &tscale::qkv::qkv_prep_host);
  m.def("qkv_prep_backward", &tscale::qkv::qkv_prep_backward_host);
  m.def("set_seed", [](uint64_t seed) { emu::rt().rng.seed(seed); });
}
