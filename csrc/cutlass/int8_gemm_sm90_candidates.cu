// Other Hopper configurations of the int8 product, to time against the one int8_gemm_sm90.cu uses.
//
//   tscale::int8_scaled_mm_sm90_candidate(a, b, scale_a, scale_b, config) -> out (M, N) bf16
//
// Same operands, rules and result as int8_scaled_mm_sm90 (the same epilogue), one fixed
// configuration per `config`:
//   1  128 x 128 x 128 tile, cluster 2 x 1, cooperative (two warp groups sharing the tile; the
//      configuration int8_gemm_sm90.cu used before its ping-pong one)
//   2  256 x 128 x 128 tile, cluster 2 x 1, cooperative (two warp groups of 128 x 128)
//   3  128 x 256 x 128 tile, cluster 1 x 2, cooperative
// Built only with TSCALE_CUTLASS_CANDIDATES=1 (setup.py): each configuration adds minutes of
// compilation, and scripts/bench/lowprec_gemm.py is their only caller.
#include "int8_gemm_sm90.h"

namespace tscale {
namespace {

using namespace cute;
using sm90::ScaledGemm;
using sm90::run;

using Coop128 = ScaledGemm<Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                           cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                           cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Coop256x128 = ScaledGemm<Shape<_256, _128, _128>, Shape<_2, _1, _1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Coop128x256 = ScaledGemm<Shape<_128, _256, _128>, Shape<_1, _2, _1>,
                               cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                               cutlass::epilogue::TmaWarpSpecializedCooperative>;

at::Tensor int8_scaled_mm_sm90_candidate(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                                         const at::Tensor& scale_b, int64_t config) {
  const char* name = "int8_scaled_mm_sm90_candidate";
  switch (config) {
    case 1: return int8_scaled_mm(name, a, b, scale_a, scale_b, 9, 0, true, 0, run<Coop128>, run<Coop128>);
    case 2: return int8_scaled_mm(name, a, b, scale_a, scale_b, 9, 0, true, 0, run<Coop256x128>, run<Coop256x128>);
    case 3: return int8_scaled_mm(name, a, b, scale_a, scale_b, 9, 0, true, 0, run<Coop128x256>, run<Coop128x256>);
    default: TORCH_CHECK(false, name, ": config must be 1, 2 or 3, got ", config);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("int8_scaled_mm_sm90_candidate(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, int config) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("int8_scaled_mm_sm90_candidate", &int8_scaled_mm_sm90_candidate);
}

}  // namespace tscale
