// The attention backward's query-major dQ kernel (sm_80, mma.sync): dQ and Delta of each query tile without atomics.
//
// The split backward (TSCALE_ATTENTION_BWD_DQ=split) runs two kernels instead of delta, main and dq:
//   1. this one: one block of 4 warps per (64-query tile, head, batch row); warp w owns query rows 16 w..16 w + 15.
//      It computes Delta = rowsum(dO * O) for its rows (written for kernel 2), then walks the key tiles the rows see,
//      as the forward does (forward_key_tiles), for each:
//        S = Q K^T, dP = dO V^T                     (16 x 64 per warp, Q and dO read from shared memory)
//        P = exp2(S scale log2 e - lse log2 e) (masked), dS = P (dP - Delta)   (registers)
//        dQ += dS K                                 (dS as the bf16 A operand, no trip through shared memory)
//      and writes dq = scale * dQ as bf16 rows at the end.
//   2. the main kernel without its dQ part (attention_bwd.cuh, WITH_DQ = false): dK and dV.
// S and dP are computed twice (once here, once in kernel 2): seven products per tile pair against five, in exchange
// for no fp32 dq_accum (4 bytes per element to zero, add into with atomics and read back) and one kernel fewer, and
// a dq that is the same bit for bit in every run. Measured on an H100 (docs/BENCHMARKS.md "The split backward"), it
// is slower than the atomics everywhere: 3-5% on the model's windowed calls, 39% on a long causal one. It is what a
// run that needs a reproducible dq can choose.
// K has two buffers (the next tile's fetched while this one's products run), V one (the next fetched once S and dP
// are done); Q and dO are loaded once.
#pragma once

#include "attention_host.h"

