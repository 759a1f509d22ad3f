// Shared device pieces of the fused attention kernels: tile sizes, parameters, fragment loaders, mask rules.
//
// The kernels are written against a handful of warp primitives (ldmatrix, mma.sync m16n8k16 bf16,
// cp.async, shuffles, atomics) that come from a backend header included before this one:
// attention_cuda_backend.cuh (inline PTX, the real build) or the CPU emulator of
// tests/attention_emu (which defines TSCALE_ATTENTION_EMULATE and runs the same kernel source
// thread by thread, so the index arithmetic below is tested without a GPU).
//
// Conventions used by every kernel:
//   * bf16 data is handled as raw uint16_t; products accumulate in fp32.
//   * A warp's mma tile is 16 rows; lane = 4 * g + t4 holds rows g and g + 8 and, in an
//     accumulator n8-block, the columns 2 * t4 and 2 * t4 + 1 (PTX "groupID"/"threadID_in_group").
//   * Shared-memory tiles are row-major with kPad extra bf16 per row, so the 8 row addresses
//     of one ldmatrix fall in 8 different 16-byte bank groups (no bank conflicts).
//   * Scores live in the log2 domain: s2 = (q . k) * scale * log2(e), so exp(x) = exp2(x2).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#ifndef TSCALE_ATTENTION_EMULATE
#include "attention_cuda_backend.cuh"
#endif

namespace tscale::attn {
namespace {

constexpr int kThreads = 128;   // 4 warps per block, in every kernel but the element-wise ones
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;       // keys per forward step = keys per backward block
constexpr int kStatTile = 32;   // granularity of the per-tile document-id ranges
constexpr int kPad = 8;         // bf16 elements of padding after each shared-memory row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// Element strides of a (B, H, T, D) tensor whose last dimension is contiguous.
struct Strides {
  int64_t b, h, t;
};

struct FwdParams {
  const uint16_t* q;  // bf16 (B, H, T, D)
  const uint16_t* k;
  const uint16_t* v;
  Strides sq, sk, sv;
  uint16_t* o;        // bf16 (B, H, T, D) seen in (B, T, H, D) storage (so: its strides)
  Strides so;
  float* lse;         // fp32 (B, H, T), contiguous: natural-log logsumexp of each row (sink included)
  const int32_t* doc;      // (B, T) contiguous document ids, or nullptr (no document mask)
  const int32_t* doc_min;  // (B, n_stat): min / max document id over positions [32 s, 32 s + 32)
  const int32_t* doc_max;
  int B, H, T, D;
  int window;         // 0: unlimited; otherwise 1 <= window < T (the host normalises)
  int n_stat;         // ceil(T / kStatTile)
  bool sink;
  float scale_log2;   // scale * log2(e)
};

struct BwdParams {
  const uint16_t* q;  // bf16 (B, H, T, D)
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* o;  // forward output, bf16
  const uint16_t* dout;
  Strides sq, sk, sv, so, sdo;
  const float* lse;   // fp32 (B, H, T) from the forward
  float* delta;       // fp32 (B, H, T): rowsum(dO * O), written by the first backward kernel
  float* dq_accum;    // fp32 (B, H, T_pad, D) in mma-fragment order (see attention_bwd.cuh), zeroed
  uint16_t* dq;       // bf16 (B, H, T, D) seen in (B, T, H, D) storage, like dk and dv (sg: their strides)
  uint16_t* dk;
  uint16_t* dv;
  Strides sg;
  const int32_t* doc;
  const int32_t* doc_min;
  const int32_t* doc_max;
  int B, H, T, D;
  int T_pad;          // T rounded up to kTile
  int window;
  int n_stat;
  float scale;        // softmax scale, applied to dQ and dK at the end
  float scale_log2;
};

// The (tile rank, head, batch row) of this block of a tile_grid; rank 0 is a (head, batch row)'s longest tile (the
// kernel maps ranks to tiles). Read straight from the block index: computed (e.g. from a linear block number), the
// values stay live in registers, which cost the Hopper backward 72 bytes of spills and the sm_80 forward 36.
struct BlockTile {
  int rank, h, b;
};

__device__ __forceinline__ BlockTile block_tile() {
  return {static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.z)};
}

// ---------------------------------------------------------------------------------------------
// Fragment loaders. All take the lane index; each wraps one ldmatrix.x4 (four 8x8 matrices; lane
// 8 m + r gives the address of row r of matrix m; lane 4 r + w receives the 32-bit word w of
// row r of each matrix, or of its transpose with .trans).
// ---------------------------------------------------------------------------------------------

// Tiles are passed as 32-bit shared addresses (smem_addr) and pitches in bf16 elements.

// mma operand A (16 x 16, rows m, columns k) from a tile stored row-major as [m][k]:
// a[0] = rows 0-7 / cols 0-7, a[1] = rows 8-15 / cols 0-7, a[2] = rows 0-7 / cols 8-15, a[3] = rows 8-15 / cols 8-15.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int pitch, int m0, int k0, int lane) {
  ldsm_x4(a, tile + 2 * ((m0 + (lane & 15)) * pitch + k0 + (lane >> 4) * 8));
}

