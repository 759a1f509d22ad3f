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
// This file is its own extension module, tscale._C_sm90, built only for sm_90a and only where
// CUTLASS's headers are found (setup.py); tscale.ops uses it when it is importable.
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

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

int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

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

  Gemm gemm;
  TORCH_CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess,
              "int8_scaled_mm_sm90: CUTLASS cannot run M=", M, " N=", N, " K=", K);
  const auto workspace = at::empty({static_cast<int64_t>(Gemm::get_workspace_size(args))},
                                   a.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(gemm.initialize(args, workspace.data_ptr(), stream) == cutlass::Status::kSuccess,
              "int8_scaled_mm_sm90: initialize failed");
  TORCH_CHECK(gemm.run(stream) == cutlass::Status::kSuccess, "int8_scaled_mm_sm90: launch failed");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor int8_scaled_mm_sm90(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                               const at::Tensor& scale_b) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && scale_a.is_cuda() && scale_b.is_cuda(),
              "int8_scaled_mm_sm90: all operands must be CUDA tensors");
  TORCH_CHECK(a.scalar_type() == at::kChar && b.scalar_type() == at::kChar, "int8_scaled_mm_sm90: a and b must be int8");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "int8_scaled_mm_sm90: expected (M, K) @ (K, N)");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(M < (int64_t{1} << 31) && N < (int64_t{1} << 31) && K < (int64_t{1} << 31),
              "int8_scaled_mm_sm90: dimensions must fit in 32 bits");
  TORCH_CHECK(a.is_contiguous(), "int8_scaled_mm_sm90: a must be row-major");
  TORCH_CHECK(b.stride(0) == 1 && b.stride(1) == K, "int8_scaled_mm_sm90: b must be column-major (a weight's transpose)");
  TORCH_CHECK(K % 16 == 0 && N % 8 == 0, "int8_scaled_mm_sm90: needs K % 16 == 0 and N % 8 == 0, got K=", K, " N=", N);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0,
              "int8_scaled_mm_sm90: a and b must be 16-byte aligned");
  TORCH_CHECK(scale_a.scalar_type() == at::kFloat && scale_a.is_contiguous() && scale_a.numel() == M,
              "int8_scaled_mm_sm90: scale_a must be M contiguous float32 values");
  TORCH_CHECK(scale_b.scalar_type() == at::kFloat && scale_b.is_contiguous() && scale_b.numel() == N,
              "int8_scaled_mm_sm90: scale_b must be N contiguous float32 values");
  const c10::cuda::CUDAGuard guard(a.device());
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, a.get_device());
  const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor, a.get_device());
  TORCH_CHECK(major == 9 && minor == 0, "int8_scaled_mm_sm90: needs compute capability 9.0, got ", major, ".", minor);
  at::Tensor out = at::empty({M, N}, a.options().dtype(at::kBFloat16));
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  if (M <= 64) {
    run<SmallM>(a, b, scale_a, scale_b, out);
  } else {
    run<LargeM>(a, b, scale_a, scale_b, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("int8_scaled_mm_sm90(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("int8_scaled_mm_sm90", &int8_scaled_mm_sm90);
}

}  // namespace tscale

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tscale's sm_90a kernels: the int8 product with its scales in the epilogue (CUTLASS)";
}
