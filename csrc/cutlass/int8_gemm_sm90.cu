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
#include <torch/extension.h>

#include "int8_gemm_common.h"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

namespace tscale {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

using ElementD = cutlass::bfloat16_t;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;


// One kernel configuration: CTA tile, cluster, and the warp-specialised schedules of mainloop and epilogue.
template <class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct ScaledGemm {
  using ScaleA = fusion::Sm90ColBroadcast<0, TileShape, float>;  // one value per row m, broadcast along n
  using ScaleB = fusion::Sm90RowBroadcast<0, TileShape, float>;  // one value per column n, broadcast along m
  using AccTimesScaleA = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
                                         fusion::Sm90AccFetch, ScaleA>;
  using Epilogue = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, ElementD, float, kRound>,
                                   AccTimesScaleA, ScaleB>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float,
      void, cutlass::layout::RowMajor, 8,       // no C operand
      ElementD, cutlass::layout::RowMajor, 8,   // D: bf16, 16-byte rows
      EpilogueSchedule, Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      int8_t, cutlass::layout::RowMajor, 16,     // A (M, K), K-major
      int8_t, cutlass::layout::ColumnMajor, 16,  // B (K, N) stored as (N, K), K-major
      int32_t, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// Large M: two consumer warp groups share a 128 x 128 tile. Small M (decoding, M <= 64): one
// warp group per 64-row tile, the two ping-ponging between mainloop and epilogue.
using LargeM = ScaledGemm<Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                          cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                          cutlass::epilogue::TmaWarpSpecializedCooperative>;
using SmallM = ScaledGemm<Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                          cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                          cutlass::epilogue::TmaWarpSpecialized>;

template <class Config>
void run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
         at::Tensor& out) {
  using Gemm = typename Config::Gemm;
  using Kernel = typename Config::Kernel;
  const int M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1)), N = static_cast<int>(b.size(1));
  const auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(M, K, 1));
  const auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(N, K, 1));
  const auto stride_c = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, make_shape(M, N, 1));
  const auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(M, N, 1));
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {static_cast<const int8_t*>(a.data_ptr()), stride_a, static_cast<const int8_t*>(b.data_ptr()), stride_b},
      {{}, nullptr, stride_c, reinterpret_cast<ElementD*>(out.data_ptr()), stride_d}};
  // {{acc, scale_a, *}, scale_b, *}: each node's children, then its own (empty) arguments
  args.epilogue.thread = {{{}, {scale_a.data_ptr<float>()}, {}}, {scale_b.data_ptr<float>()}, {}};
  args.hw_info.device_id = a.get_device();
  args.hw_info.sm_count = device_attribute(cudaDevAttrMultiProcessorCount, a.get_device());
  launch_cutlass_gemm<Gemm>("int8_scaled_mm_sm90", args, a);
}

}  // namespace

at::Tensor int8_scaled_mm_sm90(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                               const at::Tensor& scale_b) {
  return int8_scaled_mm("int8_scaled_mm_sm90", a, b, scale_a, scale_b, 9, 0, /*same_major=*/true,
                        /*small_m=*/64, run<SmallM>, run<LargeM>);
}

}  // namespace tscale
