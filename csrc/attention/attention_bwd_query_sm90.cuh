// The split backward's query-major dQ kernel for Hopper (sm_90a): attention_bwd_query.cuh's kernel with warpgroup
// products (wgmma), head dim 128.
//
// One block of one warpgroup (128 threads) per (64-query tile, head, batch row); warp w owns query rows 16 w..16 w + 15.
// It computes Delta = rowsum(dO * O) for its rows (written for the main kernel without dQ that follows), then walks
// the 64-key tiles the rows see, as the Hopper forward does (ForwardKeyTiles), for each:
//   S = Q K^T, dP = dO V^T          wgmma m64n64k16, all operands K-major in shared memory
//   P = exp2(S scale log2 e - lse log2 e) (masked), dS = P (dP - Delta)      (registers)
//   dQ += dS K                      wgmma m64n128k16, dS as the bf16 register operand, K read transposed
// and writes dq = scale * dQ as bf16 rows at the end. Q and dO are loaded once; K and V have two buffers each in
// 128-byte swizzled tiles (wgmma_sm90.cuh), the next tile's fetched by cp.async while this one's products run.
// The split's dQ kernel on Hopper (TSCALE_ATTENTION_SM90_BWD_QUERY_WGMMA = 1, the default there): on an H100 it takes
// 6% off the sm_80 kernel's time on windowed calls and 30% on a long causal one, which leaves the split still slower
// than the atomics everywhere (docs/BENCHMARKS.md "The split backward's dQ kernel with wgmma").
#pragma once

#include "attention_bwd_query.cuh"
#include "attention_sm90_tiles.cuh"