namespace tscale::attn {
namespace {

template <int D>
struct BwdQueryLayout {
  static constexpr int kPitch = D + kPad;
  static constexpr size_t kTileBytes = size_t{kTile} * kPitch * 2;  // one (64, D) bf16 tile
  static constexpr size_t kQ = 0, kDO = kQ + kTileBytes;
  static constexpr size_t kK = kDO + kTileBytes;                    // [2] by step parity
  static constexpr size_t kV = kK + 2 * kTileBytes;
  static constexpr size_t kKeyDocs = kV + kTileBytes;               // int32 [2][kTile], by step parity
  static constexpr size_t kDelta = kKeyDocs + 2 * kTile * sizeof(int32_t);  // float [kTile]
  static constexpr size_t kSlot = kDelta + kTile * sizeof(float);
  static constexpr size_t kBytes = kSlot + 16;
};

// One (b, h)'s (T, D) rows of the backward's inputs q, k, v, o and dO.
struct BwdHeadRows {
  const uint16_t *q, *k, *v, *o, *dout;
};

__device__ __forceinline__ BwdHeadRows bwd_head_rows(const BwdParams& p, int b, int h) {
  return {p.q + b * p.sq.b + h * p.sq.h, p.k + b * p.sk.b + h * p.sk.h, p.v + b * p.sv.b + h * p.sv.h,
          p.o + b * p.so.b + h * p.so.h, p.dout + b * p.sdo.b + h * p.sdo.h};
}

// Delta = rowsum(dO * O) of the 16 rows [row0, row0 + 16) of one (b, h) (og, dog: its (T, D) rows), by one warp:
// into delta_s[0..16) and, for rows inside T, delta_g[row] (0 past T). Lane L takes half L & 1 of row L >> 1, every
// load issued before the first is used.
template <int D>
__device__ __forceinline__ void warp_delta_rows(const BwdParams& p, const uint16_t* og, const uint16_t* dog, int row0,
                                                float* delta_s, float* delta_g, int lane) {
  constexpr int kWords = D / 4;  // 32-bit words (bf16 pairs) in half a row
  const int r = lane >> 1, row = row0 + r;
  uint32_t o[kWords / 4][4], d[kWords / 4][4];
  float acc = 0.f;
  if (row < p.T) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      load_u32x4(o[i], og + row * p.so.t + (lane & 1) * (D / 2) + i * 8);
      load_u32x4(d[i], dog + row * p.sdo.t + (lane & 1) * (D / 2) + i * 8);
    }
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        acc += bf16_to_float(static_cast<uint16_t>(o[i][w])) * bf16_to_float(static_cast<uint16_t>(d[i][w]));
        acc += bf16_to_float(static_cast<uint16_t>(o[i][w] >> 16)) * bf16_to_float(static_cast<uint16_t>(d[i][w] >> 16));
      }
    }
  }
  acc += warp_xor(acc, 1);
  if ((lane & 1) == 0) {
    delta_s[r] = acc;
    if (row < p.T) delta_g[row] = acc;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) attention_bwd_query_kernel(const BwdParams p) {
  using L = BwdQueryLayout<D>;
  constexpr int P = L::kPitch, BM = kTile;
  constexpr int kNB = kTile / 8;  // n8-blocks of keys in S and dP
  constexpr int kDB = D / 8;      // n8-blocks of head dims in dQ
  TSCALE_ATTN_DYNAMIC_SMEM(smem);
  const uint32_t base = smem_addr(smem);
  const uint32_t q_s = base + L::kQ, do_s = base + L::kDO, v_s = base + L::kV;
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const unsigned span = window > 0 ? window : 1u << 31;  // row - key < span: in the window (any key, without one)
  const BlockTile bt = block_tile();
  const int qt = (T + BM - 1) / BM - 1 - bt.rank;  // the longest rows (latest tiles) start first
  const int h = bt.h, b = bt.b;
  const int q0 = qt * BM, wrow = warp * 16;
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;
  const BwdHeadRows rows = bwd_head_rows(p, b, h);
  const uint16_t *qg = rows.q, *kg = rows.k, *vg = rows.v, *og = rows.o, *dog = rows.dout;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const ForwardKeyTiles tiles = forward_key_tiles(p, b, q0, BM, kTile);
  const DocRange qd = tiles.qd;
  const int first = tiles.first(q0, window, tid, kThreads, slot);
  auto fetch_keys = [&](int t, int parity) {
    load_tile<kTile, D>(base + L::kK + parity * L::kTileBytes, kg, p.sk.t, t * kTile, T, tid);
    if (docs) {
      for (int i = tid; i < kTile; i += kThreads) {
        const int j = t * kTile + i;
        key_docs[parity * kTile + i] = j < T ? doc[j] : INT_MIN;
      }
    }
  };

  // Prologue: group 1 = Q, dO and K(first); group 2 = V(first).
  load_tile<BM, D>(q_s, qg, p.sq.t, q0, T, tid);
  load_tile<BM, D>(do_s, dog, p.sdo.t, q0, T, tid);
  fetch_keys(first, 0);
  cp_async_commit();
  load_tile<kTile, D>(v_s, vg, p.sv.t, first * kTile, T, tid);
  cp_async_commit();

  // Delta of the warp's 16 rows while the tiles load.
  warp_delta_rows<D>(p, og, dog, q0 + wrow, delta_s + wrow, p.delta + bh * T, lane);
  warp_sync();  // the warp's Delta values are in delta_s (only this warp reads them)
  float lse_r[2], delta_r[2];  // rows g and g + 8 of the warp: lse in log2 units (+inf past T: P = 0), Delta
  int rdoc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + wrow + r * 8 + g;
    lse_r[r] = row < T ? p.lse[bh * T + row] * kLog2e : INFINITY;
    delta_r[r] = delta_s[wrow + r * 8 + g];
    rdoc[r] = docs && row < T ? doc[row] : -1;
  }

  float dq[kDB][4];  // dQ accumulator: 16 rows x D per warp
