// CUDA kernels of the fp8 / int8 products declared in gemm.cpp: argument checks, the cuBLASLt calls
// (through cublaslt_runner.h, which autotunes them) and the one scaling pass used where cuBLASLt
// cannot apply the scales itself.
//
// The operands arrive in row-major torch terms (a (M, K) row-major, b (K, N) column-major, out (M, N)
// row-major); cublaslt_runner.h says how they map onto cuBLASLt's column-major "TN" product:
// cuBLASLt's A is the weight (b's bytes), its B is a, its D is out, its m = N and its n = M.
//
// What each recipe uses, and why:
//   fp8, one scale per operand (tensorwise): CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER, one device float32
//     each (no host sync), and D written straight in the output dtype by the epilogue: one kernel.
//   fp8, per-row x per-column scales (rowwise): the outer-vector scale mode
//     (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on both A and B, cuBLAS >= 12.9; the cuBLAS docs list
//     it for compute capability 9.0): one kernel. A scalar scale paired with a vector is broadcast to a
//     vector first. Where cuBLASLt offers no such algorithm (Ada sm_89: tensorwide scaling only), or
//     with fuse_scales=False, the product is written in fp32 with no scales and one pass applies
//     both: 4 bytes read + 2 (bf16) written per element, and the fp32 sums are scaled before any
//     rounding to the output dtype, as in the reference.
//   int8: cuBLASLt's int8 (IMMA) kernels with regular (column-major) ordering write int32 (compute
//     and scale type 32I, alpha 1, beta 0) or int8; the per-row alpha vector
//     (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_*) exists only with the requantised int8 output, and
//     no bf16 / fp32 output exists for int8 inputs with integer accumulation (cuBLAS docs,
//     cublasLtMatmul "Datatypes Supported"). So: the exact int32 product, then one pass converts it
//     with both scales: out = (float(acc) * scale_a[m]) * scale_b[n], rounded once to the output dtype.
#ifdef TSCALE_WITH_CUBLASLT

#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cublaslt_runner.h"

namespace tscale {
namespace {

// ---- the scaling pass: out[m, n] = (float(acc[m, n]) * sa[m]) * sb[n] ---------------------------------

constexpr int kVec = 8;  // elements per thread: two 16-byte loads of acc, one 16-byte store of bf16 / fp16
constexpr int kScaleThreads = 256;

enum OutKind : int { kOutF32 = 0, kOutBF16 = 1, kOutF16 = 2 };

template <bool kIntAcc>
__device__ __forceinline__ void load8(const void* src, float (&v)[kVec]) {
  const int4* p = reinterpret_cast<const int4*>(src);
  const int4 lo = __ldcs(p), hi = __ldcs(p + 1);  // read once: streaming loads
  const int bits[kVec] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = kIntAcc ? __int2float_rn(bits[j]) : __int_as_float(bits[j]);
}

template <int kOut>
__device__ __forceinline__ void store8(void* dst, const float (&v)[kVec]) {
  if constexpr (kOut == kOutF32) {
    float4* p = reinterpret_cast<float4*>(dst);
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint32_t packed[kVec / 2];
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      uint32_t lo, hi;
      if constexpr (kOut == kOutBF16) {
        lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * j]));
        hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * j + 1]));
      } else {
        lo = __half_as_ushort(__float2half_rn(v[2 * j]));
        hi = __half_as_ushort(__float2half_rn(v[2 * j + 1]));
      }
      packed[j] = lo | (hi << 16);  // little-endian: element 2j at the lower address
    }
    *reinterpret_cast<int4*>(dst) = make_int4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// acc and out are (M, N) row-major with N % kVec == 0 and 16-byte aligned rows (fresh allocations);
// sa_step / sb_step are 0 for one scale, 1 for a vector. Grid: x over the kVec-groups of a row,
// y over rows (looping when M > gridDim.y), so no thread divides 64-bit indices. The multiplies are
// explicit round-to-nearest (__fmul_rn), so --use_fast_math cannot fuse or reorder them.
template <bool kIntAcc, int kOut>
__global__ void scale_kernel(const void* __restrict__ acc, void* __restrict__ out, const float* __restrict__ sa,
                             int64_t sa_step, const float* __restrict__ sb, int64_t sb_step, int64_t M, int64_t N) {
  constexpr int kOutBytes = kOut == kOutF32 ? 4 : 2;
  const int64_t groups_per_row = N / kVec;
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (g >= groups_per_row) return;
  const int64_t col = g * kVec;
  float cs[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) cs[j] = __ldg(sb + (col + j) * sb_step);
  for (int64_t row = blockIdx.y; row < M; row += gridDim.y) {
    const int64_t offset = row * N + col;
    float v[kVec];
    load8<kIntAcc>(static_cast<const char*>(acc) + offset * 4, v);
    const float ra = __ldg(sa + row * sa_step);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], ra), cs[j]);
    store8<kOut>(static_cast<char*>(out) + offset * kOutBytes, v);
  }
}