// mma operand A (16 x 16) from a tile stored transposed, as [k][m] (e.g. dS^T stored [key][query]).
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4], uint32_t tile, int pitch, int m0, int k0, int lane) {
  ldsm_x4_t(a, tile + 2 * ((k0 + (lane & 7) + ((lane >> 4) << 3)) * pitch + m0 + ((lane >> 3) & 1) * 8));
}

// mma operand B (k16 x n8) for two n-blocks, n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2], b[3]),
// from a tile stored as [n][k] (e.g. K[key][d] for S = Q K^T, where B[d][key] = K[key][d]).
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], uint32_t tile, int pitch, int n0, int k0, int lane) {
  ldsm_x4(b, tile + 2 * ((n0 + (lane & 7) + ((lane >> 4) << 3)) * pitch + k0 + ((lane >> 3) & 1) * 8));
}

// mma operand B for two n-blocks from a tile stored as [k][n] (e.g. V[key][d] for O = P V), transposing.
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], uint32_t tile, int pitch, int k0, int n0, int lane) {
  ldsm_x4_t(b, tile + 2 * ((k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0 + (lane >> 4) * 8));
}

// Accumulator n-blocks 2s and 2s+1 (fp32, 16 rows x 16 columns) as the bf16 A operand of k-step s:
// the accumulator layout of columns 16s..16s+15 is exactly the A layout of that k-step.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Copies rows [row0, row0 + ROWS) of a (T, D) bf16 matrix with row stride `stride` (elements)
// into the shared tile [ROWS][D + kPad] (at shared address `tile`) with 16-byte cp.async; rows at
// or past T are zero-filled (the source address is then clamped to row 0 and nothing is read).
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(uint32_t tile, const uint16_t* g, int64_t stride, int row0, int T, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = tid; i < ROWS * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = row0 + r < T;
    const uint16_t* src = g + (ok ? static_cast<int64_t>(row0 + r) * stride : 0) + c * 8;
    cp_async_16(tile + 2 * (r * (D + kPad) + c * 8), src, ok ? 16 : 0);
  }
}

// The reverse, by one warp: its staged rows [0, rows) of the shared tile [.][D + kPad] (at `tile`) to rows
// row0.. of a (T, D) bf16 matrix with row stride `stride`, as 16-byte stores of whole rows.
template <int D>
__device__ __forceinline__ void store_rows(uint16_t* g, int64_t stride, int row0, uint32_t tile, int rows, int lane) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = lane; i < rows * kChunks; i += 32) {
    const int r = i / kChunks, c = i % kChunks;
    copy_shared_to_global_16(g + static_cast<int64_t>(row0 + r) * stride + c * 8, tile + 2 * (r * (D + kPad) + c * 8));
  }
}

// ---------------------------------------------------------------------------------------------
// Mask rules. Query p sees key j iff j <= p, p - j < window (window 0: no limit), j < T and
// doc[j] == doc[p]. Tiles are skipped whole when no pair can be visible, and the per-element
// mask is skipped when every pair of a tile pair is visible.
// ---------------------------------------------------------------------------------------------

struct DocRange {
  int lo, hi;  // min and max document id over a range of positions
};

__device__ __forceinline__ bool overlaps(DocRange a, DocRange b) { return a.lo <= b.hi && b.lo <= a.hi; }

// Document-id range of positions [pos0, pos0 + n), pos0 a multiple of kStatTile, from the
// per-32-position ranges of one batch row (dmin, dmax already offset to that row).
__device__ __forceinline__ DocRange doc_range(const int32_t* dmin, const int32_t* dmax, int pos0, int n, int n_stat) {
  const int s1 = imin(n_stat, (pos0 + n + kStatTile - 1) / kStatTile);
  DocRange r{INT_MAX, INT_MIN};
  for (int s = pos0 / kStatTile; s < s1; ++s) {
    r.lo = imin(r.lo, dmin[s]);
    r.hi = imax(r.hi, dmax[s]);
  }
  return r;
}

