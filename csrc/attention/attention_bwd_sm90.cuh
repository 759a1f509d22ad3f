// The attention backward's main kernel for Hopper (sm_90a): warpgroup products (wgmma) for head dim 128.
//
// It takes the place of attention_bwd.cuh's main kernel between the same delta and dq kernels, and adds into the
// same fragment-ordered dq_accum. A block is WGS warpgroups (128 threads each) on one (64 WGS-key tile, head, batch
// row); warpgroup wg owns keys 64 wg..64 wg + 63 of it, its warp w key rows 16 w..16 w + 15 of those. K and V stay in
// shared memory; the block walks the 64-query tiles that see its keys (BackwardQueryTiles), the next one (Q, dO, lse,
// Delta, document ids) fetched while the current one's S^T and dP^T products run; the warpgroups share each query
// tile:
//   S^T = K Q^T, dP^T = V dO^T           wgmma m64n64k16, all operands K-major in shared memory
//   P^T = exp2(S^T scale log2 e - lse log2 e) (masked), dS^T = P^T (dP^T - Delta)      (registers)
//   dV += P^T dO, dK += dS^T Q           wgmma m64n128k16, P^T and dS^T as bf16 register operands, dO and Q
//                                        read transposed; with EARLY_DV, dV issued as soon as P^T is formed,
//                                        so that it runs while dS^T is
//   dQ(tile) += dS K                     dS^T of every warpgroup through shared memory, read transposed with
//                                        K (m64n64k16; one warpgroup: both head-dim halves in turn; two: one
//                                        half each, over all 128 keys), then fp32 atomics into dq_accum
//                                        (DQ_V4: one four-float vector atomic a lane and block, into its
//                                        lane-major order; else four scalar ones, element-major)
// Q and dO come by the TMA unit, issued by one thread, each buffer completing an mbarrier (TMA >= 1), or by cp.async
// from every thread; with TMA = 2 the rows' lse, Delta and document ids come with them (1D maps over the whole arrays:
// a tile that runs past T reads the next head's values or zeros there, harmless since those rows' Q and dO are zero),
// and otherwise by plain loads. Tiles are 128-byte swizzled (wgmma_sm90.cuh); dK and dV stay in registers (64 fp32
// each per thread).
// Two warpgroups halve the query-tile loads and the dq_accum atomics per key.
#pragma once

#include "attention_bwd.cuh"
#include "attention_bwd_query_sm90.cuh"
#include "tma_sm90.cuh"
#include "wgmma_sm90.cuh"

