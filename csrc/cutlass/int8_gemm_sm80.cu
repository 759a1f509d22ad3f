// int8 x int8 -> bf16 with per-row and per-column scales in the epilogue, for sm_80 and newer (CUTLASS 2: mma.sync).
//
//   out (M, N) = (float(a (M, K) @ b (K, N)) * scale_a[m]) * scale_b[n], rounded once to bf16
//
// The Ampere / Ada form of int8_gemm_sm90.cu (the RTX 4090 runs int8 tensor cores at four times
// its bf16 rate): a multistage cp.async mainloop on m16n8k32 int8 mma.sync with exact int32 sums,
// and an epilogue visitor tree that scales the sums in fp32, in the reference's order, before the
// bf16 store. Same operand rules (int8_gemm_common.h). Part of tscale._C_cutlass (module.cpp).
#include <torch/extension.h>

#include "int8_gemm_common.h"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal.h>  // before the visitors, which use its types
#include <cutlass/epilogue/threadblock/fusion/visitors.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/default_gemm_universal_with_visitor.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

namespace tscale {
namespace {

using namespace cute;
namespace visitor = cutlass::epilogue::threadblock;
using cutlass::gemm::GemmShape;

using ElementD = cutlass::bfloat16_t;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
constexpr int kEpilogueStages = 1;

template <class ThreadblockShape, class WarpShape, int kStages>
struct ScaledGemm {
  using ThreadMap = visitor::OutputTileThreadLayout<ThreadblockShape, WarpShape, ElementD, 8, kEpilogueStages>;
  using ScaleA = visitor::VisitorColBroadcast<ThreadMap, float, Stride<_1, _0, int32_t>>;  // one per row m
  using ScaleB = visitor::VisitorRowBroadcast<ThreadMap, float, Stride<_0, _1, int32_t>>;  // one per column n
  using AccTimesScaleA = visitor::Sm80EVT<visitor::VisitorCompute<cutlass::multiplies, float, float, kRound>,
                                          visitor::VisitorAccFetch, ScaleA>;
  using Scaled = visitor::Sm80EVT<visitor::VisitorCompute<cutlass::multiplies, ElementD, float, kRound>,
                                  AccTimesScaleA, ScaleB>;
  using Store = visitor::VisitorAuxStore<ThreadMap, ElementD, kRound, Stride<int64_t, _1, int64_t>>;
  using Epilogue = visitor::Sm80EVT<Store, Scaled>;

  using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 16,     // A (M, K)
      int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16,  // B (K, N) stored as (N, K)
      ElementD, cutlass::layout::RowMajor, 8,
      int32_t, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      ThreadblockShape, WarpShape, GemmShape<16, 8, 32>, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, kStages,
      cutlass::arch::OpMultiplyAddSaturate, kEpilogueStages>::GemmKernel;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Large M: 128 x 128 tiles, four warps of 64 x 64. Small M (decoding): 32-row tiles, so few
// tokens do not pay for a 128-row tile.
using LargeM = ScaledGemm<GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 5>;
using SmallM = ScaledGemm<GemmShape<32, 128, 64>, GemmShape<32, 64, 64>, 5>;

template <class Config>
void run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
         at::Tensor& out) {
  using Gemm = typename Config::Gemm;
  const int M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1)), N = static_cast<int>(b.size(1));
  // each node's children, then its own arguments: {{{acc, scale_a, *}, scale_b, *}, store}
  typename Config::Epilogue::Arguments epilogue{
      {{{}, {scale_a.data_ptr<float>(), 0.f, {_1{}, _0{}, M}}, {}},
       {scale_b.data_ptr<float>(), 0.f, {_0{}, _1{}, N}},
       {}},
      {reinterpret_cast<ElementD*>(out.data_ptr()), {int64_t{N}, _1{}, int64_t{M} * N}}};
  typename Gemm::Arguments args(cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K}, 1, epilogue,
                                a.data_ptr(), b.data_ptr(), nullptr, nullptr,
                                int64_t{M} * K, int64_t{N} * K, 0, 0,  // batch strides (one batch)
                                K, K, 0, 0);                           // leading dimensions of A and B
  launch_cutlass_gemm<Gemm>("int8_scaled_mm_sm80", args, a);
}

}  // namespace

at::Tensor int8_scaled_mm_sm80(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                               const at::Tensor& scale_b) {
  return int8_scaled_mm("int8_scaled_mm_sm80", a, b, scale_a, scale_b, 8, 0, /*same_major=*/false,
                        /*small_m=*/32, run<SmallM>, run<LargeM>);
}

}  // namespace tscale
