// The Hopper int8 product's building blocks: one CUTLASS 3 kernel configuration (CTA tile, cluster,
// schedules) with the scaling epilogue, and its launch; int8_gemm_sm90.cu picks the configurations
// the op uses, int8_gemm_sm90_candidates.cu (built with TSCALE_CUTLASS_CANDIDATES=1) others to time.
#pragma once

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
namespace sm90 {

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

}  // namespace sm90
}  // namespace tscale