// True when no document boundary falls inside the tile pair: every position of both lies in one document
// (or there are no documents), so visibility is the causal, window and T bounds alone.
__device__ __forceinline__ bool single_document(bool docs, DocRange qd, DocRange kd) {
  return !docs || (qd.lo == qd.hi && kd.lo == kd.hi && qd.lo == kd.lo);
}

// True when every query in [q0, q1] sees every key in [k0, k1] (nominal tile extents, not clipped
// to T: a tile that runs past T is never "all visible", so out-of-range keys always get masked).
__device__ __forceinline__ bool all_visible(int q0, int q1, int k0, int k1, int window, bool docs, DocRange qd,
                                            DocRange kd) {
  if (k1 > q0) return false;                          // some key lies after some query
  if (window > 0 && q1 - k0 >= window) return false;  // some key is out of some query's window
  return single_document(docs, qd, kd);               // and no document boundary inside the pair
}

__device__ __forceinline__ bool visible(int p, int j, int T, int window, bool docs, int doc_p, int doc_j) {
  return j <= p && (window == 0 || p - j < window) && j < T && (!docs || doc_p == doc_j);
}

constexpr int kNoBound = 1 << 30;  // an interval end no tile offset reaches

// In a tile pair without a document boundary, the queries p that see key j lie in [j, j + window - 1] (none
// when j >= T; visible()); as offsets c = p - base: [lo, hi].
__device__ __forceinline__ void key_query_interval(int j, int base, int T, int window, int& lo, int& hi) {
  lo = j < T ? j - base : kNoBound;
  hi = window > 0 ? j + window - 1 - base : kNoBound;
}

// Block-wide min (is_min) or max of one int held by every thread that has one (has == true);
// `init` when none has. `slot` is one int of shared memory. Every thread of the block must call it.
__device__ __forceinline__ int block_extreme(int* slot, bool has, int value, int init, bool is_min) {
  if (threadIdx.x == 0) *slot = init;
  __syncthreads();
  if (has) {
    if (is_min)
      atomic_min_shared(slot, value);
    else
      atomic_max_shared(slot, value);
  }
  __syncthreads();
  const int r = *slot;
  __syncthreads();  // the slot may be reused right after
  return r;
}

// The key tiles (of `bn` keys) that the query tile [q0, q0 + bm) of batch row b visits in the forward: none after the
// causal bound (`last`), none before the window's first key, and of those only the tiles whose document-id range
// meets the query tile's (every later one does, with non-decreasing ids).
struct ForwardKeyTiles {
  bool docs;
  const int32_t* dmin;  // per-32-position document-id ranges of batch row b (when docs)
  const int32_t* dmax;
  int n_stat, bn, last;
  DocRange qd;  // the query tile's document ids

  __device__ __forceinline__ DocRange key_range(int t) const {
    return docs ? doc_range(dmin, dmax, t * bn, bn, n_stat) : DocRange{0, 0};
  }
  __device__ __forceinline__ bool seen(int t) const { return !docs || overlaps(qd, key_range(t)); }
  // The next key tile to visit after t, or -1.
  __device__ __forceinline__ int next(int t) const {
    for (++t; t <= last; ++t)
      if (seen(t)) return t;
    return -1;
  }
  // The first one: the window's, then the first whose documents meet the queries' (the tile of q0 always does),
  // found by all `nthreads` threads of the block at once; each must call it (block_extreme, `slot`).
  __device__ __forceinline__ int first(int q0, int window, int tid, int nthreads, int* slot) const {
    const int from = window_first(q0, window);
    if (!docs) return from;
    const int own = q0 / bn;
    return block_extreme(slot, true, first_candidate(from, own, tid, nthreads), own, /*is_min=*/true);
  }
  // The same, found by the 32 lanes of one warp on their own (no block-wide wait): for kernels whose warps take
  // different roles.
  __device__ __forceinline__ int first_by_warp(int q0, int window, int lane) const {
    const int from = window_first(q0, window);
    if (!docs) return from;
    int mine = first_candidate(from, q0 / bn, lane, 32);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mine = imin(mine, warp_xor_i32(mine, o));
    return mine;
  }
  // The first key tile of the window (0 without one) for the query tile at q0.
  __device__ __forceinline__ int window_first(int q0, int window) const {
    return window > 0 ? imax(0, q0 - window + 1) / bn : 0;
  }
  // One thread's share of the search for the first tile: the first of tiles from + k, from + k + stride, ... before
  // `own` whose documents meet the queries', else `own`.
  __device__ __forceinline__ int first_candidate(int from, int own, int k, int stride) const {
    for (int t = from + k; t < own; t += stride)
      if (seen(t)) return t;  // this thread's later candidates are larger
    return own;
  }
};