template <bool kIntAcc>
void launch_scale_typed(const at::Tensor& acc, at::Tensor& out, const at::Tensor& sa, const at::Tensor& sb,
                        cudaStream_t stream) {
  const int64_t M = acc.size(0), N = acc.size(1);
  if (M == 0 || N == 0) return;
  const dim3 grid(static_cast<unsigned int>((N / kVec + kScaleThreads - 1) / kScaleThreads),
                  static_cast<unsigned int>(std::min<int64_t>(M, 8192)));  // a few rows per block at large M
  const int64_t sa_step = sa.numel() == 1 ? 0 : 1, sb_step = sb.numel() == 1 ? 0 : 1;
  const float* sap = sa.data_ptr<float>();
  const float* sbp = sb.data_ptr<float>();
  switch (out.scalar_type()) {
    case at::kFloat:
      scale_kernel<kIntAcc, kOutF32><<<grid, kScaleThreads, 0, stream>>>(acc.data_ptr(), out.data_ptr(), sap, sa_step,
                                                                          sbp, sb_step, M, N);
      break;
    case at::kBFloat16:
      scale_kernel<kIntAcc, kOutBF16><<<grid, kScaleThreads, 0, stream>>>(acc.data_ptr(), out.data_ptr(), sap,
                                                                           sa_step, sbp, sb_step, M, N);
      break;
    case at::kHalf:
      scale_kernel<kIntAcc, kOutF16><<<grid, kScaleThreads, 0, stream>>>(acc.data_ptr(), out.data_ptr(), sap, sa_step,
                                                                          sbp, sb_step, M, N);
      break;
    default:
      TORCH_CHECK(false, "tscale scaling pass: unsupported output dtype ", out.scalar_type());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out = acc (int32 or fp32, (M, N)) scaled by scale_a (1 or M values) and scale_b (1 or N values).
void launch_scale(const at::Tensor& acc, at::Tensor& out, const at::Tensor& sa, const at::Tensor& sb,
                  cudaStream_t stream) {
  TORCH_CHECK(acc.is_contiguous() && out.is_contiguous() && acc.size(1) % kVec == 0,
              "tscale scaling pass: internal layout error");
  if (acc.scalar_type() == at::kInt) {
    launch_scale_typed<true>(acc, out, sa, sb, stream);
  } else {
    TORCH_CHECK(acc.scalar_type() == at::kFloat, "tscale scaling pass: accumulator must be int32 or float32");
    launch_scale_typed<false>(acc, out, sa, sb, stream);
  }
}

// ---- argument checks --------------------------------------------------------------------------------

struct Dims {
  int64_t M, N, K;
};

bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn: return CUDA_R_8F_E4M3;
    case at::kFloat8_e5m2: return CUDA_R_8F_E5M2;
    case at::kChar: return CUDA_R_8I;
    case at::kInt: return CUDA_R_32I;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    case at::kFloat: return CUDA_R_32F;
    default: TORCH_CHECK(false, "tscale cuBLASLt: no CUDA data type for ", t);
  }
  return CUDA_R_32F;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// a (M, K) row-major, b (K, N) column-major, both CUDA on one device, K and N multiples of 16.
Dims check_operands(const char* op, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), op, ": a and b must be CUDA tensors, got ", a.device(), " and ",
              b.device());
  TORCH_CHECK(a.device() == b.device(), op, ": a and b must be on one device, got ", a.device(), " and ", b.device());
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), op, ": expected (M, K) @ (K, N), got ",
              a.sizes(), " @ ", b.sizes());
  const Dims d{a.size(0), b.size(1), a.size(1)};
  TORCH_CHECK(d.K > 0 && d.K % 16 == 0 && d.N % 16 == 0, op, ": K and N must be positive multiples of 16, got K=",
              d.K, " N=", d.N);
  TORCH_CHECK(a.stride(1) == 1 && (a.stride(0) == d.K || d.M <= 1), op,
              ": a must be row-major (M, K) with rows of K elements, got strides ", a.strides());
  TORCH_CHECK(b.stride(0) == 1 && b.stride(1) == d.K, op,
              ": b must be column-major (K, N), i.e. b.t() a contiguous (N, K) weight, got strides ", b.strides());
  TORCH_CHECK(aligned16(a) && aligned16(b), op, ": a and b must start at 16-byte aligned addresses");
  return d;
}

