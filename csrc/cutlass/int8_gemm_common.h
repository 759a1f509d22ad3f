// What the CUTLASS int8 products share: their operand rules and the launch of a CUTLASS device GEMM.
// out (M, N) bf16 = (a (M, K) @ b (K, N)) * scale_a[m] * scale_b[n].
#pragma once

#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cutlass/cutlass.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace tscale {

// A device attribute (compute capability, SM count), asked of the driver once per device and
// attribute: the ops need them on every call, and they do not change while the process runs.
inline int device_attribute(cudaDeviceAttr attr, int device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> known;
  const std::pair<int, int> key{static_cast<int>(attr), device};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  known.emplace(key, value);
  return value;
}

// a int8 row-major (M, K), b int8 column-major (K, N) (a row-major (N, K) weight's transpose),
// K % 16 == 0 and N % 8 == 0, both 16-byte aligned; scale_a M and scale_b N contiguous float32, aligned too;
// dimensions within 32 bits; a device of compute capability `major`.`minor` or newer (of that major
// version alone when `same_major`).
inline void check_int8_gemm_operands(const char* name, const at::Tensor& a, const at::Tensor& b,
                                     const at::Tensor& scale_a, const at::Tensor& scale_b, int major, int minor,
                                     bool same_major) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && scale_a.is_cuda() && scale_b.is_cuda(), name,
              ": all operands must be CUDA tensors");
  TORCH_CHECK(a.scalar_type() == at::kChar && b.scalar_type() == at::kChar, name, ": a and b must be int8");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), name, ": expected (M, K) @ (K, N)");
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK(M < (int64_t{1} << 31) && N < (int64_t{1} << 31) && K < (int64_t{1} << 31), name,
              ": dimensions must fit in 32 bits");
  TORCH_CHECK(a.is_contiguous(), name, ": a must be row-major");
  TORCH_CHECK(b.stride(0) == 1 && b.stride(1) == K, name, ": b must be column-major (a weight's transpose)");
  TORCH_CHECK(K % 16 == 0 && N % 8 == 0, name, ": needs K % 16 == 0 and N % 8 == 0, got K=", K, " N=", N);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 && reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0,
              name, ": a and b must be 16-byte aligned");
  TORCH_CHECK(scale_a.scalar_type() == at::kFloat && scale_a.is_contiguous() && scale_a.numel() == M, name,
              ": scale_a must be M contiguous float32 values");
  TORCH_CHECK(scale_b.scalar_type() == at::kFloat && scale_b.is_contiguous() && scale_b.numel() == N, name,
              ": scale_b must be N contiguous float32 values");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(scale_a.data_ptr()) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(scale_b.data_ptr()) % 16 == 0, name, ": the scales must be 16-byte aligned");
  const int dev_major = device_attribute(cudaDevAttrComputeCapabilityMajor, a.get_device());
  const int dev_minor = device_attribute(cudaDevAttrComputeCapabilityMinor, a.get_device());
  const bool newer = dev_major > major || (dev_major == major && dev_minor >= minor);
  TORCH_CHECK(newer && (!same_major || dev_major == major), name, ": needs compute capability ", major, ".", minor,
              same_major ? "" : " or newer", ", got ", dev_major, ".", dev_minor);
}

// Checks, sizes the workspace, initialises and launches a CUTLASS device GEMM on the current stream.
template <class Gemm>
void launch_cutlass_gemm(const char* name, const typename Gemm::Arguments& args, const at::Tensor& like) {
  Gemm gemm;
  TORCH_CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess, name, ": CUTLASS cannot run this problem");
  const auto workspace = at::empty({static_cast<int64_t>(Gemm::get_workspace_size(args))}, like.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(gemm.initialize(args, workspace.data_ptr(), stream) == cutlass::Status::kSuccess, name,
              ": initialize failed");
  TORCH_CHECK(gemm.run(stream) == cutlass::Status::kSuccess, name, ": launch failed");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// An op's body: the checks, then an empty result (M or N zero), zeros (K zero), or run_small (M <= small_m)
// or run_large, each called as run(a, b, scale_a, scale_b, out) with out (M, N) bf16.
template <class RunSmall, class RunLarge>
at::Tensor int8_scaled_mm(const char* name, const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                          const at::Tensor& scale_b, int major, int minor, bool same_major, int64_t small_m,
                          RunSmall run_small, RunLarge run_large) {
  check_int8_gemm_operands(name, a, b, scale_a, scale_b, major, minor, same_major);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const c10::cuda::CUDAGuard guard(a.device());
  at::Tensor out = at::empty({M, N}, a.options().dtype(at::kBFloat16));
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  if (M <= small_m) {
    run_small(a, b, scale_a, scale_b, out);
  } else {
    run_large(a, b, scale_a, scale_b, out);
  }
  return out;
}

}  // namespace tscale
