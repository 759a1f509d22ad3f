// Fused quantize on CUDA: amax + scale + cast (+ transposed copy) for the op declared in quantize.cpp.
//
// Per-row scales without the transposed copy (activations in the forward pass): one kernel,
//   one block per row. The block reads its row once (into shared memory when it fits,
//   K <= 11264 floats), reduces the row's amax, writes the scale and the cast row:
//   one read and one write of the tensor.
// Every other case (one scale per tensor, per-column scales, or the transposed copy) needs the
//   amax of a whole tensor or column before the first value can be cast, so it runs three
//   kernels: amax (atomicMax on the bits of non-negative floats, which order like the floats),
//   scales (scale = amax / QMAX and its inverse), and a cast over 32x32 tiles that writes q and,
//   through a shared-memory tile, q_t with coalesced rows: two reads and one or two writes.
// Delayed scaling (quantize_delayed, one scale per tensor): the scale comes from the amax of the tensor's
//   earlier calls, kept in a small state tensor on the device, so the cast needs no amax pass of its own:
//   one kernel reads x once, writes q (and q_t), and reduces this call's amax on the way; the grid's last
//   block pushes it into the history. A first call, whose history is still empty, runs the amax pass
//   before the cast (the same kernel as dynamic scaling; on later calls its blocks return at once).
// Vectorised forms: where K is a multiple of 8 and x is 16-byte aligned (and, for the
//   transposed copy, M a multiple of 4), each thread loads 8 values with 16-byte loads and
//   stores 8 bytes at once, the amax passes read 16 bytes per load, and the cast goes through
//   64 x 64 tiles whose transposed rows are written 4 bytes at a time. Same arithmetic, so the
//   same bits; other shapes take the scalar kernels (and every shape, with TSCALE_QUANTIZE_SCALAR=1).
// Casts: fp8 through __nv_cvt_float_to_fp8 with saturation to the finite range, rounding to
//   nearest even; int8 through rintf (half to even) and a clamp to +-127. The inverse scale is
//   one IEEE division (__fdiv_rn, immune to --use_fast_math), so the results equal the
//   reference's bit for bit.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

namespace tscale {
namespace {

constexpr float kAmaxFloor = 1e-12f;
constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kTileRows = 8;  // a tile block is 32 x 8 threads, each thread handles 4 rows
constexpr int64_t kMaxCachedRow = 44 * 1024 / sizeof(float);  // dynamic + static shared memory stay under 48 KB

enum Mode : int { kTensor = 0, kRows = 1, kCols = 2 };
enum Kind : int { kInt8 = 0, kE4M3 = 1, kE5M2 = 2 };

template <int kKind>
__device__ __forceinline__ uint8_t cast_to(float v, float qmax) {
  if constexpr (kKind == kInt8) {
    const float r = fminf(fmaxf(rintf(v), -qmax), qmax);
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  } else if constexpr (kKind == kE4M3) {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  } else {
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  return v;
}

// The max of v over the block, returned to every thread. blockDim.x must be kThreads.
__device__ float block_max(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float result;
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.f;
    w = warp_max(w);
    if (threadIdx.x == 0) result = w;
  }
  __syncthreads();
  return result;
}

constexpr int kVec = 8;     // values per thread per access
constexpr int kVTile = 64;  // the vectorised cast's tile: 64 x 64, 256 threads

// kWidth values at p as floats: one plain load for 1, 16-byte loads for 8 (p 16-byte aligned).
template <int kWidth, typename in_t>
__device__ __forceinline__ void load_values(const in_t* __restrict__ p, float (&v)[kWidth]) {
  if constexpr (kWidth == 1) {
    v[0] = static_cast<float>(*p);
  } else {
    static_assert(kWidth == kVec, "1 or 8 values");
    constexpr int kPer = 16 / sizeof(in_t);
#pragma unroll
    for (int j = 0; j < kVec; j += kPer) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p + j);
      const in_t* e = reinterpret_cast<const in_t*>(&raw);
#pragma unroll
      for (int k = 0; k < kPer; ++k) v[j + k] = static_cast<float>(e[k]);
    }
  }
}