namespace tscale::attn {
namespace {

struct Sm90BwdQueryLayout {
  static constexpr int kBN = 64;                       // keys per tile
  static constexpr uint32_t kTileBytes = 64 * 256;     // a (64, 128) bf16 tile: two halves of 64 x 128 bytes
  static constexpr uint32_t kHalf = 64 * 128;          // one half (64 head dims)
  static constexpr uint32_t kQ = 0, kDO = kQ + kTileBytes;
  static constexpr uint32_t kK = kDO + kTileBytes;     // [2] tiles, by step parity
  static constexpr uint32_t kV = kK + 2 * kTileBytes;  // [2] tiles, by step parity
  static constexpr uint32_t kKeyDocs = kV + 2 * kTileBytes;  // int32 [2][kBN], by step parity
  static constexpr uint32_t kDelta = kKeyDocs + 2 * kBN * 4;  // float [64]
  static constexpr uint32_t kSlot = kDelta + 64 * 4;
  static constexpr size_t kBytes = kSlot + 16 + 1024;  // + room to align the base to 1024 bytes: two blocks an SM
};

// OVERLAP_DQ: a step's dQ product is waited for in the next step, after its S and dP products are issued (the next
// key tile's fetch then waits for it too); else at once.
template <bool OVERLAP_DQ>
__global__ void __launch_bounds__(128, 2) attention_bwd_query_sm90_kernel(const BwdParams p) {
#ifdef TSCALE_SM90A_DEVICE
  using L = Sm90BwdQueryLayout;
  constexpr int BM = 64, BN = L::kBN, kThreads = 128;
  TSCALE_ATTN_DYNAMIC_SMEM(smem_raw);
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled tiles start at multiples of 1024 bytes
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t q_s = base + L::kQ, do_s = base + L::kDO;
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const BlockTile bt = block_tile();
  const int qt = (T + BM - 1) / BM - 1 - bt.rank;  // the longest rows (latest tiles) start first
  const int h = bt.h, b = bt.b;
  const int q0 = qt * BM, wrow = 16 * warp;
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;
  const BwdHeadRows rows = bwd_head_rows(p, b, h);
  const uint16_t *qg = rows.q, *kg = rows.k, *vg = rows.v, *og = rows.o, *dog = rows.dout;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const ForwardKeyTiles tiles = forward_key_tiles(p, b, q0, BM, BN);
  const int first = tiles.first(q0, window, tid, kThreads, slot);
  auto k_buf = [&](int i) { return base + L::kK + i * L::kTileBytes; };
  auto v_buf = [&](int i) { return base + L::kV + i * L::kTileBytes; };
  auto fetch_keys = [&](int t, int i) {  // K, V and the key documents of tile t into buffer i
    load_tile_sw128<BN, kThreads>(k_buf(i), kg, p.sk.t, t * BN, T, tid);
    load_tile_sw128<BN, kThreads>(v_buf(i), vg, p.sv.t, t * BN, T, tid);
    if (docs) stage_key_docs(key_docs + i * BN, doc, t * BN, BN, T, tid, kThreads);
  };

  // One group of cp.async: Q, dO and the first key tile; then one a step for the next key tile.
  load_tile_sw128<BM, kThreads>(q_s, qg, p.sq.t, q0, T, tid);
  load_tile_sw128<BM, kThreads>(do_s, dog, p.sdo.t, q0, T, tid);
  fetch_keys(first, 0);
  cp_async_commit();

  warp_delta_rows<128>(p, og, dog, q0 + wrow, delta_s + wrow, p.delta + bh * T, lane);  // while the tiles load
  warp_sync();  // the warp's Delta values are in delta_s (only this warp reads them)
  const int row0 = q0 + wrow + g;  // this thread's rows: row0 (r = 0) and row0 + 8 (r = 1)
  float lse_r[2], delta_r[2];      // lse in log2 units (+inf past T: P = 0), Delta
  int rdoc[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    lse_r[r] = row < T ? p.lse[bh * T + row] * kLog2e : INFINITY;
    delta_r[r] = delta_s[wrow + 8 * r + g];
    rdoc[r] = docs && row < T ? doc[row] : -1;
  }

  float dq[64];  // dQ accumulator: 64 rows x 128 head dims
#pragma unroll
  for (int i = 0; i < 64; ++i) dq[i] = 0.f;
  uint32_t da[BN / 16][4];  // dS as bf16 A operands, one per k-step of 16 keys

  int t = first;
  for (int step = 0; t >= 0; ++step) {
    const int buf = step & 1;
    const int nt = tiles.next(t);
    cp_async_wait<0>();  // K(t) and V(t) (and Q, dO) landed
    fence_proxy_async();
    __syncthreads();  // ... for every thread's copies
    auto fetch_next = [&] {  // into buffer buf ^ 1, once no product reads it any more
      if (nt >= 0) fetch_keys(nt, buf ^ 1);
      cp_async_commit();
    };
    if (!OVERLAP_DQ || step == 0) fetch_next();  // every product of the previous step was waited for

    float s[BN / 2], dp[BN / 2];  // S = Q K^T and dP = dO V^T: 64 rows x 64 keys; s[4 j + e]: row row0 + 8 (e >> 1),
    issue_s<BN>(s, q_s, L::kHalf, k_buf(buf));   // key 8 j + 2 t4 + (e & 1) of the tile
    issue_s<BN>(dp, do_s, L::kHalf, v_buf(buf));
    if (OVERLAP_DQ && step > 0) {
      wgmma_wait<1>();  // the previous step's dQ product, issued before these two: its K buffer and dS are free
      fence_registers(dq);
      fence_registers(da);
      __syncthreads();  // ... in every warp
      fetch_next();
    }
    wgmma_wait<0>();
    fence_registers(s);
    fence_registers(dp);

    const TileMask mask = tile_mask<BM, BN>(tiles, t, q0, row0, t4, T, window, key_docs + buf * BN);
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float pv = exp2f(fmaf(s[4 * j + e], p.scale_log2, -lse_r[r]));
        if (!mask.full && !mask.sees(r, j * 8 + (e & 1), rdoc)) pv = 0.f;
        dp[4 * j + e] = pv * (dp[4 * j + e] - delta_r[r]);
      }
    }
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
      acc_to_a(da[ks], *reinterpret_cast<const float(*)[4]>(&dp[8 * ks]), *reinterpret_cast<const float(*)[4]>(&dp[8 * ks + 4]));
    issue_pv<BN>(dq, da, k_buf(buf));  // dQ += dS K: K read as the forward reads V
    if constexpr (!OVERLAP_DQ) {
      wgmma_wait<0>();
      fence_registers(dq);
      fence_registers(da);
    }
    t = nt;
  }
  if constexpr (OVERLAP_DQ) {
    wgmma_wait<0>();  // the last dQ product
    fence_registers(dq);
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight

  const float scale[2] = {p.scale, p.scale};
  store_acc_rows<BM>(p.dq + b * p.sg.b + h * p.sg.h, p.sg.t, dq, scale, q_s, warp, lane, q0, T);
#endif
}

// TSCALE_ATTENTION_SM90_BWD_QUERY_OVERLAP = 1 (OVERLAP_DQ) | 0; default 1.
inline void launch_bwd_query_sm90(const BwdParams& p) {
  const dim3 grid = tile_grid((p.T + 63) / 64, p.H, p.B);
  if (sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_QUERY_OVERLAP", {0, 1}, 1) == 1)
    launch_kernel(attention_bwd_query_sm90_kernel<true>, grid, dim3(128), Sm90BwdQueryLayout::kBytes, p);
  else
    launch_kernel(attention_bwd_query_sm90_kernel<false>, grid, dim3(128), Sm90BwdQueryLayout::kBytes, p);
}

}  // namespace
}  // namespace tscale::attn
