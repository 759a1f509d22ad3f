// The head's cross-entropy kernel of csrc/loss, compiled for the CPU emulator of tests/attention_emu (tests only).
//
// softcap_xent_grad takes CPU tensors and runs the very kernel source of the CUDA build, thread by thread;
// tests/test_head_loss.py builds this with torch.utils.cpp_extension.load and compares it with the reference twin.
#include <torch/extension.h>

#include "loss_emu_backend.h"

#include "softcap_xent_kernel.cuh"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softcap_xent_grad", &tscale::xent::softcap_xent_grad_host);
  m.def("set_seed", [](uint64_t seed) { emu::rt().rng.seed(seed); });
}