#pragma unroll
  for (int j = 0; j < kDB; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;

  int t = first;
  for (int step = 0; t >= 0; ++step) {
    const int parity = step & 1;
    const int nt = tiles.next(t);
    cp_async_wait<0>();  // K(t) and V(t) are in (and Q, dO on the first step)
    __syncthreads();     // ... for every thread; every warp is done with the previous step's K buffer
    if (nt >= 0) fetch_keys(nt, parity ^ 1);
    cp_async_commit();
    const uint32_t k_s = base + L::kK + parity * L::kTileBytes;

    float s[kNB][4], dp[kNB][4];  // S = Q K^T and dP = dO V^T: 16 rows x 64 keys per warp
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
    }
#pragma unroll
    for (int kd16 = 0; kd16 < D / 16; ++kd16) {
      uint32_t aq[4], ado[4];
      load_a(aq, q_s, P, wrow, kd16 * 16, lane);
      load_a(ado, do_s, P, wrow, kd16 * 16, lane);
#pragma unroll
      for (int np = 0; np < kNB / 2; ++np) {
        uint32_t bf[4];
        load_b_nk(bf, k_s, P, np * 16, kd16 * 16, lane);
        mma_bf16(s[2 * np], aq, bf[0], bf[1]);
        mma_bf16(s[2 * np + 1], aq, bf[2], bf[3]);
        load_b_nk(bf, v_s, P, np * 16, kd16 * 16, lane);
        mma_bf16(dp[2 * np], ado, bf[0], bf[1]);
        mma_bf16(dp[2 * np + 1], ado, bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp is done with v_s: fetch the next V tile into it
    if (nt >= 0) load_tile<kTile, D>(v_s, vg, p.sv.t, nt * kTile, T, tid);
    cp_async_commit();

    // P (into s) and dS = P (dP - Delta) (into dp). Element (j, e) pairs row q0 + wrow + g + 8 (e >> 1) with key
    // k0 + 2 t4 + c, c = 8 j + (e & 1); the mask as in the forward.
    const int k0 = t * kTile;
    const DocRange kd = tiles.key_range(t);
    const bool full = all_visible(q0, q0 + BM - 1, k0, k0 + kTile - 1, window, docs, qd, kd);
    const bool doc_mask = !single_document(docs, qd, kd);
    const int32_t* kdocs = key_docs + parity * kTile + t4 * 2;
    const int diff0 = q0 + wrow + g - k0 - t4 * 2, keys_left = T - k0 - t4 * 2;
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float pv = exp2f(s[j][e] * p.scale_log2 - lse_r[r]);
        if (!full) {
          const int c = j * 8 + (e & 1);
          bool seen = static_cast<unsigned>(diff0 + r * 8 - c) < span && c < keys_left;
          if (doc_mask) seen = seen && rdoc[r] == kdocs[c];
          if (!seen) pv = 0.f;
        }
        dp[j][e] = pv * (dp[j][e] - delta_r[r]);
      }
    }

#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // dQ += dS K, 16 keys per k-step
      uint32_t a[4];
      acc_to_a(a, dp[2 * ks], dp[2 * ks + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bf[4];
        load_b_kn(bf, k_s, P, ks * 16, dn * 16, lane);
        mma_bf16(dq[2 * dn], a, bf[0], bf[1]);
        mma_bf16(dq[2 * dn + 1], a, bf[2], bf[3]);
      }
    }
    t = nt;
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight

  // dq = scale * dQ, staged in the warp's own rows of the Q tile (no other warp reads them), leaving as 16-byte
  // stores of whole rows.
  const uint32_t o_s = q_s + wrow * P * 2;  // (16, D) bf16, pitch P
  warp_sync();                              // every lane's last read of Q is behind it
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t at = o_s + ((r * 8 + g) * P + t4 * 2) * 2;
#pragma unroll
    for (int j = 0; j < kDB; ++j)
      st_shared_u32(at + j * 16, pack_bf16(dq[j][2 * r] * p.scale, dq[j][2 * r + 1] * p.scale));
  }
  warp_sync();
  store_rows<D>(p.dq + b * p.sg.b + h * p.sg.h, p.sg.t, q0 + wrow, o_s, imin(16, T - q0 - wrow), lane);
}

template <int D>
inline void launch_bwd_query(const BwdParams& p) {
  const dim3 grid = tile_grid((p.T + kTile - 1) / kTile, p.H, p.B);
  launch_kernel(attention_bwd_query_kernel<D>, grid, dim3(kThreads), BwdQueryLayout<D>::kBytes, p);
}

}  // namespace
}  // namespace tscale::attn