namespace tscale::attn {
namespace {

// The TMA maps of q and dO (boxes of one 64-query tile), for TMA >= 1; of lse, Delta and document ids (boxes of 64
// rows) for TMA = 2.
struct Sm90BwdMaps {
  TileMap q, dout;
  VecMap lse, delta, docs;
};

template <int WGS>
struct Sm90BwdLayout {
  static constexpr int kThreads = 128 * WGS, kKeys = 64 * WGS;
  static constexpr uint32_t kTileBytes = 64 * 256;  // a (64, 128) bf16 tile: two halves of 64 x 128 bytes
  static constexpr uint32_t kHalf = 64 * 128;      // one half (64 head dims)
  static constexpr uint32_t kK = 0, kV = kK + WGS * kTileBytes;  // [WGS] tiles each, by warpgroup
  static constexpr uint32_t kQ = kV + WGS * kTileBytes;  // [2] tiles, by step parity
  static constexpr uint32_t kDO = kQ + 2 * kTileBytes;  // [2] tiles
  static constexpr uint32_t kDS = kDO + 2 * kTileBytes;  // dS^T: [64 WGS keys][64 queries], one swizzled half a WG
  static constexpr uint32_t kLse = kDS + WGS * kHalf;  // float [2][64]: lse * log2 e; TMA 2: lse, 128-byte aligned
  static constexpr uint32_t kDelta = kLse + 2 * 64 * 4;   // float [2][64]
  static constexpr uint32_t kQDocs = kDelta + 2 * 64 * 4;  // int32 [2][64]
  static constexpr uint32_t kBars = kQDocs + 2 * 64 * 4;  // [2] full, by parity (TMA_Q)
  static constexpr uint32_t kSlot = kBars + 16;
  static constexpr size_t kBytes = kSlot + 16 + 1024;  // + room to align the base to 1024 bytes
};

// The per-row values of the query tile [q0, q0 + bm) that a backward step reads, into shared arrays of bm: lse in
// log2 units (+inf past T, so P is 0 there), Delta (0 past T) and, with documents (doc != nullptr), the rows'
// document ids (INT_MIN past T). By all `nthreads` threads of the block.
__device__ __forceinline__ void stage_query_rows(const float* lse_g, const float* delta_g, const int32_t* doc, int q0,
                                                 int bm, int T, float* lse_s, float* delta_s, int32_t* qdocs_s,
                                                 int tid, int nthreads) {
  for (int r = tid; r < bm; r += nthreads) {
    const int qi = q0 + r;
    const bool ok = qi < T;
    lse_s[r] = ok ? lse_g[qi] * kLog2e : INFINITY;
    delta_s[r] = ok ? delta_g[qi] : 0.f;
    if (doc != nullptr) qdocs_s[r] = ok ? doc[qi] : INT_MIN;
  }
}

// WITH_DQ = false: the split backward's dK and dV only (attention_bwd_query.cuh computed dq and Delta before it).
template <int WGS, int MIN_BLOCKS, int TMA, bool EARLY_DV, bool DQ_FIRST, bool DQ_V4, bool WITH_DQ = true>
__global__ void __launch_bounds__(128 * WGS, MIN_BLOCKS)
    attention_bwd_sm90_kernel(const BwdParams p, const __grid_constant__ Sm90BwdMaps maps) {
#ifdef TSCALE_SM90A_DEVICE
  constexpr bool TMA_Q = TMA >= 1, TMA_ROWS = TMA == 2;
  using L = Sm90BwdLayout<WGS>;
  constexpr int kThreads = L::kThreads;
  constexpr int BM = 64;  // queries per step
  TSCALE_ATTN_DYNAMIC_SMEM(smem_raw);
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled tiles start at multiples of 1024 bytes
  unsigned char* smem = smem_raw + (base - raw);
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  // This warpgroup's K, V and dS^T tiles; dQ's products read every warpgroup's, from the first on.
  const uint32_t k_all = base + L::kK, ds_all = base + L::kDS;
  const uint32_t k_s = k_all + wg * L::kTileBytes, v_s = base + L::kV + wg * L::kTileBytes;
  const uint32_t ds_s = ds_all + wg * L::kHalf;
  float* lse_s = reinterpret_cast<float*>(smem + L::kLse);
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);
  int32_t* qdocs_s = reinterpret_cast<int32_t*>(smem + L::kQDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int T = p.T, window = p.window;
  const BlockTile bt = block_tile();
  const int kt = bt.rank, h = bt.h, b = bt.b;  // the first key tiles see the most queries
  const int k0 = kt * L::kKeys, kw0 = k0 + wg * 64;  // the block's and this warpgroup's first key
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;
  const uint16_t* qg = p.q + b * p.sq.b + h * p.sq.h;  // (T, D) rows of this (b, h)
  const uint16_t* kg = p.k + b * p.sk.b + h * p.sk.h;
  const uint16_t* vg = p.v + b * p.sv.b + h * p.sv.h;
  const uint16_t* dog = p.dout + b * p.sdo.b + h * p.sdo.h;
  const float* lse_g = p.lse + bh * T;
  const float* delta_g = p.delta + bh * T;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const uint32_t q_full = base + L::kBars;  // TMA_Q: the barrier of buffer `parity` at q_full + 8 parity
  if constexpr (TMA_Q) {
    if (tid == 0) {
      mbar_init(q_full, 1);
      mbar_init(q_full + 8, 1);
      fence_mbarrier_init();
    }
    __syncthreads();
  }
  const BackwardQueryTiles tiles = backward_query_tiles(p, b, k0, L::kKeys, BM, tid, kThreads, slot);
  const DocRange kd = tiles.kd;
  auto q_buf = [&](int parity) { return base + L::kQ + parity * L::kTileBytes; };
  auto do_buf = [&](int parity) { return base + L::kDO + parity * L::kTileBytes; };
  auto fetch_queries = [&](int i, int parity) {
    const int q0 = i * BM;
    if constexpr (TMA_Q) {
      if (tid == 0) {
        const uint32_t bar = q_full + 8 * parity;
        mbar_arrive_expect_tx(bar, 2 * L::kTileBytes + (TMA_ROWS ? (docs ? 3 : 2) * BM * 4 : 0));
        tma_load_tile(q_buf(parity), L::kHalf, maps.q, bar, q0, h, b);
        tma_load_tile(do_buf(parity), L::kHalf, maps.dout, bar, q0, h, b);
        if constexpr (TMA_ROWS) {
          const int row = static_cast<int>(bh * T) + q0;
          tma_load_vec(base + L::kLse + parity * BM * 4, maps.lse, bar, row);
          tma_load_vec(base + L::kDelta + parity * BM * 4, maps.delta, bar, row);
          if (docs) tma_load_vec(base + L::kQDocs + parity * BM * 4, maps.docs, bar, b * T + q0);
        }
      }
    } else {
      load_tile_sw128<BM, kThreads>(q_buf(parity), qg, p.sq.t, q0, T, tid);
      load_tile_sw128<BM, kThreads>(do_buf(parity), dog, p.sdo.t, q0, T, tid);
    }
    if constexpr (!TMA_ROWS)
      stage_query_rows(lse_g, delta_g, doc, q0, BM, T, lse_s + parity * BM, delta_s + parity * BM,
                       qdocs_s + parity * BM, tid, kThreads);
  };

  // Groups of cp.async: K and V, then the first query tile; then each step's next tile.
#pragma unroll
  for (int w = 0; w < WGS; ++w) {
    load_tile_sw128<64, kThreads>(k_all + w * L::kTileBytes, kg, p.sk.t, k0 + 64 * w, T, tid);
    load_tile_sw128<64, kThreads>(base + L::kV + w * L::kTileBytes, vg, p.sv.t, k0 + 64 * w, T, tid);
  }
  cp_async_commit();
  fetch_queries(tiles.first, 0);
  cp_async_commit();

  const int key0 = kw0 + warp * 16 + g, key1 = key0 + 8;  // this thread's two key rows
  const int kdoc0 = docs && key0 < T ? doc[key0] : -1;
  const int kdoc1 = docs && key1 < T ? doc[key1] : -1;
  float dk[64], dv[64];  // 64 keys x 128 head dims per warpgroup
#pragma unroll
  for (int j = 0; j < 64; ++j) dk[j] = dv[j] = 0.f;
  float* dqa = p.dq_accum + bh * p.T_pad * 128;

  int i = tiles.first;
  for (int step = 0; i >= 0; ++step) {
    const int parity = step & 1;
    const int ni = tiles.next(i);
    cp_async_wait<0>();  // K, V and tile i landed
    if constexpr (TMA_Q) mbar_wait(q_full + 8 * parity, (step >> 1) & 1);  // the (step / 2)-th fill of this buffer
    fence_proxy_async();
    __syncthreads();  // ... for every thread, and every warpgroup is done with the previous step
    const uint32_t qt_s = q_buf(parity), dot_s = do_buf(parity);
    const float* lse_t = lse_s + parity * BM;
    const float* delta_t = delta_s + parity * BM;
    const int32_t* qdocs_t = qdocs_s + parity * BM;

    float s[32], dp[32];  // S^T = K Q^T and dP^T = V dO^T: 64 keys x 64 queries
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t at = (kk >> 2) * L::kHalf + (kk & 3) * 32;
      wgmma_ss<64>(s, sw128_desc(k_s + at, 16, 1024), sw128_desc(qt_s + at, 16, 1024), kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t at = (kk >> 2) * L::kHalf + (kk & 3) * 32;
      wgmma_ss<64>(dp, sw128_desc(v_s + at, 16, 1024), sw128_desc(dot_s + at, 16, 1024), kk > 0);
    }
    wgmma_commit();
    // While they run: the next tile into buffer parity ^ 1, last read by the previous step's products, all waited
    // for. Its lse, Delta and document ids are plain loads that stall this thread until they land; here the tensor
    // cores are busy meanwhile.
    if (ni >= 0) fetch_queries(ni, parity ^ 1);
    cp_async_commit();
    wgmma_wait<0>();
    fence_registers(s);
    fence_registers(dp);

    // P^T (into s) and dS^T = P^T (dP^T - Delta) (into dp); s[4 j + e]: key row key0 + 8 (e >> 1), query column
    // qc = 8 j + 2 t4 + (e & 1). Without a document boundary in the tile pair (one_doc), the queries that see a key
    // are one interval of columns.
    const int q0 = i * BM;
    const DocRange qd = tiles.query_range(i);
    const bool full = all_visible(q0, q0 + BM - 1, kw0, kw0 + 63, window, docs, qd, kd);
    const bool one_doc = single_document(docs, qd, kd);
    int lo[2], hi[2];  // one_doc: key row key0 (r = 0) or key1 (r = 1) is seen by columns c = qc - 2 t4 in [lo, hi]
    key_query_interval(key0, q0 + t4 * 2, T, window, lo[0], hi[0]);
    key_query_interval(key1, q0 + t4 * 2, T, window, lo[1], hi[1]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * 8 + (e & 1), qc = t4 * 2 + c;
        float pv = exp2f(s[4 * j + e] * p.scale_log2 - (TMA_ROWS ? lse_t[qc] * kLog2e : lse_t[qc]));
        if (!full) {
          const int r = e >> 1;
          const bool ok = one_doc ? c >= lo[r] && c <= hi[r]
                                  : visible(q0 + qc, r ? key1 : key0, T, window, docs, qdocs_t[qc], r ? kdoc1 : kdoc0);
          if (!ok) pv = 0.f;
        }
        s[4 * j + e] = pv;
      }
    }
    uint32_t pa[4][4], da[4][4];  // P^T and dS^T as bf16 A operands, one per k-step of 16 queries
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      acc_to_a(pa[ks], *reinterpret_cast<const float(*)[4]>(&s[8 * ks]), *reinterpret_cast<const float(*)[4]>(&s[8 * ks + 4]));
    if constexpr (EARLY_DV) {  // dV += P^T dO runs while dS^T is formed
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_rs_n128_tb(dv, pa[ks], sw128_desc(dot_s + ks * 2048, L::kHalf, 1024));
      wgmma_commit();
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = t4 * 2 + j * 8 + (e & 1);
        dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - delta_t[qc]);
      }
    }
    // dS^T as bf16 into its swizzled tile (key row kr, query columns 8 j..8 j + 7 in chunk j), for dQ.
    if constexpr (WITH_DQ) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int kr = warp * 16 + g + 8 * r;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          st_shared_u32(ds_s + kr * 128 + ((j ^ (kr & 7)) << 4) + t4 * 4,
                        pack_bf16(dp[4 * j + 2 * r], dp[4 * j + 2 * r + 1]));
      }
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      acc_to_a(da[ks], *reinterpret_cast<const float(*)[4]>(&dp[8 * ks]), *reinterpret_cast<const float(*)[4]>(&dp[8 * ks + 4]));
    if constexpr (EARLY_DV) {  // dV is done by now: its A operand's registers are free
      wgmma_wait<0>();
      fence_registers(dv);
      fence_registers(pa);
    }
    if constexpr (WITH_DQ) {
      fence_proxy_async();
      __syncthreads();  // dS^T complete for every warp's products
    }

    auto issue_dk_dv = [&] {
      wgmma_fence();
      if constexpr (!EARLY_DV) {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) wgmma_rs_n128_tb(dv, pa[ks], sw128_desc(dot_s + ks * 2048, L::kHalf, 1024));
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_rs_n128_tb(dk, da[ks], sw128_desc(qt_s + ks * 2048, L::kHalf, 1024));
      wgmma_commit();
    };
    if constexpr (!WITH_DQ) {  // the next step's top barrier orders these reads of Q and dO before their refill
      issue_dk_dv();
      wgmma_wait<0>();
      fence_registers(dv);
      fence_registers(dk);
      if constexpr (!EARLY_DV) fence_registers(pa);
      fence_registers(da);
      i = ni;
      continue;
    }
    if constexpr (!DQ_FIRST) issue_dk_dv();

    // dQ(tile) += dS K over the block's 64 WGS keys (k-steps of 16: dS^T rows ks * 16.., contiguous over the
    // warpgroups' halves; K rows (ks % 4) * 16 of warpgroup ks / 4's tile), one head-dim half of 64 at a time: both
    // in turn with one warpgroup, half wg with two. Warp w holds query rows q0 + 16 w.. of it. Fragment-order
    // dq_accum: block (16-query row q16, 8-dim column n) at (q16 * 16 + n) * 128.
    float* blk = dqa + static_cast<int64_t>(q0 / 16 + warp) * 16 * 128;