// Per-row scales without the transposed copy: one block per row, kWidth values per thread and access
// (8 where K % 8 == 0 and x is aligned, else 1).
template <typename in_t, int kKind, bool kCached, int kWidth>
__global__ void rowwise_kernel(const in_t* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scale,
                               int64_t K, float qmax) {
  extern __shared__ float row[];
  const int64_t r = blockIdx.x;
  const in_t* xr = x + r * K;
  float m = 0.f;
  for (int64_t c = threadIdx.x * static_cast<int64_t>(kWidth); c < K; c += kThreads * kWidth) {
    float v[kWidth];
    load_values<kWidth>(xr + c, v);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      m = fmaxf(m, fabsf(v[k]));
      if constexpr (kCached) row[c + k] = v[k];
    }
  }
  const float amax = fmaxf(block_max(m), kAmaxFloor);  // block_max synchronises, so `row` is complete
  const float inv = __fdiv_rn(qmax, amax);
  if (threadIdx.x == 0) scale[r] = __fdiv_rn(amax, qmax);
  uint8_t* qr = q + r * K;
  for (int64_t c = threadIdx.x * static_cast<int64_t>(kWidth); c < K; c += kThreads * kWidth) {
    float v[kWidth];
    if constexpr (kCached) {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) v[k] = row[c + k];
    } else {
      load_values<kWidth>(xr + c, v);
    }
    alignas(kWidth) uint8_t b[kWidth];
#pragma unroll
    for (int k = 0; k < kWidth; ++k) b[k] = cast_to<kKind>(v[k] * inv, qmax);
    if constexpr (kWidth == 1) qr[c] = b[0];
    else *reinterpret_cast<uint2*>(qr + c) = *reinterpret_cast<const uint2*>(b);
  }
}

template <int kWidth>
__device__ __forceinline__ float abs_max(const float (&v)[kWidth], float m) {
#pragma unroll
  for (int k = 0; k < kWidth; ++k) m = fmaxf(m, fabsf(v[k]));
  return m;
}

// The amax of the whole tensor, kWidth values per thread and access; any tail past a multiple of
// kWidth is read one value at a time.
// skip (delayed scaling's history, `history` entries) non-null: the whole grid returns once any entry is set.
template <typename in_t, int kWidth>
__global__ void amax_tensor_kernel(const in_t* __restrict__ x, int64_t n, unsigned int* __restrict__ amax,
                                   const unsigned int* __restrict__ skip = nullptr, int history = 0) {
  for (int h = 0; h < history; ++h)
    if (skip[h] != 0) return;  // uniform over the grid
  const int64_t groups = n / kWidth, stride = static_cast<int64_t>(gridDim.x) * kThreads;
  float m = 0.f;
#pragma unroll 4
  for (int64_t g = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; g < groups; g += stride) {
    float v[kWidth];
    load_values<kWidth>(x + g * kWidth, v);
    m = abs_max(v, m);
  }
  for (int64_t i = groups * kWidth + blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n; i += stride) {
    m = fmaxf(m, fabsf(static_cast<float>(x[i])));
  }
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(m));
}

// One block per row, kWidth values per thread and access (K % kWidth == 0).
template <typename in_t, int kWidth>
__global__ void amax_rows_kernel(const in_t* __restrict__ x, int64_t K, unsigned int* __restrict__ amax) {
  const int64_t r = blockIdx.x;
  const in_t* xr = x + r * K;
  float m = 0.f;
  for (int64_t c = threadIdx.x * static_cast<int64_t>(kWidth); c < K; c += kThreads * kWidth) {
    float v[kWidth];
    load_values<kWidth>(xr + c, v);
    m = abs_max(v, m);
  }
  m = block_max(m);
  if (threadIdx.x == 0) amax[r] = __float_as_uint(m);
}

// grid (ceil(K / kThreads), row chunks): thread = one column over one chunk of rows; reads coalesced
// along rows. (Eight columns per thread was slower: see the launch below.)
template <typename in_t>
__global__ void amax_cols_kernel(const in_t* __restrict__ x, int64_t M, int64_t K, int64_t rows_per_chunk,
                                 unsigned int* __restrict__ amax) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (c >= K) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < M ? r0 + rows_per_chunk : M;
  float m = 0.f;
  for (int64_t r = r0; r < r1; ++r) m = fmaxf(m, fabsf(static_cast<float>(x[r * K + c])));
  atomicMax(amax + c, __float_as_uint(m));
}

__global__ void scales_kernel(const unsigned int* __restrict__ amax_bits, int64_t n, float qmax,
                              float* __restrict__ scale, float* __restrict__ inv) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= n) return;
  const float a = fmaxf(__uint_as_float(amax_bits[i]), kAmaxFloor);
  scale[i] = __fdiv_rn(a, qmax);
  inv[i] = __fdiv_rn(qmax, a);
}

