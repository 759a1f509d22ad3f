// The CUDA backend of the attention kernels: warp primitives as inline PTX (sm_80+), and the host launch helpers.
//
// The same names are defined for the CPU emulator in tests/attention_emu/emu_backend.h; the
// kernels use nothing else that differs between the two builds.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#define TSCALE_ATTN_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace tscale::attn {
namespace {

// The 32-bit shared-state-space address of a pointer into shared memory (kernels keep tile
// addresses in this form, so a fragment's address is a per-thread base plus a constant).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices from shared memory (row addresses from lanes 8m..8m+7).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// The same, each matrix transposed on the way.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d (16x8 fp32) += A (16x16 bf16, row) * B (16x8 bf16, col).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, asynchronous; src_bytes 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async_16(uint32_t addr, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two floats as bf16x2 (round to nearest even): `lo` in the low half, the lower column of a pair.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float bf16_to_float(uint16_t x) { return __uint_as_float(static_cast<uint32_t>(x) << 16); }

__device__ __forceinline__ float warp_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ int warp_xor_i32(int v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ bool warp_any(bool pred) { return __any_sync(0xffffffffu, pred); }

__device__ __forceinline__ void atomic_add_f32(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ int atomic_fetch_add_i32(int* p, int v) { return atomicAdd(p, v); }
// Four floats added to the four at a 16-byte aligned global address: one vector atomic on sm_90 and later.
__device__ __forceinline__ void atomic_add_f32x4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), make_float4(a, b, c, d));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}
// Four floats from a 16-byte aligned global address, one load.
__device__ __forceinline__ void load_f32x4(float (&v)[4], const float* p) {
  const float4 x = *reinterpret_cast<const float4*>(p);
  v[0] = x.x;
  v[1] = x.y;
  v[2] = x.z;
  v[3] = x.w;
}
// Eight bf16 values (four 32-bit words) from a 16-byte aligned global address, one load.
__device__ __forceinline__ void load_u32x4(uint32_t (&v)[4], const uint16_t* p) {
  const uint4 x = *reinterpret_cast<const uint4*>(p);
  v[0] = x.x;
  v[1] = x.y;
  v[2] = x.z;
  v[3] = x.w;
}
// Four zero floats at a 16-byte aligned global address, one store.
__device__ __forceinline__ void store_zero_16(float* p) { *reinterpret_cast<float4*>(p) = make_float4(0.f, 0.f, 0.f, 0.f); }
// 32 bits to shared memory; 16 bytes from shared memory to a 16-byte aligned global address.
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void copy_shared_to_global_16(void* gmem, uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  *reinterpret_cast<uint4*>(gmem) = v;
}
// Every lane of the warp arrives before any goes on; shared writes before it are visible after it.
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
__device__ __forceinline__ void atomic_min_shared(int* p, int v) { atomicMin(p, v); }
__device__ __forceinline__ void atomic_max_shared(int* p, int v) { atomicMax(p, v); }

// ---- host side ----

inline void check_device(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor");
}

// Whether the Hopper kernels can serve a call on q's GPU at head dim D: an sm_90 GPU, head dim 128, and a build
// with sm_90a code (TSCALE_WITH_SM90A, setup.py).
inline bool hopper_kernels_serve(const at::Tensor& q, int D) {
#ifdef TSCALE_WITH_SM90A
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device()));
  return major == 9 && minor == 0 && D == 128;
#else
  (void)q, (void)D;
  return false;
#endif
}