#pragma unroll
    for (int hh = 0; hh < 2 / WGS; ++hh) {
      const int half = WGS == 1 ? hh : wg;
      float dq[32];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4 * WGS; ++ks)
        wgmma_ss<64, 1, 1>(dq, sw128_desc(ds_all + ks * 2048, L::kHalf, 1024),
                           sw128_desc(k_all + (ks >> 2) * L::kTileBytes + half * L::kHalf + (ks & 3) * 2048, L::kHalf,
                                      1024), ks > 0);
      wgmma_commit();
      if (DQ_FIRST && hh == 0) {  // dK (and dV) queued behind the first dQ product, running during its atomics
        issue_dk_dv();
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();  // (the first also retires the dK product, and the dV product when issued with it)
      }
      fence_registers(dq);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float* f = blk + (half * 8 + j) * 128;
        if constexpr (DQ_V4) {
          atomic_add_f32x4(f + lane * 4, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) atomic_add_f32(f + e * 32 + lane, dq[4 * j + e]);
        }
      }
    }
    if constexpr (DQ_FIRST && WGS == 2) wgmma_wait<0>();  // dK and dV retired: the next step refills their Q and dO
    fence_registers(dv);
    fence_registers(dk);
    if constexpr (!EARLY_DV) fence_registers(pa);
    fence_registers(da);
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
    for (int j = 0; j < 16; ++j) {
      const int64_t at = static_cast<int64_t>(key) * p.sg.t + j * 8 + t4 * 2;
      *reinterpret_cast<uint32_t*>(dkg + at) = pack_bf16(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvg + at) = pack_bf16(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
#endif
}

template <int WGS, int MIN_BLOCKS, int TMA, bool EARLY_DV, bool DQ_FIRST, bool DQ_V4, bool WITH_DQ = true>
void launch_bwd_sm90_main(const BwdCall& c) {
  using L = Sm90BwdLayout<WGS>;
  const BwdParams& p = c.p;
  Sm90BwdMaps maps{};
  if constexpr (TMA >= 1) {
    maps.q = make_tile_map(p.q, p.sq, p.B, p.H, p.T, 64);
    maps.dout = make_tile_map(p.dout, p.sdo, p.B, p.H, p.T, 64);
  }
  if constexpr (TMA == 2) {
    const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.T;
    maps.lse = make_vec_map(p.lse, rows, 64);
    maps.delta = make_vec_map(p.delta, rows, 64);
    if (p.doc != nullptr) maps.docs = make_vec_map(p.doc, static_cast<int64_t>(p.B) * p.T, 64);
  }
  const dim3 grid = tile_grid((p.T + L::kKeys - 1) / L::kKeys, p.H, p.B);
  launch_kernel(attention_bwd_sm90_kernel<WGS, MIN_BLOCKS, TMA, EARLY_DV, DQ_FIRST, DQ_V4, WITH_DQ>, grid,
                dim3(L::kThreads), L::kBytes, p, maps);
}

// The main kernel's form, from the environment (each setting takes `auto`, its default):
//   TSCALE_ATTENTION_SM90_BWD_WGS = 1 (107 KiB of shared memory: two blocks a multiprocessor) | 2 (147 KiB: one
//     block of 128-key tiles); default 1. Measured on the H200 (docs/BENCHMARKS.md "The Hopper backward's loads by
//     TMA"): one warpgroup with TMA loads took 1.54 ms at T 4096 causal, one or two with cp.async 1.74, and one with
//     TMA was the fastest on every mask and length measured.
//   TSCALE_ATTENTION_SM90_BWD_TMA = 2 (Q and dO by the TMA unit, issued by one thread, and the rows' lse, Delta
//     and document ids with them) | 1 (Q and dO by TMA, the rows' values by plain loads of the block's threads) |
//     0 (cp.async from every thread); default 2, 2-5% off the main kernel against 1 on an H100 (docs/BENCHMARKS.md
//     "The rows' values by TMA"), and 1 was 6-12% faster than 0 on every mask and length measured. Form 2 runs where
//     its rows fit (sm90_rows_by_tma) and form 1 elsewhere.
//   TSCALE_ATTENTION_SM90_BWD_EARLY_DV = 1 (dV += P^T dO issued as soon as P^T is formed, running while dS^T is) | 0
//     (issued with dK after the block's wait on dS^T); default 1: 2.5% off the kernel at T 4096 causal and 1.6% at
//     T 1024 causal on an H100, the windowed masks unchanged (docs/BENCHMARKS.md "The Hopper backward's schedule").
//   TSCALE_ATTENTION_SM90_BWD_DQ_FIRST = 1 (dQ's first half issued before dK, which runs during that half's atomics;
//     needs EARLY_DV = 1) | 0 (dK, and dV when not issued early, then dQ's first half, its atomics after all of
//     them); default 1 where dV is issued early: 3.1% off the kernel at T 4096 causal and 2.0% at T 1024 causal on an
//     H100, the windowed masks unchanged (docs/BENCHMARKS.md "dQ's first half before dK").
//   TSCALE_ATTENTION_SM90_BWD_DQ_V4 = 1 (dQ's atomics as one four-float vector atomic a lane and 16 x 8 block,
//     dq_accum lane-major) | 0 (four scalar atomics, element-major); default 0.
struct Sm90BwdForm {
  int wgs, tma;
  bool early_dv, dq_first, dq_v4;
};

// Whether the TMA unit can bring a query tile's lse, Delta and document ids: a box's first element must lie on a
// 16-byte boundary (a misaligned one faults with an illegal instruction), so the arrays start there and T is a
// multiple of 4 (a tile starts at row b H T + h T + q0 of lse and Delta, b T + q0 of the ids); int32 coordinates
// address at most 2^31 - 64 rows of B H T.
inline bool sm90_rows_by_tma(const BwdParams& p) {
  auto aligned = [](const void* a) { return a == nullptr || reinterpret_cast<uintptr_t>(a) % 16 == 0; };
  return p.T % 4 == 0 && aligned(p.lse) && aligned(p.delta) && aligned(p.doc) &&
         static_cast<int64_t>(p.B) * p.H * p.T < INT_MAX - 64;
}

inline Sm90BwdForm sm90_backward_form(const BwdParams& p) {
  Sm90BwdForm f;
  f.wgs = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_WGS", {1, 2}, 1);
  f.tma = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_TMA", {0, 1, 2}, 2);
  if (f.tma == 2 && !sm90_rows_by_tma(p)) f.tma = 1;
  f.early_dv = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_EARLY_DV", {0, 1}, 1) == 1;
  const int dq_first = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_DQ_FIRST", {0, 1}, -1);  // -1: auto
  f.dq_first = dq_first == -1 ? f.early_dv : dq_first == 1;
  TORCH_CHECK(!f.dq_first || f.early_dv,
              "TSCALE_ATTENTION_SM90_BWD_DQ_FIRST=1 needs TSCALE_ATTENTION_SM90_BWD_EARLY_DV=1 (or auto)");
  f.dq_v4 = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_DQ_V4", {0, 1}, 0) == 1;
  return f;
}

template <int WGS, int MIN_BLOCKS, int TMA, bool DQ_V4>
void launch_bwd_sm90_schedule(const BwdCall& c, const Sm90BwdForm& f) {
  if (!f.early_dv)
    launch_bwd_sm90_main<WGS, MIN_BLOCKS, TMA, false, false, DQ_V4>(c);
  else
    f.dq_first ? launch_bwd_sm90_main<WGS, MIN_BLOCKS, TMA, true, true, DQ_V4>(c)
               : launch_bwd_sm90_main<WGS, MIN_BLOCKS, TMA, true, false, DQ_V4>(c);
}

template <int WGS, int MIN_BLOCKS, int TMA>
void launch_bwd_sm90_atomics(const BwdCall& c, const Sm90BwdForm& f) {
  f.dq_v4 ? launch_bwd_sm90_schedule<WGS, MIN_BLOCKS, TMA, true>(c, f)
          : launch_bwd_sm90_schedule<WGS, MIN_BLOCKS, TMA, false>(c, f);
}

template <int WGS, int MIN_BLOCKS>
void launch_bwd_sm90_loads(const BwdCall& c, const Sm90BwdForm& f) {
  if (f.tma == 2)
    launch_bwd_sm90_atomics<WGS, MIN_BLOCKS, 2>(c, f);
  else if (f.tma == 1)
    launch_bwd_sm90_atomics<WGS, MIN_BLOCKS, 1>(c, f);
  else
    launch_bwd_sm90_atomics<WGS, MIN_BLOCKS, 0>(c, f);
}

// The three kernels with this main kernel (head dim 128): delta, main, dq. The split backward (c.split): the
// query-major dQ kernel, then the main kernel without dQ in the default form (one warpgroup, dV early; the rows'
// values by TMA where they can be). Its dQ kernel, from TSCALE_ATTENTION_SM90_BWD_QUERY_WGMMA = 1 (the Hopper one,
// attention_bwd_query_sm90.cuh; default: 6-30% faster on an H100) | 0 (the sm_80 one, attention_bwd_query.cuh).
inline void launch_bwd_sm90(const BwdCall& c) {
  TORCH_CHECK(c.p.D == 128, "attention_bwd_cuda: the Hopper backward serves head dim 128, got ", c.p.D);
  const Sm90BwdForm f = sm90_backward_form(c.p);
  if (c.split) {
    if (sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_QUERY_WGMMA", {0, 1}, 1) == 1)
      launch_bwd_query_sm90(c.p);
    else
      launch_bwd_query<128>(c.p);
    f.tma == 2 ? launch_bwd_sm90_main<1, 2, 2, true, false, false, false>(c)
               : launch_bwd_sm90_main<1, 2, 1, true, false, false, false>(c);
    return;
  }
  launch_bwd_delta<128>(c);
  f.wgs == 1 ? launch_bwd_sm90_loads<1, 2>(c, f) : launch_bwd_sm90_loads<2, 1>(c, f);
  f.dq_v4 ? launch_bwd_dq<128, true>(c) : launch_bwd_dq<128, false>(c);
}

}  // namespace
}  // namespace tscale::attn