// (Params: FwdParams, or BwdParams for the backward's query-major dQ kernel.)
template <typename Params>
__device__ __forceinline__ ForwardKeyTiles forward_key_tiles(const Params& p, int b, int q0, int bm, int bn) {
  ForwardKeyTiles w;
  w.docs = p.doc != nullptr;
  w.dmin = w.docs ? p.doc_min + static_cast<int64_t>(b) * p.n_stat : nullptr;
  w.dmax = w.docs ? p.doc_max + static_cast<int64_t>(b) * p.n_stat : nullptr;
  w.n_stat = p.n_stat;
  w.bn = bn;
  w.last = imin((q0 + bm - 1) / bn, (p.T + bn - 1) / bn - 1);
  w.qd = w.docs ? doc_range(w.dmin, w.dmax, q0, bm, p.n_stat) : DocRange{0, 0};
  return w;
}

// The query tiles (of `bm` queries) that the key tile [k0, k0 + bk) of batch row b visits in the backward: from the
// tile of query k0 (its first positions are these keys, so its documents meet theirs) to the window's end, then
// back to the last tile whose document-id range meets the key tile's; between, those whose range meets it.
struct BackwardQueryTiles {
  bool docs;
  const int32_t* dmin;  // per-32-position document-id ranges of batch row b (when docs)
  const int32_t* dmax;
  int n_stat, bm, first, last;
  DocRange kd;  // the key tile's document ids

  __device__ __forceinline__ DocRange query_range(int i) const {
    return docs ? doc_range(dmin, dmax, i * bm, bm, n_stat) : DocRange{0, 0};
  }
  __device__ __forceinline__ bool seen(int i) const { return !docs || overlaps(kd, query_range(i)); }
  // The next query tile to visit after i, or -1.
  __device__ __forceinline__ int next(int i) const {
    for (++i; i <= last; ++i)
      if (seen(i)) return i;
    return -1;
  }
};

// Every one of the block's `nthreads` threads must call it (the last tile is found by all at once: block_extreme).
__device__ __forceinline__ BackwardQueryTiles backward_query_tiles(const BwdParams& p, int b, int k0, int bk, int bm,
                                                                   int tid, int nthreads, int* slot) {
  BackwardQueryTiles w;
  w.docs = p.doc != nullptr;
  w.dmin = w.docs ? p.doc_min + static_cast<int64_t>(b) * p.n_stat : nullptr;
  w.dmax = w.docs ? p.doc_max + static_cast<int64_t>(b) * p.n_stat : nullptr;
  w.n_stat = p.n_stat;
  w.bm = bm;
  w.kd = w.docs ? doc_range(w.dmin, w.dmax, k0, bk, p.n_stat) : DocRange{0, 0};
  w.first = k0 / bm;
  w.last = (p.window > 0 ? imin(p.T - 1, k0 + bk - 1 + p.window - 1) : p.T - 1) / bm;
  if (w.docs) {
    int mine = w.first;
    for (int i = w.last - tid; i > w.first; i -= nthreads) {
      if (w.seen(i)) {
        mine = i;
        break;  // this thread's later candidates are smaller
      }
    }
    w.last = block_extreme(slot, true, mine, w.first, /*is_min=*/false);
  }
  return w;
}

// Per-32-position document-id ranges: dmin/dmax (B, n_stat) from doc (B, T). One warp per range:
// lane j reads position 32 s + j (a warp's loads are one 128-byte line), then a butterfly of
// shuffles leaves the range's min and max in every lane.
__global__ void __launch_bounds__(kThreads) doc_stats_kernel(const int32_t* __restrict__ doc,
                                                             int32_t* __restrict__ dmin, int32_t* __restrict__ dmax,
                                                             int B, int T, int n_stat) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;  // over B * n_stat
  if (i >= static_cast<int64_t>(B) * n_stat) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const int64_t b = i / n_stat;
  const int j = static_cast<int>(i % n_stat) * kStatTile + lane;
  const bool in = j < T;  // the last range of a row may be short
  int lo = in ? doc[b * T + j] : INT_MAX, hi = in ? doc[b * T + j] : INT_MIN;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    lo = imin(lo, warp_xor_i32(lo, m));
    hi = imax(hi, warp_xor_i32(hi, m));
  }
  if (lane == 0) {
    dmin[i] = lo;
    dmax[i] = hi;
  }
}

}  // namespace
}  // namespace tscale::attn
