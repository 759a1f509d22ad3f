// Hopper warpgroup primitives for the sm_90a attention kernels: wgmma products, their fences, and the shared-memory
// tile layout they read (with its loader).
//
// The products compile to code only for sm_90a (TSCALE_SM90A_DEVICE); other targets see empty bodies, and the
// host never launches a kernel built from them there (attention_fwd.cu and attention_bwd.cu check the device and
// the build). The CPU emulator of the tests (tests/attention_emu) defines its own products, fences and waits, and
// runs the kernels' bodies.
//
// Tile layout ("128-byte swizzled rows", what wgmma calls SWIZZLE_128B): a (rows, 128) bf16 tile is stored as
// two halves of 64 head dims, each half [rows][128 bytes]; within a half, the 16-byte chunk c of row r sits at
// chunk c ^ (r % 8). Every half starts at a multiple of 1024 bytes. Such a tile is
//   * a K-major operand (Q, K for S = Q K^T): descriptor at half + 32 kk for k-step kk of that half, 8-row
//     groups 1024 bytes apart (stride byte offset);
//   * an MN-major operand (V for O = P V, read transposed): descriptor at 2048 ks for k-step ks (16 rows),
//     8-row groups 1024 bytes apart, the second half of the head dims `half_bytes` further (leading byte offset).
// A (64 x 64) tile of one half, [64 rows][128 bytes], read transposed (dS^T for dQ = dS K) is the same MN-major
// operand with a single 64-wide atom.
// Accumulator layout of m64nNk16 (per warp w of the warpgroup, lane = 4 g + t4): d[4 j + e] holds row
// 16 w + g + 8 (e >> 1), column 8 j + 2 t4 + (e & 1), as mma.sync m16n8's C fragment tiled along N.
// A register operand (16 x 16 per warp) has mma.sync m16n8k16's A layout, so accumulator n8-blocks 2s and
// 2s + 1 converted to bf16 pairs are the A operand of k-step s (acc_to_a).
#pragma once

#include <cstdint>

#include "attention_common.cuh"

#if defined(TSCALE_ATTENTION_EMULATE) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define TSCALE_SM90A_DEVICE 1
#endif

namespace tscale::attn {
namespace {

// Byte offset of 16-byte chunk `chunk` (0..15 over the 128 head dims) of row `row` in a swizzled tile of
// `rows` rows.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk, int rows) {
  return static_cast<uint32_t>((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// Rows [row0, row0 + ROWS) of a (T, 128) bf16 matrix (row stride `stride` elements) into the swizzled tile at
// `tile`, 16-byte cp.async by all NTHREADS threads; rows at or past T are zero-filled.
template <int ROWS, int NTHREADS>
__device__ __forceinline__ void load_tile_sw128(uint32_t tile, const uint16_t* g, int64_t stride, int row0, int T,
                                                int tid) {
  for (int i = tid; i < ROWS * 16; i += NTHREADS) {
    const int r = i >> 4, c = i & 15;
    const bool ok = row0 + r < T;
    const uint16_t* src = g + (ok ? static_cast<int64_t>(row0 + r) * stride : 0) + c * 8;
    cp_async_16(tile + sw128_offset(r, c, ROWS), src, ok ? 16 : 0);
  }
}

// The 64-bit shared-memory matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

#ifndef TSCALE_ATTENTION_EMULATE
__device__ __forceinline__ void wgmma_fence() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most N of the warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Shared-memory writes of this thread (st.shared, cp.async) become visible to the async proxy that wgmma reads
// through; each writer fences, then the block synchronises.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for bf16 A operands held in registers: they stay untouched until after the wait that follows it.
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

#define TSCALE_WGMMA_D32                                                                          \
  "{"                                                                                             \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                                         \
  "}"
#define TSCALE_WGMMA_D64                                                                          \
  "{"                                                                                             \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63"                                                                       \
  "}"
#define TSCALE_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define TSCALE_F32(i) \
  TSCALE_F4(i), TSCALE_F4(i + 4), TSCALE_F4(i + 8), TSCALE_F4(i + 12), TSCALE_F4(i + 16), TSCALE_F4(i + 20), \
      TSCALE_F4(i + 24), TSCALE_F4(i + 28)

// d (64 x N fp32, per thread N / 2) = A B (+ d when accumulate): A (64 x 16) and B (16 x N) bf16 in shared memory,
// each K-major or, with TRANS_A / TRANS_B, MN-major (read transposed: A stored [k][m], B stored [k][n], N = 128 as
// two halves of 64, the second the descriptor's leading byte offset on).
template <int N, int TRANS_A = 0, int TRANS_B = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma_ss: N must be 64 or 128");
#ifdef TSCALE_SM90A_DEVICE
  if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TSCALE_WGMMA_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : TSCALE_F32(0)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TSCALE_WGMMA_D64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
        : TSCALE_F32(0), TSCALE_F32(32)
        : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B));
  }
#endif
}

// d (64 x 128 fp32) += A B: A (64 x 16 bf16) in registers (acc_to_a's layout), B (16 x 128 bf16) MN-major in
// shared memory (read transposed).
__device__ __forceinline__ void wgmma_rs_n128_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
#ifdef TSCALE_SM90A_DEVICE
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TSCALE_WGMMA_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : TSCALE_F32(0), TSCALE_F32(32)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(1));
#endif
}

#undef TSCALE_F32
#undef TSCALE_F4
#undef TSCALE_WGMMA_D64
#undef TSCALE_WGMMA_D32
#endif  // TSCALE_ATTENTION_EMULATE

}  // namespace
}  // namespace tscale::attn
