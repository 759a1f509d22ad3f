// The fused attention backward: kernels and host entry attention_bwd_cuda(dout, q, k, v, out, lse, doc_ids?, window, sink, scale) -> (dq, dk, dv).
//
// Three kernels, in order:
//   1. delta: Delta = rowsum(dO * O) per query row (one warp per row), fp32 (B, H, T); the same
//      warp zeroes the row's share of dq_accum.
//   2. main: one block of 4 warps per (64-key tile, head, batch row); warp w owns key rows
//      16w..16w+15. K and V stay in shared memory; the block walks the query tiles (BM = 64
//      queries for D = 64, 32 for D = 128, to keep dK and dV in registers) that can see its keys:
//        S^T = K Q^T, P^T = exp2(S^T * scale * log2 e - lse * log2 e) (masked), dP^T = V dO^T,
//        dS^T = P^T * (dP^T - Delta)                      (all 16 x BM per warp, registers)
//        dV += P^T dO,  dK += dS^T Q                      (P^T, dS^T reused as bf16 A operands)
//        dQ(tile) += dS K                                 (dS^T through shared memory, then fp32
//                                                          atomicAdd into dq_accum)
//      The next query tile (Q, dO, lse, Delta, doc ids; double-buffered) is fetched while the
//      current one is processed.
//   3. dq: dq = scale * dq_accum as bf16 (B, H, T, D), one warp per 16-row strip, staged in shared
//      memory so that rows leave as 16-byte stores (4-byte stores of fragment pairs, 16 bytes per row
//      per instruction, cost the H200 far more than the bytes: docs/BENCHMARKS.md, "Whole-row stores").
// dQ is accumulated with atomics (no second pass that would recompute S and dP): dq_accum holds,
// for each 16-query x 8-dim block of each (b, h), its 128 floats in mma accumulator order, either
// element-major (element c of lane L at c * 32 + L: one warp-wide atomicAdd covers 32 consecutive
// floats; the sm_80 kernel's order) or lane-major (at L * 4 + c: one four-float vector atomic per lane
// covers 128, sm_90 and later; the Hopper kernel's with TSCALE_ATTENTION_SM90_BWD_DQ_V4).
// Summation order varies from run to run, so dq is not bit-reproducible (dk, dv are).
// The split backward (TSCALE_ATTENTION_BWD_DQ=split, bwd_split_dq) runs attention_bwd_query.cuh's query-major kernel
// (dq and Delta, no atomics, no dq_accum) and then the main kernel without its dQ part: two kernels, dq reproducible.
//
// Query tiles visited by the key tile [k0, k0 + 64): causal, from the tile of query k0; window,
// up to the tile of query k0 + 63 + window - 1; documents, up to the last tile whose id range
// meets the key tile's (found by all threads at once), skipping those that don't as the loop
// reaches them. Per-element masking only where all_visible() says a pair may be hidden.
#pragma once

#include <algorithm>

#include "attention_bwd_query.cuh"
#include "attention_host.h"

