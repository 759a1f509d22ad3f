// The CUDA backend of the head's cross-entropy kernel (softcap_xent_kernel.cuh): memory, bf16, math and warp primitives.
//
// The same names are defined for the CPU emulator in tests/loss_emu/loss_emu_backend.h.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#define TSCALE_XENT_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace tscale::xent {
namespace {

using Vec8 = uint4;  // 8 bf16

// Global memory read again soon: cached in L2 only. Read or written for the last time: streaming (evicted first).
__device__ __forceinline__ Vec8 load_cached(const Vec8* p) { return __ldcg(p); }
__device__ __forceinline__ void store_cached(Vec8* p, Vec8 v) { __stcg(p, v); }
__device__ __forceinline__ Vec8 load_streaming(const Vec8* p) { return __ldcs(p); }
__device__ __forceinline__ void store_streaming(Vec8* p, Vec8 v) { __stcs(p, v); }

// 8 bf16 -> 8 floats, the lower address first.
__device__ __forceinline__ void unpack8(const Vec8& v, float (&x)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// 8 floats -> 8 bf16 (round to nearest even).
__device__ __forceinline__ Vec8 pack8(const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The special-function unit's approximations (relative error about 2^-22).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float warp_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// ---- host side ----

inline void check_device(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "softcap_xent_grad: ", name, " must be a CUDA tensor");
}

struct DeviceScope {
  explicit DeviceScope(const at::Tensor& t) : guard(t.device()) {}
  c10::cuda::CUDAGuard guard;
};

template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  kernel<<<grid, block, smem, c10::cuda::getCurrentCUDAStream()>>>(std::forward<Args>(args)...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace tscale::xent