// Delayed scaling's state on the device (quantize_delayed): bits[0, history) the amax of the tensor's last
// `history` calls as float bits, newest first (0: none yet); bits[history] this call's amax (zero between
// calls); bits[history + 1] the number of the call's blocks that have finished (zero between calls).
struct DelayedState {
  unsigned int* bits;
  int history;
  float* scale;  // the call's scale, amax / QMAX, written by the first block
};

// QMAX / amax for this call: the history's largest amax, or on a first call (empty history) the amax that
// the seeding pass left in bits[history]. Every block computes the same value before any block can finish.
__device__ __forceinline__ float delayed_inverse(const DelayedState& d, float qmax, bool write_scale) {
  float a = 0.f;
  for (int h = 0; h < d.history; ++h) a = fmaxf(a, __uint_as_float(d.bits[h]));
  if (a == 0.f) a = __uint_as_float(d.bits[d.history]);
  a = fmaxf(a, kAmaxFloor);
  if (write_scale) *d.scale = __fdiv_rn(a, qmax);
  return __fdiv_rn(qmax, a);
}

// After a block's cast: fold its amax m (over the values it read) into bits[history]. The grid's last block
// to finish shifts the history by one, puts this call's amax first and clears the two counters. Every one
// of the kThreads threads (linear id tid) calls it; history <= kThreads.
__device__ void delayed_finish(const DelayedState& d, float m, int tid) {
  __shared__ float partial[kThreads / 32];
  __shared__ bool last;
  m = warp_max(m);
  if (tid % 32 == 0) partial[tid / 32] = m;
  __syncthreads();
  if (tid == 0) {
    float b = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) b = fmaxf(b, partial[w]);
    atomicMax(d.bits + d.history, __float_as_uint(b));
    __threadfence();
    last = atomicAdd(d.bits + d.history + 1, 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  volatile unsigned int* v = d.bits;
  const unsigned int older = tid < d.history ? v[tid] : 0u;
  const unsigned int now = v[d.history];
  __syncthreads();
  if (tid + 1 < d.history) v[tid + 1] = older;
  if (tid == 0) {
    v[0] = now;
    v[d.history] = 0u;
    v[d.history + 1] = 0u;
  }
}

// grid (ceil(M / 32), ceil(K / 32)), block (32, 8). q_t may be null (no transposed copy).
// kDelayed: one scale per tensor from the delayed state d (inv unused), this call's amax folded into d.
template <typename in_t, int kKind, bool kDelayed = false>
__global__ void cast_tiles_kernel(const in_t* __restrict__ x, const float* __restrict__ inv, int mode, int64_t M,
                                  int64_t K, float qmax, uint8_t* __restrict__ q, uint8_t* __restrict__ q_t,
                                  DelayedState d = {}) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int tid = threadIdx.y * kTile + threadIdx.x;
  float delayed_inv = 0.f, m = 0.f;
  if constexpr (kDelayed) delayed_inv = delayed_inverse(d, qmax, blockIdx.x == 0 && blockIdx.y == 0 && tid == 0);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < M && c < K) {
      const float s = kDelayed ? delayed_inv : (mode == kTensor ? inv[0] : (mode == kRows ? inv[r] : inv[c]));
      const float value = static_cast<float>(x[r * K + c]);
      if constexpr (kDelayed) m = fmaxf(m, fabsf(value));
      const uint8_t v = cast_to<kKind>(value * s, qmax);
      q[r * K + c] = v;
      tile[i][threadIdx.x] = v;
    }
  }
  if (q_t != nullptr) {  // uniform over the grid, so no thread misses the barrier below
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (c < K && r < M) q_t[c * M + r] = tile[threadIdx.x][i];
    }
  }
  if constexpr (kDelayed) delayed_finish(d, m, tid);
}

// ---- the vectorised cast: 8 values per thread and access ----

