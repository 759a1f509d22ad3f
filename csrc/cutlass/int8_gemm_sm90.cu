// int8 x int8 -> bf16 with per-row and per-column scales in the epilogue, for sm_90a (CUTLASS 3: TMA + wgmma).
//
//   out (M, N) = (float(a (M, K) @ b (K, N)) * scale_a[m]) * scale_b[n], rounded once to bf16
//
// The tensor cores sum the int8 products exactly in int32; the epilogue converts each sum to
// fp32 and applies the two scales in the reference's order, so no int32 tensor is written
// and no second pass reads one (cuBLASLt takes int8 inputs only with an int32 or int8 output).
// a row-major, b column-major (the bytes of a row-major (N, K) weight), K % 16 == 0,
// N % 8 == 0, 16-byte aligned; scale_a (M) and scale_b (N) contiguous float32.
//
// Part of tscale._C_cutlass (module.cpp), whose sm_90 code is built for sm_90a.
#include "int8_gemm_sm90.h"

namespace tscale {
namespace {

using namespace cute;
using sm90::ScaledGemm;
using sm90::run;

// Large M: each of two consumer warp groups owns a 128 x 128 tile, one's epilogue running under the
// other's mainloop (ping-pong), clusters of 2 x 1 sharing B's loads. On the H200 it ran the 1.5B
// model's four products at 1.22-1.30 PFLOP/s, against 0.88-1.12 for two warp groups sharing one
// tile (cooperative), which is candidate 1 of int8_gemm_sm90_candidates.cu (docs/BENCHMARKS.md).
// Small M (decoding, M <= 64): one warp group per 64-row tile, the two ping-ponging likewise.
using LargeM = ScaledGemm<Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                          cutlass::epilogue::TmaWarpSpecialized>;
using SmallM = ScaledGemm<Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                          cutlass::epilogue::TmaWarpSpecialized>;

}  // namespace

at::Tensor int8_scaled_mm_sm90(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                               const at::Tensor& scale_b) {
  return int8_scaled_mm("int8_scaled_mm_sm90", a, b, scale_a, scale_b, 9, 0, /*same_major=*/true,
                        /*small_m=*/64, run<SmallM>, run<LargeM>);
}

}  // namespace tscale