// numel 1 (one scale) or n (one per row / column), float32, contiguous, on the operands' device.
void check_scale(const char* op, const char* name, const at::Tensor& s, int64_t n, const at::Device& device) {
  TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", s.scalar_type());
  TORCH_CHECK(s.device() == device, op, ": ", name, " must be on ", device, ", got ", s.device());
  TORCH_CHECK(s.numel() == 1 || s.numel() == n, op, ": ", name, " must hold 1 or ", n, " values, got shape ",
              s.sizes());
  TORCH_CHECK(s.is_contiguous(), op, ": ", name, " must be contiguous");
}

void check_out_dtype(const char* op, at::ScalarType t) {
  TORCH_CHECK(t == at::kBFloat16 || t == at::kHalf || t == at::kFloat, op,
              ": out_dtype must be bfloat16, float16 or float32, got ", t);
}

std::pair<int, int> capability(int device) {
  static std::mutex mutex;
  static std::vector<std::pair<int, int>> known;  // indexed by device, (-1, -1) unknown
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= static_cast<int>(known.size())) known.resize(device + 1, {-1, -1});
  if (known[device].first < 0) {
    int major = 0, minor = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    known[device] = {major, minor};
  }
  return known[device];
}

// ---- the ops ------------------------------------------------------------------------------------------

std::atomic<int64_t> g_fp8_scaling_passes{0};  // fp8 products that wanted fused scales but took the pass