// grid (ceil(M / 64), ceil(K / 64)), 256 threads; K % 8 == 0, and M % 4 == 0 when q_t is given.
// Load: 8 threads per tile row, 8 values each, 32 rows per pass. Transposed store: 16 threads per
// column of the tile, 4 rows (4 bytes of q_t) each, 16 columns per pass.
// kDelayed: as for cast_tiles_kernel.
template <typename in_t, int kKind, bool kDelayed = false>
__global__ void cast_tiles_vec_kernel(const in_t* __restrict__ x, const float* __restrict__ inv, int mode,
                                      int64_t M, int64_t K, float qmax, uint8_t* __restrict__ q,
                                      uint8_t* __restrict__ q_t, DelayedState d = {}) {
  __shared__ __align__(8) uint8_t tile[kVTile][kVTile + 8];  // rows 8-byte aligned for the 8-byte writes
  float delayed_inv = 0.f, m = 0.f;
  if constexpr (kDelayed)
    delayed_inv = delayed_inverse(d, qmax, blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kVTile, c0 = static_cast<int64_t>(blockIdx.y) * kVTile;
  const int tc = (threadIdx.x % (kVTile / kVec)) * kVec;
  for (int i = threadIdx.x / (kVTile / kVec); i < kVTile; i += kThreads / (kVTile / kVec)) {
    const int64_t r = r0 + i, c = c0 + tc;
    if (r < M && c < K) {
      float v[kVec];
      load_values<kVec>(x + r * K + c, v);
      uint2 packed;
      uint8_t* b = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float s = kDelayed ? delayed_inv : (mode == kTensor ? inv[0] : (mode == kRows ? inv[r] : inv[c + k]));
        if constexpr (kDelayed) m = fmaxf(m, fabsf(v[k]));
        b[k] = cast_to<kKind>(v[k] * s, qmax);
      }
      *reinterpret_cast<uint2*>(q + r * K + c) = packed;
      *reinterpret_cast<uint2*>(&tile[i][tc]) = packed;
    }
  }
  if (q_t != nullptr) {  // uniform over the grid, so no thread misses the barrier below
    __syncthreads();
    const int tr = (threadIdx.x % (kVTile / 4)) * 4;
    for (int j = threadIdx.x / (kVTile / 4); j < kVTile; j += kThreads / (kVTile / 4)) {
      const int64_t c = c0 + j, r = r0 + tr;
      if (c < K && r < M) {
        const uchar4 out = make_uchar4(tile[tr][j], tile[tr + 1][j], tile[tr + 2][j], tile[tr + 3][j]);
        *reinterpret_cast<uchar4*>(q_t + c * M + r) = out;
      }
    }
  }
  if constexpr (kDelayed) delayed_finish(d, m, threadIdx.x);
}

float qmax_of(at::ScalarType t, int* kind) {
  switch (t) {
    case at::kFloat8_e4m3fn: *kind = kE4M3; return 448.f;
    case at::kFloat8_e5m2: *kind = kE5M2; return 57344.f;
    case at::kChar: *kind = kInt8; return 127.f;
    default: TORCH_CHECK(false, "quantize: dtype must be float8_e4m3fn, float8_e5m2 or int8, got ", t);
  }
  return 0.f;
}

// Whether the vectorised kernels serve x (M, K) (q and q_t are fresh allocations, aligned);
// TSCALE_QUANTIZE_SCALAR=1 forces the scalar kernels, to compare the two.
template <typename in_t>
bool vectorised(const in_t* xp, int64_t M, int64_t K, bool transposed) {
  const char* scalar_only = std::getenv("TSCALE_QUANTIZE_SCALAR");
  return K % kVec == 0 && reinterpret_cast<uintptr_t>(xp) % 16 == 0 && (!transposed || M % 4 == 0) &&
         !(scalar_only != nullptr && scalar_only[0] == '1');
}

