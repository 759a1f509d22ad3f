// The Python module tscale._C. Ops register themselves with the dispatcher through
// TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL in their own folders; importing this module
// loads them, after which they are reachable as torch.ops.tscale.<name>.
#include <torch/extension.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "TScale kernels; reach them through tscale.ops";
#ifdef TSCALE_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