namespace tscale::attn {
namespace {

template <int D>
struct BwdLayout {
  static constexpr int kBM = D == 128 ? 32 : 64;  // queries per step
  static constexpr int kPitch = D + kPad;
  static constexpr int kDsPitch = kBM + kPad;
  static constexpr size_t kKVBytes = size_t{kTile} * kPitch * 2;
  static constexpr size_t kQBytes = size_t{kBM} * kPitch * 2;
  static constexpr size_t kK = 0, kV = kK + kKVBytes;
  static constexpr size_t kQ = kV + kKVBytes;           // [2][BM][pitch], by step parity
  static constexpr size_t kDO = kQ + 2 * kQBytes;       // [2][BM][pitch]
  static constexpr size_t kDS = kDO + 2 * kQBytes;      // dS^T [64 keys][BM queries + pad]
  static constexpr size_t kLse = kDS + size_t{kTile} * kDsPitch * 2;  // float [2][BM]: lse * log2 e
  static constexpr size_t kDelta = kLse + 2 * kBM * sizeof(float);     // float [2][BM]
  static constexpr size_t kQDocs = kDelta + 2 * kBM * sizeof(float);   // int32 [2][BM]
  static constexpr size_t kSlot = kQDocs + 2 * kBM * sizeof(int32_t);
  static constexpr size_t kBytes = kSlot + 16;
};

template <int D>
__global__ void __launch_bounds__(kThreads) attention_bwd_delta_kernel(const BwdParams p) {
  constexpr int kPer = D / 32;  // elements per lane
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;  // over B * H * T
  if (row >= static_cast<int64_t>(p.B) * p.H * p.T) return;  // whole warps leave together
  const int64_t t = row % p.T, bh = row / p.T;
  const int64_t h = bh % p.H, b = bh / p.H;
  const uint16_t* o = p.o + b * p.so.b + h * p.so.h + t * p.so.t + lane * kPer;
  const uint16_t* d = p.dout + b * p.sdo.b + h * p.sdo.h + t * p.sdo.t + lane * kPer;
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc += bf16_to_float(o[i]) * bf16_to_float(d[i]);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) acc += warp_xor(acc, m);
  if (lane == 0) p.delta[row] = acc;
  // Zero this row's share of dq_accum (D floats at row t of its (b, h); the last row also zeroes
  // the padding rows up to T_pad, which hold fragments of the last 16-row block when T % 16 != 0).
  float* dqa = p.dq_accum + bh * p.T_pad * D;
  const int64_t end = t == p.T - 1 ? static_cast<int64_t>(p.T_pad) * D : (t + 1) * D;
  for (int64_t i = t * D + lane * 4; i < end; i += 128) store_zero_16(dqa + i);
}

// WITH_DQ = false: the split backward's dK and dV only (attention_bwd_query.cuh computed dq and Delta before it).
template <int D, bool WITH_DQ = true>
__global__ void __launch_bounds__(kThreads) attention_bwd_kernel(const BwdParams p) {
  using L = BwdLayout<D>;
  constexpr int BM = L::kBM, P = L::kPitch, PS = L::kDsPitch;
  constexpr int kQB = BM / 8;                 // n8-blocks of queries in S^T
  constexpr int kDB = D / 8;                  // n8-blocks of head dims in dK, dV
  constexpr int kWM = BM / 16;                // dQ: warps as kWM (16-query rows) x kWN (column slices)
  constexpr int kWN = kWarps / kWM;
  constexpr int kDQCols = D / kWN;
  constexpr int kDQB = kDQCols / 8;
  static_assert(kWM * kWN == kWarps && kDQB % 2 == 0, "dQ warp layout");
  TSCALE_ATTN_DYNAMIC_SMEM(smem);
  const uint32_t base = smem_addr(smem);
  const uint32_t k_s = base + L::kK;    // (64, D) keys of this block
  const uint32_t v_s = base + L::kV;    // (64, D) values
  const uint32_t q_s = base + L::kQ;    // [2] x (BM, D) queries, by step parity
  const uint32_t do_s = base + L::kDO;  // [2] x (BM, D) output gradients
  const uint32_t ds_s = base + L::kDS;  // dS^T (64 keys, BM queries), read by ldmatrix
  uint16_t* ds_w = reinterpret_cast<uint16_t*>(smem + L::kDS);  // the same, written by plain stores
  float* lse_s = reinterpret_cast<float*>(smem + L::kLse);
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);
  int32_t* qdocs_s = reinterpret_cast<int32_t*>(smem + L::kQDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const BlockTile bt = block_tile();
  const int kt = bt.rank, h = bt.h, b = bt.b;  // the first key tiles see the most queries
  const int k0 = kt * kTile;
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;
  const uint16_t* qg = p.q + b * p.sq.b + h * p.sq.h;  // (T, D) rows of this (b, h)
  const uint16_t* kg = p.k + b * p.sk.b + h * p.sk.h;
  const uint16_t* vg = p.v + b * p.sv.b + h * p.sv.h;
  const uint16_t* dog = p.dout + b * p.sdo.b + h * p.sdo.h;
  const float* lse_g = p.lse + bh * T;
  const float* delta_g = p.delta + bh * T;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const int32_t* dmin = docs ? p.doc_min + static_cast<int64_t>(b) * p.n_stat : nullptr;
  const int32_t* dmax = docs ? p.doc_max + static_cast<int64_t>(b) * p.n_stat : nullptr;
  const DocRange kd = docs ? doc_range(dmin, dmax, k0, kTile, p.n_stat) : DocRange{0, 0};
  auto query_range = [&](int i) { return docs ? doc_range(dmin, dmax, i * BM, BM, p.n_stat) : DocRange{0, 0}; };
  auto tile_seen = [&](int i) { return !docs || overlaps(kd, query_range(i)); };

  // Query tiles [first, last]: from the tile of query k0 (it meets our documents: its first
  // positions are our keys) to the window's end, then back to the last tile whose documents meet ours.
  const int first = k0 / BM;
  int last = (window > 0 ? imin(T - 1, k0 + kTile - 1 + window - 1) : T - 1) / BM;
  if (docs) {
    int mine = first;
    for (int i = last - tid; i > first; i -= kThreads) {
      if (tile_seen(i)) {
        mine = i;
        break;  // this thread's later candidates are smaller
      }
    }
    last = block_extreme(slot, true, mine, first, /*is_min=*/false);
  }
  auto next_tile = [&](int i) {  // the next query tile to visit after i, or -1
    for (++i; i <= last; ++i)
      if (tile_seen(i)) return i;
    return -1;
  };
  auto fetch_queries = [&](int i, int parity) {
    const int q0 = i * BM;
    load_tile<BM, D>(q_s + parity * L::kQBytes, qg, p.sq.t, q0, T, tid);
    load_tile<BM, D>(do_s + parity * L::kQBytes, dog, p.sdo.t, q0, T, tid);
    for (int r = tid; r < BM; r += kThreads) {
      const int qi = q0 + r;
      const bool ok = qi < T;
      lse_s[parity * BM + r] = ok ? lse_g[qi] * kLog2e : INFINITY;  // rows past T: P = 0
      delta_s[parity * BM + r] = ok ? delta_g[qi] : 0.f;
      if (docs) qdocs_s[parity * BM + r] = ok ? doc[qi] : INT_MIN;
    }
  };

  // Prologue: group 1 = K and V, group 2 = the first query tile.
  load_tile<kTile, D>(k_s, kg, p.sk.t, k0, T, tid);
  load_tile<kTile, D>(v_s, vg, p.sv.t, k0, T, tid);
  cp_async_commit();
  fetch_queries(first, 0);
  cp_async_commit();

  const int key0 = k0 + warp * 16 + g, key1 = key0 + 8;  // this thread's two key rows
  const int kdoc0 = docs && key0 < T ? doc[key0] : -1;
  const int kdoc1 = docs && key1 < T ? doc[key1] : -1;
  float dk[kDB][4], dv[kDB][4];  // 16 keys x D per warp
#pragma unroll
  for (int j = 0; j < kDB; ++j) {
    dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = 0.f;
    dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.f;
  }
  float* dqa = p.dq_accum + bh * p.T_pad * D;

  int i = first;
  for (int step = 0; i >= 0; ++step) {
    const int parity = step & 1;
    const int ni = next_tile(i);
    // Buffer parity^1 was last read before the second barrier of the previous step: free.
    if (ni >= 0) fetch_queries(ni, parity ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // all but the newest group (the next tile) are in: K, V and tile i
    __syncthreads();
    const uint32_t qt_s = q_s + parity * L::kQBytes;
    const uint32_t dot_s = do_s + parity * L::kQBytes;
    const float* lse_t = lse_s + parity * BM;
    const float* delta_t = delta_s + parity * BM;
    const int32_t* qdocs_t = qdocs_s + parity * BM;

    float s[kQB][4], dp[kQB][4];  // S^T = K Q^T and dP^T = V dO^T: 16 keys x BM queries per warp
#pragma unroll
    for (int j = 0; j < kQB; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
    }
#pragma unroll
    for (int kd16 = 0; kd16 < D / 16; ++kd16) {
      uint32_t ak[4], av[4];
      load_a(ak, k_s, P, warp * 16, kd16 * 16, lane);
      load_a(av, v_s, P, warp * 16, kd16 * 16, lane);
#pragma unroll
      for (int np = 0; np < kQB / 2; ++np) {
        uint32_t bf[4];
        load_b_nk(bf, qt_s, P, np * 16, kd16 * 16, lane);
        mma_bf16(s[2 * np], ak, bf[0], bf[1]);
        mma_bf16(s[2 * np + 1], ak, bf[2], bf[3]);
        load_b_nk(bf, dot_s, P, np * 16, kd16 * 16, lane);
        mma_bf16(dp[2 * np], av, bf[0], bf[1]);
        mma_bf16(dp[2 * np + 1], av, bf[2], bf[3]);
      }
    }

    // P^T (into s) and dS^T = P^T (dP^T - Delta) (into dp), element by element. Without a document boundary
    // in the tile pair (one_doc), the queries that see a key here are one interval of columns.
    const int q0 = i * BM;
    const DocRange qd = query_range(i);
    const bool full = all_visible(q0, q0 + BM - 1, k0, k0 + kTile - 1, window, docs, qd, kd);
    const bool one_doc = single_document(docs, qd, kd);
    int lo[2], hi[2];  // one_doc: key row key0 (r = 0) or key1 (r = 1) is seen by columns c = qc - 2 t4 in [lo, hi]
    key_query_interval(key0, q0 + t4 * 2, T, window, lo[0], hi[0]);
    key_query_interval(key1, q0 + t4 * 2, T, window, lo[1], hi[1]);
#pragma unroll
    for (int j = 0; j < kQB; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * 8 + (e & 1), qc = t4 * 2 + c;  // qc: the query column within the tile
        float pv = exp2f(s[j][e] * p.scale_log2 - lse_t[qc]);
        if (!full) {
          const int r = e >> 1;
          const bool ok = one_doc ? c >= lo[r] && c <= hi[r]
                                  : visible(q0 + qc, r ? key1 : key0, T, window, docs, qdocs_t[qc], r ? kdoc1 : kdoc0);
          if (!ok) pv = 0.f;
        }
        s[j][e] = pv;
        dp[j][e] = pv * (dp[j][e] - delta_t[qc]);
      }
    }

#pragma unroll
    for (int ks = 0; ks < BM / 16; ++ks) {  // dV += P^T dO, dK += dS^T Q: 16 queries per k-step
      uint32_t ap[4], ad[4];
      acc_to_a(ap, s[2 * ks], s[2 * ks + 1]);
      acc_to_a(ad, dp[2 * ks], dp[2 * ks + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bf[4];
        load_b_kn(bf, dot_s, P, ks * 16, dn * 16, lane);
        mma_bf16(dv[2 * dn], ap, bf[0], bf[1]);
        mma_bf16(dv[2 * dn + 1], ap, bf[2], bf[3]);
        load_b_kn(bf, qt_s, P, ks * 16, dn * 16, lane);
        mma_bf16(dk[2 * dn], ad, bf[0], bf[1]);
        mma_bf16(dk[2 * dn + 1], ad, bf[2], bf[3]);
      }
    }

    if constexpr (!WITH_DQ) {
      __syncthreads();  // every warp is done with this parity's query buffers, which the next step refills
      i = ni;
      continue;
    }
    // dS^T as bf16 into shared memory: this warp's 16 key rows, BM query columns.
#pragma unroll
    for (int j = 0; j < kQB; ++j) {
      uint16_t* r0 = ds_w + (warp * 16 + g) * PS + j * 8 + t4 * 2;
      *reinterpret_cast<uint32_t*>(r0) = pack_bf16(dp[j][0], dp[j][1]);
      *reinterpret_cast<uint32_t*>(r0 + 8 * PS) = pack_bf16(dp[j][2], dp[j][3]);
    }
    __syncthreads();  // dS^T complete; the query buffers of this parity are no longer read

    // dQ(tile) += dS K: warp (wm, wn) takes query rows 16 wm.. and head dims kDQCols wn..
    const int wm = warp % kWM, wn = warp / kWM;
    float dq[kDQB][4];
#pragma unroll
    for (int j = 0; j < kDQB; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // 16 keys per k-step
      uint32_t a[4];
      load_a_t(a, ds_s, PS, wm * 16, ks * 16, lane);
#pragma unroll
      for (int np = 0; np < kDQB / 2; ++np) {
        uint32_t bf[4];
        load_b_kn(bf, k_s, P, ks * 16, wn * kDQCols + np * 16, lane);
        mma_bf16(dq[2 * np], a, bf[0], bf[1]);
        mma_bf16(dq[2 * np + 1], a, bf[2], bf[3]);
      }
    }
    // Fragment-order dq_accum: block (16-query row q16, 8-dim column n) at (q16 * D/8 + n) * 128.
    float* blk = dqa + (static_cast<int64_t>((q0 + wm * 16) / 16) * (D / 8) + wn * kDQCols / 8) * 128;
#pragma unroll
    for (int j = 0; j < kDQB; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) atomic_add_f32(blk + j * 128 + c * 32 + lane, dq[j][c]);
    }
    // No barrier here: the next writes to ds_s come after the next step's first barrier, and the
    // next fetch targets the other query buffer.
    i = ni;
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight

  uint16_t* dkg = p.dk + b * p.sg.b + h * p.sg.h;  // (T, D) rows of this (b, h), p.sg.t apart
  uint16_t* dvg = p.dv + b * p.sg.b + h * p.sg.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = r == 0 ? key0 : key1;
    if (key >= T) continue;
#pragma unroll
    for (int j = 0; j < kDB; ++j) {
      const int64_t at = static_cast<int64_t>(key) * p.sg.t + j * 8 + t4 * 2;
      *reinterpret_cast<uint32_t*>(dkg + at) = pack_bf16(dk[j][2 * r] * p.scale, dk[j][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvg + at) = pack_bf16(dv[j][2 * r], dv[j][2 * r + 1]);
    }
  }
}

// The dq kernel's shared memory: per warp, its 16-row strip of dq as bf16 rows of D + kPad elements.
template <int D>
struct DqLayout {
  static constexpr int kPitch = D + kPad;
  static constexpr size_t kBytes = size_t{8} * 16 * kPitch * 2;
};

// dq (B, H, T, D) bf16 (token-major storage) = scale * dq_accum, read back in the fragment order the backward
// kernel accumulated it in (LANE_MAJOR: lane L's c0..c3 at 4 L.., else c at 32 c + L). One warp per 16-row strip of
// one (b, h): each 16 x 8 fragment block is 128 floats in a row, read as four coalesced 128-byte loads (or one
// 16-byte load a lane) and staged in shared memory, so that the rows leave as 16-byte stores, whole rows at a time.
template <int D, bool LANE_MAJOR = false>
__global__ void __launch_bounds__(256) attention_bwd_dq_kernel(const BwdParams p) {
  constexpr int P = DqLayout<D>::kPitch;
  TSCALE_ATTN_DYNAMIC_SMEM(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int strips = (p.T + 15) / 16;  // per (b, h)
  const int64_t strip = static_cast<int64_t>(blockIdx.x) * 8 + warp;  // over B * H * strips
  if (strip >= static_cast<int64_t>(p.B) * p.H * strips) return;  // whole warps leave together
  const int64_t bh = strip / strips;
  const int row0 = static_cast<int>(strip - bh * strips) * 16;
  const uint32_t stage = smem_addr(smem) + warp * 16 * P * 2;  // (16, P) bf16
  const float* blk = p.dq_accum + (bh * p.T_pad + row0) * D;  // the strip's D / 8 fragment blocks
#pragma unroll 4
  for (int j = 0; j < D / 8; ++j) {
    float c[4];  // this lane's accumulator elements c0..c3 of block j: rows g, g + 8; columns 2 t4, 2 t4 + 1
    if constexpr (LANE_MAJOR) {
      load_f32x4(c, blk + j * 128 + lane * 4);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) c[e] = blk[j * 128 + e * 32 + lane];
    }
    const uint32_t at = stage + (g * P + j * 8 + t4 * 2) * 2;
    st_shared_u32(at, pack_bf16(c[0] * p.scale, c[1] * p.scale));
    st_shared_u32(at + 8 * P * 2, pack_bf16(c[2] * p.scale, c[3] * p.scale));
  }
  warp_sync();
  store_rows<D>(p.dq + (bh / p.H) * p.sg.b + (bh % p.H) * p.sg.h, p.sg.t, row0, stage, imin(16, p.T - row0), lane);
}

// The backward's launch parameters with the tensors they point into (kept alive until the kernels are queued).
struct BwdCall {
  BwdParams p{};
  bool split = false;  // bwd_split_dq: no delta and dq kernels, no dq_accum
  at::Tensor dq, dk, dv, q, k, v, out, dout, lse, delta, dq_accum, docs;
  DocStats stats;
  int n_tiles = 0;           // 64-key tiles: the main kernel's blocks per (b, h)
  int64_t delta_blocks = 0;  // 4 warps, one row each
  int64_t dq_blocks = 0;     // 8 warps, one 16-row strip each
};

// How the backward forms dQ, from TSCALE_ATTENTION_BWD_DQ: atomic (default, and auto: the main kernel adds dS K into
// an fp32 dq_accum, between the delta and dq kernels; the faster on every mask measured, windowed ones included) |
// split (a query-major kernel computes dQ and Delta, then the main kernel runs without its dQ part: dq reproducible
// bit for bit).
inline bool bwd_split_dq() {
  const char* env = std::getenv("TSCALE_ATTENTION_BWD_DQ");
  if (env == nullptr || std::strcmp(env, "atomic") == 0 || std::strcmp(env, "auto") == 0) return false;
  TORCH_CHECK(std::strcmp(env, "split") == 0, "TSCALE_ATTENTION_BWD_DQ must be atomic, split or auto, got '", env,
              "'");
  return true;
}

// Checks the op's arguments and allocates its outputs: dq, dk, dv bf16 (B, H, T, D) in (B, T, H, D) storage
// (token_major). Nothing is launched yet but the document ranges' kernel.
inline BwdCall prepare_bwd(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                           const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
                           const std::optional<at::Tensor>& doc_ids, int64_t window, double scale) {
  constexpr const char* op = "attention_bwd_cuda";
  check_qkv(q_in, k_in, v_in, op);
  TORCH_CHECK(dout_in.sizes() == q_in.sizes() && out_in.sizes() == q_in.sizes(), op,
              ": dout and out must have the shape of q ", q_in.sizes(), ", got ", dout_in.sizes(), " and ",
              out_in.sizes());
  TORCH_CHECK(dout_in.scalar_type() == at::kBFloat16 && out_in.scalar_type() == at::kBFloat16, op,
              ": dout and out must be bfloat16");
  TORCH_CHECK(dout_in.device() == q_in.device() && out_in.device() == q_in.device() && lse_in.device() == q_in.device(),
              op, ": dout, out and lse must be on the device of q");
  TORCH_CHECK(lse_in.dim() == 3 && lse_in.size(0) == q_in.size(0) && lse_in.size(1) == q_in.size(1) &&
                  lse_in.size(2) == q_in.size(2) && lse_in.scalar_type() == at::kFloat,
              op, ": lse must be float32 (B, H, T), got ", lse_in.scalar_type(), " ", lse_in.sizes());
  // (the forward's own condition: an lse comes only from a forward that took this scale)
  TORCH_CHECK(std::isfinite(scale) && scale > 0, op, ": scale must be finite and positive, got ", scale);
  const int B = static_cast<int>(q_in.size(0)), H = static_cast<int>(q_in.size(1));
  const int T = static_cast<int>(q_in.size(2)), D = static_cast<int>(q_in.size(3));
  BwdCall c;
  c.dq = token_major(B, H, T, D, q_in);
  c.dk = token_major(B, H, T, D, q_in);
  c.dv = token_major(B, H, T, D, q_in);
  c.docs = prepare_docs(doc_ids, q_in, op);
  if (c.dq.numel() == 0) return c;
  c.q = kernel_layout(q_in), c.k = kernel_layout(k_in), c.v = kernel_layout(v_in);
  c.out = kernel_layout(out_in), c.dout = kernel_layout(dout_in);
  c.lse = lse_in.contiguous();
  c.n_tiles = (T + kTile - 1) / kTile;
  c.delta = at::empty({B, H, T}, c.lse.options());
  c.split = bwd_split_dq();
  if (!c.split)  // zeroed by the delta kernel
    c.dq_accum = at::empty({B, H, static_cast<int64_t>(c.n_tiles) * kTile, D}, c.lse.options());

  BwdParams& p = c.p;
  p.q = reinterpret_cast<const uint16_t*>(c.q.data_ptr());
  p.k = reinterpret_cast<const uint16_t*>(c.k.data_ptr());
  p.v = reinterpret_cast<const uint16_t*>(c.v.data_ptr());
  p.o = reinterpret_cast<const uint16_t*>(c.out.data_ptr());
  p.dout = reinterpret_cast<const uint16_t*>(c.dout.data_ptr());
  p.sq = strides_of(c.q);
  p.sk = strides_of(c.k);
  p.sv = strides_of(c.v);
  p.so = strides_of(c.out);
  p.sdo = strides_of(c.dout);
  p.lse = c.lse.data_ptr<float>();
  p.delta = c.delta.data_ptr<float>();
  p.dq_accum = c.split ? nullptr : c.dq_accum.data_ptr<float>();
  p.dq = reinterpret_cast<uint16_t*>(c.dq.data_ptr());
  p.dk = reinterpret_cast<uint16_t*>(c.dk.data_ptr());
  p.dv = reinterpret_cast<uint16_t*>(c.dv.data_ptr());
  p.sg = strides_of(c.dq);
  p.B = B, p.H = H, p.T = T, p.D = D;
  p.T_pad = c.n_tiles * kTile;
  p.window = normalised_window(window, T);
  p.n_stat = (T + kStatTile - 1) / kStatTile;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  if (c.docs.defined()) {
    c.stats = doc_stats(c.docs, B, T, p.n_stat);
    p.doc = c.docs.data_ptr<int32_t>();
    p.doc_min = c.stats.dmin.data_ptr<int32_t>();
    p.doc_max = c.stats.dmax.data_ptr<int32_t>();
  }
  const int64_t rows = static_cast<int64_t>(B) * H * T;
  c.delta_blocks = (rows + kWarps - 1) / kWarps;
  c.dq_blocks = (static_cast<int64_t>(B) * H * ((T + 15) / 16) + 7) / 8;
  TORCH_CHECK(c.delta_blocks <= INT_MAX && c.dq_blocks <= INT_MAX, op, ": too many rows");
  return c;
}

// The delta kernel (before a main kernel) and the dq kernel (after it).
template <int D>
inline void launch_bwd_delta(const BwdCall& c) {
  launch_kernel(attention_bwd_delta_kernel<D>, dim3(static_cast<unsigned>(c.delta_blocks)), dim3(kThreads), 0, c.p);
}

template <int D, bool LANE_MAJOR = false>
inline void launch_bwd_dq(const BwdCall& c) {
  launch_kernel(attention_bwd_dq_kernel<D, LANE_MAJOR>, dim3(static_cast<unsigned>(c.dq_blocks)), dim3(256), DqLayout<D>::kBytes,
                c.p);
}

// The three kernels with the sm_80 main kernel (mma.sync), for either head dim; or the split backward's two.
inline void launch_bwd_mma(const BwdCall& c) {
  const dim3 grid = tile_grid(c.n_tiles, c.p.H, c.p.B);
  if (c.split) {
    if (c.p.D == 64) {
      launch_bwd_query<64>(c.p);
      launch_kernel(attention_bwd_kernel<64, false>, grid, dim3(kThreads), BwdLayout<64>::kBytes, c.p);
    } else {
      launch_bwd_query<128>(c.p);
      launch_kernel(attention_bwd_kernel<128, false>, grid, dim3(kThreads), BwdLayout<128>::kBytes, c.p);
    }
    return;
  }
  if (c.p.D == 64) {
    launch_bwd_delta<64>(c);
    launch_kernel(attention_bwd_kernel<64>, grid, dim3(kThreads), BwdLayout<64>::kBytes, c.p);
    launch_bwd_dq<64>(c);
  } else {
    launch_bwd_delta<128>(c);
    launch_kernel(attention_bwd_kernel<128>, grid, dim3(kThreads), BwdLayout<128>::kBytes, c.p);
    launch_bwd_dq<128>(c);
  }
}

// The op tscale::attention_bwd_cuda through the sm_80 kernels (the CUDA build's entry, attention_bwd.cu, also
// offers the Hopper main kernel). The sink needs nothing here: the forward's lse holds its share of every
// denominator.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_bwd_host(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& doc_ids, int64_t window, bool /*sink*/, double scale) {
  const DeviceScope scope(q);
  BwdCall c = prepare_bwd(dout, q, k, v, out, lse, doc_ids, window, scale);
  if (c.dq.numel() != 0) launch_bwd_mma(c);
  return {c.dq, c.dk, c.dv};
}

}  // namespace
}  // namespace tscale::attn