template <typename in_t, int kKind>
void launch(const at::Tensor& x, int mode, float qmax, at::Tensor& q, at::Tensor& scale, at::Tensor& q_t) {
  const int64_t M = x.size(0), K = x.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const in_t* xp = x.data_ptr<in_t>();
  uint8_t* qp = static_cast<uint8_t*>(q.data_ptr());
  float* sp = scale.data_ptr<float>();
  const bool transposed = q_t.numel() != 0;
  const bool vec = vectorised(xp, M, K, transposed);
  if (mode == kRows && !transposed) {
    TORCH_CHECK(M <= 0x7fffffffLL, "quantize: too many rows for one launch");
    const bool cached = K <= kMaxCachedRow;
    const size_t shared = cached ? K * sizeof(float) : 0;
    if (vec) {
      if (cached) rowwise_kernel<in_t, kKind, true, kVec><<<M, kThreads, shared, stream>>>(xp, qp, sp, K, qmax);
      else rowwise_kernel<in_t, kKind, false, kVec><<<M, kThreads, 0, stream>>>(xp, qp, sp, K, qmax);
    } else {
      if (cached) rowwise_kernel<in_t, kKind, true, 1><<<M, kThreads, shared, stream>>>(xp, qp, sp, K, qmax);
      else rowwise_kernel<in_t, kKind, false, 1><<<M, kThreads, 0, stream>>>(xp, qp, sp, K, qmax);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int64_t n_scales = mode == kTensor ? 1 : (mode == kRows ? M : K);
  at::Tensor amax = at::zeros({n_scales}, x.options().dtype(at::kInt));
  unsigned int* ap = reinterpret_cast<unsigned int*>(amax.data_ptr<int>());
  if (mode == kTensor) {
    const int64_t per_thread = vec ? kVec : 1;
    const int64_t blocks = std::min<int64_t>((M * K / per_thread + kThreads - 1) / kThreads, vec ? 4096 : 1024);
    if (vec) amax_tensor_kernel<in_t, kVec><<<std::max<int64_t>(blocks, 1), kThreads, 0, stream>>>(xp, M * K, ap);
    else amax_tensor_kernel<in_t, 1><<<blocks, kThreads, 0, stream>>>(xp, M * K, ap);
  } else if (mode == kRows) {
    if (vec) amax_rows_kernel<in_t, kVec><<<M, kThreads, 0, stream>>>(xp, K, ap);
    else amax_rows_kernel<in_t, 1><<<M, kThreads, 0, stream>>>(xp, K, ap);
  } else {
    // One value per thread even when `vec`: with 8 per thread a narrow K (1600) fills one column block,
    // so the 1024 row chunks all land on the same 1600 amax words: on the H200 the 8-wide kernel took
    // 0.111 ms against 0.039 ms for (16384, 1600) bf16 (docs/bench/lowprec_profile_1p5b_qkv*.txt).
    const int64_t col_blocks = (K + kThreads - 1) / kThreads;
    const int64_t chunks = std::min<int64_t>(std::max<int64_t>(1024 / col_blocks, 1), std::min<int64_t>(M, 65535));
    const int64_t rows_per_chunk = (M + chunks - 1) / chunks;
    const dim3 grid(col_blocks, (M + rows_per_chunk - 1) / rows_per_chunk);
    amax_cols_kernel<in_t><<<grid, kThreads, 0, stream>>>(xp, M, K, rows_per_chunk, ap);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  at::Tensor inv = at::empty({n_scales}, x.options().dtype(at::kFloat));
  scales_kernel<<<(n_scales + kThreads - 1) / kThreads, kThreads, 0, stream>>>(ap, n_scales, qmax, sp,
                                                                              inv.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  uint8_t* qtp = transposed ? static_cast<uint8_t*>(q_t.data_ptr()) : nullptr;
  const int tile = vec ? kVTile : kTile;
  TORCH_CHECK((K + tile - 1) / tile <= 65535, "quantize: K = ", K, " is too wide for one launch");
  const dim3 grid((M + tile - 1) / tile, (K + tile - 1) / tile);
  if (vec) {
    cast_tiles_vec_kernel<in_t, kKind><<<grid, kThreads, 0, stream>>>(xp, inv.data_ptr<float>(), mode, M, K, qmax,
                                                                      qp, qtp);
  } else {
    cast_tiles_kernel<in_t, kKind><<<grid, dim3(kTile, kTileRows), 0, stream>>>(xp, inv.data_ptr<float>(), mode, M,
                                                                                K, qmax, qp, qtp);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

constexpr int64_t kSeedBlocks = 512;  // the seeding amax pass: enough blocks to stream x, few to retire at once

// Delayed scaling, one scale per tensor: the seeding amax pass (it returns at once unless the history is
// empty), then one cast that also reduces this call's amax into the state.
template <typename in_t, int kKind>
void launch_delayed(const at::Tensor& x, float qmax, at::Tensor& q, at::Tensor& scale, at::Tensor& q_t,
                    at::Tensor& state) {
  const int64_t M = x.size(0), K = x.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const in_t* xp = x.data_ptr<in_t>();
  uint8_t* qp = static_cast<uint8_t*>(q.data_ptr());
  uint8_t* qtp = q_t.numel() ? static_cast<uint8_t*>(q_t.data_ptr()) : nullptr;
  const bool vec = vectorised(xp, M, K, qtp != nullptr);
  unsigned int* bits = reinterpret_cast<unsigned int*>(state.data_ptr<int>());
  const int history = static_cast<int>(state.numel() - 2);
  const int64_t per_thread = vec ? kVec : 1;
  const int64_t blocks = std::clamp<int64_t>((M * K / per_thread + kThreads - 1) / kThreads, 1, kSeedBlocks);
  if (vec) amax_tensor_kernel<in_t, kVec><<<blocks, kThreads, 0, stream>>>(xp, M * K, bits + history, bits, history);
  else amax_tensor_kernel<in_t, 1><<<blocks, kThreads, 0, stream>>>(xp, M * K, bits + history, bits, history);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const DelayedState d{bits, history, scale.data_ptr<float>()};
  const int tile = vec ? kVTile : kTile;
  TORCH_CHECK((K + tile - 1) / tile <= 65535, "quantize_delayed: K = ", K, " is too wide for one launch");
  const dim3 grid((M + tile - 1) / tile, (K + tile - 1) / tile);
  if (vec) {
    cast_tiles_vec_kernel<in_t, kKind, true><<<grid, kThreads, 0, stream>>>(xp, nullptr, kTensor, M, K, qmax, qp,
                                                                            qtp, d);
  } else {
    cast_tiles_kernel<in_t, kKind, true><<<grid, dim3(kTile, kTileRows), 0, stream>>>(xp, nullptr, kTensor, M, K,
                                                                                      qmax, qp, qtp, d);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_delayed_cuda(const at::Tensor& x_in, at::ScalarType dtype,
                                                                   at::Tensor& state, bool transpose) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.numel() > 0, "quantize_delayed: x must be 2-D (M, K) and not empty");
  TORCH_CHECK(state.scalar_type() == at::kInt && state.dim() == 1 && state.is_contiguous() &&
                  state.numel() >= 3 && state.numel() <= kThreads + 2 && state.device() == x_in.device(),
              "quantize_delayed: state must be a contiguous int32 (history + 2,) tensor on x's device, "
              "history 1..", kThreads);
  int kind = 0;
  const float qmax = qmax_of(dtype, &kind);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(dtype));
  at::Tensor q_t = at::empty(transpose ? std::vector<int64_t>{K, M} : std::vector<int64_t>{0}, x.options().dtype(dtype));
  at::Tensor scale = at::empty({}, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "quantize_delayed_cuda", [&] {
    if (kind == kE4M3) launch_delayed<scalar_t, kE4M3>(x, qmax, q, scale, q_t, state);
    else if (kind == kE5M2) launch_delayed<scalar_t, kE5M2>(x, qmax, q, scale, q_t, state);
    else launch_delayed<scalar_t, kInt8>(x, qmax, q, scale, q_t, state);
  });
  return {q, scale, q_t};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_cuda(const at::Tensor& x_in, at::ScalarType dtype,
                                                           std::optional<int64_t> axis, bool transpose) {
  TORCH_CHECK(x_in.dim() == 2, "quantize: x must be 2-D (M, K), got ", x_in.dim(), "-D");
  TORCH_CHECK(!axis.has_value() || *axis == 0 || *axis == 1 || *axis == -1,
              "quantize: axis must be None, 0, 1 or -1, got ", *axis);
  int kind = 0;
  const float qmax = qmax_of(dtype, &kind);
  const int mode = !axis.has_value() ? kTensor : (*axis == 0 ? kCols : kRows);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(dtype));
  at::Tensor q_t = at::empty(transpose ? std::vector<int64_t>{K, M} : std::vector<int64_t>{0}, x.options().dtype(dtype));
  std::vector<int64_t> scale_shape;
  if (mode == kRows) scale_shape = {M, 1};
  if (mode == kCols) scale_shape = {1, K};
  at::Tensor scale = at::empty(scale_shape, x.options().dtype(at::kFloat));
  if (M == 0 || K == 0) {
    scale.fill_(kAmaxFloor / qmax);
    return {q, scale, q_t};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "quantize_cuda", [&] {
    if (kind == kE4M3) launch<scalar_t, kE4M3>(x, mode, qmax, q, scale, q_t);
    else if (kind == kE5M2) launch<scalar_t, kE5M2>(x, mode, qmax, q, scale, q_t);
    else launch<scalar_t, kInt8>(x, mode, qmax, q, scale, q_t);
  });
  return {q, scale, q_t};
}

}  // namespace

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("quantize", &quantize_cuda);
  m.impl("quantize_delayed", &quantize_delayed_cuda);
}

}  // namespace tscale
