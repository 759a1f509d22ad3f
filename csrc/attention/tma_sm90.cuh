// Hopper data movement and scheduling for the sm_90a attention kernels: shared-memory barriers (mbarrier), tile loads
// by the tensor memory accelerator (TMA), named barriers, register reallocation between warpgroups, and the host side
// of a TMA tile map.
//
// A TileMap describes one bf16 (B, H, T, 128) tensor (head dims contiguous, any other strides that are multiples of
// 8 elements) to the TMA unit: tma_load_half copies rows [row, row + box rows) of head dims [d0, d0 + 64) of one
// (b, h) into shared memory in the 128-byte swizzled layout of wgmma_sm90.cuh (one half of a tile), zero-filling
// rows past T, and counts its bytes on an mbarrier. A VecMap describes a 1D array of 4-byte elements (fp32 or
// int32): tma_load_vec copies `box` of them from any element on, zero-filling past the array's end. The CPU emulator
// of the tests (tests/attention_emu) defines the same names and maps of its own.
#pragma once

#include <cstdint>

#include "wgmma_sm90.cuh"

#ifndef TSCALE_ATTENTION_EMULATE
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

namespace tscale::attn {
namespace {

#ifndef TSCALE_ATTENTION_EMULATE
using TileMap = CUtensorMap;
using VecMap = CUtensorMap;

// Initialises the mbarrier at `bar` to expect `count` arrivals a phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Makes the initialisations of this thread visible to the other threads (and the TMA unit) of the block; a block
// synchronisation follows.
__device__ __forceinline__ void fence_mbarrier_init() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival (release: this thread's earlier writes are seen by a thread whose wait this arrival completes).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}

// One arrival that also announces `bytes` the TMA unit will deliver before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Waits until the phase of parity `parity` has completed (acquire). A fresh barrier counts the phase before its
// first as completed, so a wait for parity 1 passes at once.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef TSCALE_SM90A_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// Rows [row, row + box rows) x head dims [d0, d0 + 64) of (b, h) into the swizzled half at `dst` (1024-byte
// aligned), completing box rows x 128 bytes on `bar`.
__device__ __forceinline__ void tma_load_half(uint32_t dst, const TileMap& map, uint32_t bar, int d0, int row, int h,
                                              int b) {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(d0), "r"(row), "r"(h), "r"(b)
      : "memory");
#endif
}

// Elements [start, start + box) of the 1D array of `map` into shared memory at `dst` (128-byte aligned), completing
// box x 4 bytes on `bar`.
__device__ __forceinline__ void tma_load_vec(uint32_t dst, const VecMap& map, uint32_t bar, int start) {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
      :
      : "r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(start), "r"(0)
      : "memory");
#endif
}

// Named barrier `id` (1..15; 0 is __syncthreads') of `count` threads: wait there until `count` have arrived, or
// arrive without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Register reallocation between the warpgroups of a block (every thread of the warpgroup executes it).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// The driver's cuTensorMapEncodeTiled, found once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr,
                "attention: the CUDA driver has no cuTensorMapEncodeTiled (needs a driver for CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// The TMA map of a bf16 (B, H, T, 128) tensor at `base` with element strides s (t, h, b; head dims contiguous),
// boxes of `box_rows` rows x 64 head dims, 128-byte swizzle, rows past T read as zeros.
inline TileMap make_tile_map(const uint16_t* base, const Strides& s, int B, int H, int T, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  TileMap map;
  const cuuint64_t dims[4] = {128, static_cast<cuuint64_t>(T), static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(s.t) * 2, static_cast<cuuint64_t>(s.h) * 2,
                                 static_cast<cuuint64_t>(s.b) * 2};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t*>(base), dims, strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "attention: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r),
              ") for a (", B, ", ", H, ", ", T, ", 128) tensor with strides (", s.b, ", ", s.h, ", ", s.t, ")");
  return map;
}

// The TMA map of a 1D array of n 4-byte elements at `base` (16-byte aligned), boxes of `box` elements, no swizzle,
// elements past the end read as zeros. Encoded as a (1, n) matrix: the driver refused the rank-1 form (error 1).
inline VecMap make_vec_map(const void* base, int64_t n, int box) {
  VecMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(n), 1};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>((n * 4 + 15) / 16 * 16)};
  const cuuint32_t box_dims[2] = {static_cast<cuuint32_t>(box), 1};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<void*>(base), dims,
                                          strides, box_dims, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "attention: cuTensorMapEncodeTiled failed (error ", static_cast<int>(r), ") for a 1D ",
              "array of ", n, " elements");
  return map;
}
#endif  // TSCALE_ATTENTION_EMULATE

// Rows [row, row + box rows) x all 128 head dims of (b, h): both swizzled halves, the second `half_bytes` after `dst`.
__device__ __forceinline__ void tma_load_tile(uint32_t dst, uint32_t half_bytes, const TileMap& map, uint32_t bar,
                                              int row, int h, int b) {
  tma_load_half(dst, map, bar, 0, row, h, b);
  tma_load_half(dst + half_bytes, map, bar, 64, row, h, b);
}

}  // namespace
}  // namespace tscale::attn