at::Tensor fp8_gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                         const at::Tensor& scale_b, at::ScalarType out_dtype, bool fuse_scales, bool fast_accum) {
  const char* op = "tscale::fp8_gemm";
  const Dims dims = check_operands(op, a, b);
  TORCH_CHECK(is_fp8(a.scalar_type()) && is_fp8(b.scalar_type()), op,
              ": a and b must be float8_e4m3fn or float8_e5m2, got ", a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(!(a.scalar_type() == at::kFloat8_e5m2 && b.scalar_type() == at::kFloat8_e5m2), op,
              ": e5m2 x e5m2 has no cuBLASLt kernel; quantise one operand to e4m3");
  check_scale(op, "scale_a", scale_a, dims.M, a.device());
  check_scale(op, "scale_b", scale_b, dims.N, a.device());
  check_out_dtype(op, out_dtype);
  const c10::cuda::CUDAGuard guard(a.device());
  const int device = a.get_device();
  const auto cc = capability(device);
  TORCH_CHECK(cc >= std::make_pair(8, 9), op, ": fp8 products need compute capability 8.9 or newer, this GPU has ",
              cc.first, ".", cc.second);
  at::Tensor out = at::empty({dims.M, dims.N}, a.options().dtype(out_dtype));
  if (dims.M == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();

  const float one = 1.f, zero = 0.f;
  lt::Problem p;
  p.m = dims.N;  // cuBLASLt's D is out's bytes seen column-major: N rows, M columns
  p.n = dims.M;
  p.k = dims.K;
  p.a_type = cuda_type(b.scalar_type());  // cuBLASLt's A is the weight
  p.b_type = cuda_type(a.scalar_type());
  p.compute = CUBLAS_COMPUTE_32F;
  p.scale_type = CUDA_R_32F;
  p.fast_accum = fast_accum;
  lt::Operands o;
  o.a = b.data_ptr();
  o.b = a.data_ptr();
  o.alpha = &one;
  o.beta = &zero;

  const bool tensorwise = scale_a.numel() == 1 && scale_b.numel() == 1;
  if (fuse_scales && tensorwise) {
    p.scale_mode = lt::ScaleMode::kScalar;
    p.d_type = cuda_type(out_dtype);
    o.d = out.data_ptr();
    o.a_scale = scale_b.data_ptr();  // A scale: the weight's
    o.b_scale = scale_a.data_ptr();
    if (lt::run(p, o, stream, device)) return out;
  } else if (fuse_scales && cc.first >= 9) {
    // Outer vectors: A's scale has m = N values (per output channel), B's n = M values (per token).
    const at::Tensor vec_a = scale_a.numel() == 1 ? scale_a.reshape({1}).expand({dims.M}).contiguous() : scale_a;
    const at::Tensor vec_b = scale_b.numel() == 1 ? scale_b.reshape({1}).expand({dims.N}).contiguous() : scale_b;
    p.scale_mode = lt::ScaleMode::kOuterVector;
    p.d_type = cuda_type(out_dtype);
    o.d = out.data_ptr();
    o.a_scale = vec_b.data_ptr();
    o.b_scale = vec_a.data_ptr();
    if (lt::run(p, o, stream, device)) return out;
  }
  // No scales in cuBLASLt: the fp32 product, then one pass applies both scales.
  if (fuse_scales) ++g_fp8_scaling_passes;
  at::Tensor acc = at::empty({dims.M, dims.N}, a.options().dtype(at::kFloat));
  p.scale_mode = lt::ScaleMode::kNone;
  p.d_type = CUDA_R_32F;
  o.d = acc.data_ptr();
  o.a_scale = o.b_scale = nullptr;
  std::string why;
  TORCH_CHECK(lt::run(p, o, stream, device, &why), op, ": cuBLASLt offers no algorithm for ", a.scalar_type(), " x ",
              b.scalar_type(), " -> float32 at M=", dims.M, " N=", dims.N, " K=", dims.K, " on compute capability ",
              cc.first, ".", cc.second, " (", why, ")");
  launch_scale(acc, out, scale_a, scale_b, stream);
  return out;
}

at::Tensor int8_gemm_i32_cuda(const at::Tensor& a, const at::Tensor& b) {
  const char* op = "tscale::int8_gemm";
  const Dims dims = check_operands(op, a, b);
  TORCH_CHECK(a.scalar_type() == at::kChar && b.scalar_type() == at::kChar, op, ": a and b must be int8, got ",
              a.scalar_type(), " and ", b.scalar_type());
  const c10::cuda::CUDAGuard guard(a.device());
  const int device = a.get_device();
  const auto cc = capability(device);
  TORCH_CHECK(cc >= std::make_pair(7, 5), op, ": int8 products need compute capability 7.5 or newer, this GPU has ",
              cc.first, ".", cc.second);
  at::Tensor out = at::empty({dims.M, dims.N}, a.options().dtype(at::kInt));
  if (dims.M == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const int32_t one = 1, zero = 0;  // scale type int32: alpha 1 and beta 0 are the only values allowed
  lt::Problem p;
  p.m = dims.N;
  p.n = dims.M;
  p.k = dims.K;
  p.a_type = p.b_type = CUDA_R_8I;
  p.d_type = CUDA_R_32I;
  p.compute = CUBLAS_COMPUTE_32I;
  p.scale_type = CUDA_R_32I;
  lt::Operands o;
  o.a = b.data_ptr();
  o.b = a.data_ptr();
  o.d = out.data_ptr();
  o.alpha = &one;
  o.beta = &zero;
  std::string why;
  TORCH_CHECK(lt::run(p, o, stream, device, &why), op, ": cuBLASLt offers no int8 algorithm at M=", dims.M,
              " N=", dims.N, " K=", dims.K, " on compute capability ", cc.first, ".", cc.second, " (", why, ")");
  return out;
}

at::Tensor int8_gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, at::ScalarType out_dtype) {
  const char* op = "tscale::int8_gemm";
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, op, ": expected 2-D operands, got ", a.sizes(), " and ", b.sizes());
  check_scale(op, "scale_a", scale_a, a.size(0), a.device());
  check_scale(op, "scale_b", scale_b, b.size(1), a.device());
  check_out_dtype(op, out_dtype);
  const at::Tensor acc = int8_gemm_i32_cuda(a, b);  // checks the operands
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty(acc.sizes(), a.options().dtype(out_dtype));
  launch_scale(acc, out, scale_a, scale_b, c10::cuda::getCurrentCUDAStream(a.get_device()).stream());
  return out;
}

// lt::stats() and the count of fp8 products that fell back to the scaling pass (see gemm.cpp).
std::vector<int64_t> gemm_stats() {
  std::vector<int64_t> out = lt::stats();
  out.push_back(g_fp8_scaling_passes.load());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("fp8_gemm", &fp8_gemm_cuda);
  m.impl("int8_gemm", &int8_gemm_cuda);
  m.impl("int8_gemm_i32", &int8_gemm_i32_cuda);
}

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("lowprec_gemm_stats() -> int[]", &gemm_stats);
}

}  // namespace tscale

#endif  // TSCALE_WITH_CUBLASLT