// Whether the Hopper kernel serves a call, by the environment variable `env_name` (the forward's or the backward's
// choice): auto or unset (where it can run and `auto_prefers` it, the measured choice for the call's mask) | sm90 (an
// error where it cannot run) | mma (the sm_80 kernel).
inline bool hopper_kernel_chosen(const char* env_name, const char* what, const at::Tensor& q, int D, bool auto_prefers) {
  const char* env = std::getenv(env_name);
  const bool forced = env != nullptr && std::strcmp(env, "sm90") == 0;
  TORCH_CHECK(env == nullptr || forced || std::strcmp(env, "auto") == 0 || std::strcmp(env, "mma") == 0, env_name,
              " must be auto, sm90 or mma, got '", env, "'");
  if (env != nullptr && std::strcmp(env, "mma") == 0) return false;
  const bool can = hopper_kernels_serve(q, D);
  TORCH_CHECK(can || !forced, env_name, "=sm90: the Hopper ", what, " needs head dim 128, an sm_90 GPU and a build ",
              "for sm_90a (TORCH_CUDA_ARCH_LIST with 9.0); got head dim ", D);
  return can && (forced || auto_prefers);
}

// n int32 zeros on the current device (a work counter for a persistent kernel).
inline at::Tensor zeroed_i32(int64_t n) {
  return at::zeros({n}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, c10::cuda::current_device()));
}

// Multiprocessors of the current device.
inline int multiprocessor_count() {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, c10::cuda::current_device()));
  return n;
}

struct DeviceScope {
  explicit DeviceScope(const at::Tensor& t) : guard(t.device()) {}
  c10::cuda::CUDAGuard guard;
};

constexpr int kBlockReservedSmem = 1024;  // shared memory a multiprocessor keeps for each resident block (sm_80 on)

// Shared memory a multiprocessor of the current device offers its blocks; TSCALE_ATTENTION_SMEM_PER_SM_KB, where
// set, makes the kernels run as on a GPU with that much (e.g. 100: sm_86 / sm_89, the RTX 4090): the forward's
// configuration is chosen for it, and launch_kernel pads each launch's shared memory so that no more blocks share a
// multiprocessor than would fit there. Only the occupancy is emulated, not that GPU's clocks, memory or cache.
inline int device_smem_per_multiprocessor() {
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerMultiprocessor, c10::cuda::current_device()));
  return n;
}

inline int emulated_smem_per_multiprocessor() {  // bytes, 0 when not emulating
  const char* env = std::getenv("TSCALE_ATTENTION_SMEM_PER_SM_KB");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long kb = std::strtol(env, &end, 10);
  const int device = device_smem_per_multiprocessor();
  TORCH_CHECK(*end == '\0' && kb > 0 && kb * 1024 <= device, "TSCALE_ATTENTION_SMEM_PER_SM_KB must be a count of KB ",
              "from 1 to this GPU's ", device / 1024, ", got '", env, "'");
  return static_cast<int>(kb * 1024);
}

inline int smem_per_multiprocessor() {
  const int emulated = emulated_smem_per_multiprocessor();
  return emulated > 0 ? emulated : device_smem_per_multiprocessor();
}

// Dynamic shared memory for a launch of `smem` bytes that leaves room for as many blocks a multiprocessor as the
// emulated one would hold (TSCALE_ATTENTION_SMEM_PER_SM_KB), or `smem` when not emulating.
inline size_t occupancy_padded_smem(size_t smem) {
  const int emulated = emulated_smem_per_multiprocessor();
  if (emulated == 0) return smem;
  const size_t per_block = smem + kBlockReservedSmem;
  TORCH_CHECK(per_block <= static_cast<size_t>(emulated), "a launch of ", smem, " bytes of shared memory does not fit ",
              "the emulated multiprocessor's ", emulated, " (TSCALE_ATTENTION_SMEM_PER_SM_KB)");
  const size_t blocks = emulated / per_block;
  const size_t padded = (device_smem_per_multiprocessor() / blocks - kBlockReservedSmem) / 1024 * 1024;
  return padded > smem ? padded : smem;
}

// Launches kernel<<<grid, block, smem>>> on the current stream; raises the dynamic shared-memory
// limit first when the kernel needs more than the default 48 KiB.
template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  smem = occupancy_padded_smem(smem);
  if (smem > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<grid, block, smem, c10::cuda::getCurrentCUDAStream()>>>(std::forward<Args>(args)...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace tscale::attn
