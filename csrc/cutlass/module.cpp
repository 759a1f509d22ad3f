// tscale._C_cutlass: tscale's CUTLASS kernels, a module of its own because it is built only where CUTLASS's
// headers are found, and for sm_90a instead of sm_90 (setup.py). Importing it registers its ops.
#include <torch/extension.h>

namespace tscale {

// int8_gemm_sm80.cu / int8_gemm_sm90.cu
at::Tensor int8_scaled_mm_sm80(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                               const at::Tensor& scale_b);
at::Tensor int8_scaled_mm_sm90(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                               const at::Tensor& scale_b);

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("int8_scaled_mm_sm80(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor");
  m.def("int8_scaled_mm_sm90(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("int8_scaled_mm_sm80", &int8_scaled_mm_sm80);
  m.impl("int8_scaled_mm_sm90", &int8_scaled_mm_sm90);
}

}  // namespace tscale

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tscale's CUTLASS kernels: int8 products with their scales in the epilogue (sm_80+, sm_90a)";
}
