// The attention backward's main kernel for Hopper (sm_90a): warpgroup products (wgmma) for head dim 128.
//
// It takes the place of attention_bwd.cuh's main kernel after the same delta kernel. A block is WGS warpgroups (128 threads each) on one (64 WGS-key tile, head, batch
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
//                                        half each, over all 128 keys), then fp32 atomics into attention_bwd.cuh's
//                                        fragment-ordered dq_accum, which its dq kernel turns into dq
// or, with DQ_PASS (one warpgroup), the block first computes dQ of its own 64 queries whole, walking the key tiles
// those queries see (oldest first, ending at its own, whose K and V then stay for the walk above):
//   S = Q K^T, dP = dO V^T                 wgmma m64n64k16, K-major in shared memory
//   P = exp2(S scale log2 e - lse log2 e) (masked), dS = P (dP - Delta)                       (registers)
//   dQ += dS K                             wgmma m64n128k16, dS as a bf16 register operand, K read transposed
// and writes it as bf16: no dS^T through shared memory, no atomics, no dq_accum and no dq kernel, for S and dP
// computed twice. The key tiles come into two buffer pairs in turn (K and V of the block's own tile, and the
// second Q and dO buffers of the walk above), the next fetched while the current one's products run.
// Q and dO come by the TMA unit, issued by one thread, each buffer completing an mbarrier (TMA_Q), or by cp.async from
// every thread. Tiles are 128-byte swizzled (wgmma_sm90.cuh); dK and dV stay in registers (64 fp32 each per thread).
// Two warpgroups halve the query-tile loads and the dq_accum atomics per key.
#pragma once

#include "attention_bwd.cuh"
#include "tma_sm90.cuh"
#include "wgmma_sm90.cuh"

namespace tscale::attn {
namespace {

// The TMA maps of q and dO (boxes of one 64-query tile), and of k and v for DQ_PASS, for TMA_Q.
struct Sm90BwdMaps {
  TileMap q, dout, k, v;
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
  static constexpr uint32_t kLse = kDS + WGS * kHalf;  // float [2][64]: lse * log2 e
  static constexpr uint32_t kDelta = kLse + 2 * 64 * 4;   // float [2][64]
  static constexpr uint32_t kQDocs = kDelta + 2 * 64 * 4;  // int32 [2][64]
  static constexpr uint32_t kBars = kQDocs + 2 * 64 * 4;  // [2] full, by parity; then K and V's (TMA_Q)
  static constexpr uint32_t kSlot = kBars + 24;
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

// DQ_PASS: dQ of the block's own 64 queries [q0, q0 + 64), whole, written as bf16 (one warpgroup; the file's comment
// says what it computes). Q and dO of those queries are already on their way into buffer 0 with their rows' lse,
// Delta and document ids (completing the first phase of buffer 0's barrier with TMA_Q). The key tiles the queries see
// are walked oldest first, into pair 0 (the block's K and V tiles, barrier kv_full) and pair 1 (the second Q and dO
// buffers, barrier `full1`) in turn, so that the last, the block's own, lands in pair 0, where the walk over query
// tiles keeps it. Returns the fills of pair 1, which that walk counts in its barrier's phases. Every thread of the
// block calls it.
template <bool TMA_Q>
__device__ __forceinline__ int sm90_dq_pass(const BwdParams& p, const Sm90BwdMaps& maps, uint32_t base,
                                            const unsigned char* smem, int b, int h, int q0, int* slot) {
  using L = Sm90BwdLayout<1>;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const uint32_t q_s = base + L::kQ, do_s = base + L::kDO;  // buffer 0: this block's queries
  const uint32_t full0 = base + L::kBars, full1 = full0 + 8, kv_full = full0 + 16;
  auto k_buf = [&](int pair) { return pair == 0 ? base + L::kK : base + L::kQ + L::kTileBytes; };
  auto v_buf = [&](int pair) { return pair == 0 ? base + L::kV : base + L::kDO + L::kTileBytes; };
  auto fetch_keys = [&](int j, int pair) {
    if constexpr (TMA_Q) {
      if (tid == 0) {
        const uint32_t bar = pair == 0 ? kv_full : full1;
        mbar_arrive_expect_tx(bar, 2 * L::kTileBytes);
        tma_load_tile(k_buf(pair), L::kHalf, maps.k, bar, j * 64, h, b);
        tma_load_tile(v_buf(pair), L::kHalf, maps.v, bar, j * 64, h, b);
      }
    } else {
      load_tile_sw128<64, 128>(k_buf(pair), p.k + b * p.sk.b + h * p.sk.h, p.sk.t, j * 64, T, tid);
      load_tile_sw128<64, 128>(v_buf(pair), p.v + b * p.sv.b + h * p.sv.h, p.sv.t, j * 64, T, tid);
    }
  };
  const ForwardKeyTiles keys = forward_key_tiles(p, b, q0, 64, 64);
  const int first = keys.first(q0, window, tid, 128, slot);
  int n = 0;  // key tiles to walk
  for (int j = first; j >= 0; j = keys.next(j)) ++n;
  const float* lse_s = reinterpret_cast<const float*>(smem + L::kLse);  // buffer 0's rows: lse * log2 e
  const float* delta_s = reinterpret_cast<const float*>(smem + L::kDelta);
  const int32_t* qdocs_s = reinterpret_cast<const int32_t*>(smem + L::kQDocs);
  const int r0 = warp * 16 + g;  // this thread's query rows: r0 and r0 + 8 of the tile
  float dq[64];                  // 64 queries x 128 head dims
#pragma unroll
  for (int i = 0; i < 64; ++i) dq[i] = 0.f;
  auto pair_of = [&](int m) { return (n - 1 - m) & 1; };  // the pair tile m of the walk lands in
  uint32_t phases = 0;  // bit `pair`: the parity of that pair's barrier phase the next wait is for
  int fills1 = 0;
  // Tile m landed, for every thread (cp.async: after the block's sync).
  auto await_tile = [&](int m) {
    const int pair = pair_of(m);
    fills1 += pair;
    if constexpr (TMA_Q) {
      if (m == 0) mbar_wait(full0, 0);  // this block's Q and dO
      mbar_wait(pair == 0 ? kv_full : full1, (phases >> pair) & 1);
      phases ^= 1u << pair;
    } else {
      cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();
    }
  };
  float s[32], dp[32];  // S = Q K^T and dP = dO V^T of one key tile: 64 queries x 64 keys
  uint32_t da[4][4];    // dS as bf16 A operands, one per k-step of 16 keys (held until its product is waited for)
  auto issue_scores = [&](int pair) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t at = (kk >> 2) * L::kHalf + (kk & 3) * 32;
      wgmma_ss<64>(s, sw128_desc(q_s + at, 16, 1024), sw128_desc(k_buf(pair) + at, 16, 1024), kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t at = (kk >> 2) * L::kHalf + (kk & 3) * 32;
      wgmma_ss<64>(dp, sw128_desc(do_s + at, 16, 1024), sw128_desc(v_buf(pair) + at, 16, 1024), kk > 0);
    }
    wgmma_commit();
  };

  // The walk: tile m + 1's S and dP are issued right after tile m's dQ product, both waited for together; tile
  // m + 1 is fetched into the pair tile m - 1 used once every warp is done with that tile's products (tile 1 at the
  // start, into the pair no tile used yet). Each product is issued from one place (iteration -1 only issues tile 0's
  // S and dP), so that no register copy of an accumulator sits between a product and its wait.
  fetch_keys(first, pair_of(0));
  int j = -1, after = first;  // tile m's key tile, and tile m + 1's (-1: none)
  if (keys.next(first) >= 0) fetch_keys(keys.next(first), pair_of(1));
  cp_async_commit();
  for (int m = -1;; ++m) {
    if (m >= 0) {
      const int pair = pair_of(m);
      wgmma_wait<0>();  // tile m's S and dP, and tile m - 1's dQ product
      fence_registers(s);
      fence_registers(dp);
      fence_registers(dq);
      fence_registers(da);
      if (m > 0) {
        __syncthreads();  // every warp is done with tile m - 1's pair
        if (after >= 0) fetch_keys(after, pair_of(m + 1));
        cp_async_commit();
      }

      // P (into s) and dS = P (dP - Delta) (into dp); s[4 c + e]: query row r0 + 8 (e >> 1), key kj0 + 8 c + 2 t4 +
      // (e & 1). Without a document boundary in the tile pair (one_doc), visibility is the causal, window and T bounds.
      const int kj0 = j * 64;
      const DocRange kd = keys.key_range(j);
      const bool full = all_visible(q0, q0 + 63, kj0, kj0 + 63, window, docs, keys.qd, kd);
      const bool one_doc = single_document(docs, keys.qd, kd);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = r0 + 8 * r, qi = q0 + row;
        const float lse2 = lse_s[row], delta = delta_s[row];
        const int qdoc = docs ? qdocs_s[row] : 0;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int at = 4 * c + 2 * r + e, key = kj0 + 8 * c + 2 * t4 + e;
            float pv = exp2f(s[at] * p.scale_log2 - lse2);
            if (!full) {
              const bool ok = one_doc ? key <= qi && (window == 0 || qi - key < window) && key < T
                                      : visible(qi, key, T, window, docs, qdoc, key < T ? doc[key] : -1);
              if (!ok) pv = 0.f;
            }
            dp[at] = pv * (dp[at] - delta);
          }
        }
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        acc_to_a(da[ks], *reinterpret_cast<const float(*)[4]>(&dp[8 * ks]), *reinterpret_cast<const float(*)[4]>(&dp[8 * ks + 4]));
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_rs_n128_tb(dq, da[ks], sw128_desc(k_buf(pair) + ks * 2048, L::kHalf, 1024));
      wgmma_commit();
    }
    if (after < 0) break;
    await_tile(m + 1);
    if (m < 0) __syncthreads();  // the rows' lse, Delta and document ids (plain stores) too
    issue_scores(pair_of(m + 1));
    j = after;
    after = keys.next(after);
  }
  wgmma_wait<0>();  // the last tile's dQ product
  fence_registers(dq);
  fence_registers(da);

  uint16_t* dqg = p.dq + b * p.sg.b + h * p.sg.h;  // (T, D) rows of this (b, h), p.sg.t apart
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = q0 + r0 + 8 * r;
    if (qi >= T) continue;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int64_t at = static_cast<int64_t>(qi) * p.sg.t + c * 8 + t4 * 2;
      *reinterpret_cast<uint32_t*>(dqg + at) = pack_bf16(dq[4 * c + 2 * r] * p.scale, dq[4 * c + 2 * r + 1] * p.scale);
    }
  }
  return fills1;
}

template <int WGS, int MIN_BLOCKS, bool TMA_Q, bool EARLY_DV, bool DQ_PASS>
__global__ void __launch_bounds__(128 * WGS, MIN_BLOCKS)
    attention_bwd_sm90_kernel(const BwdParams p, const __grid_constant__ Sm90BwdMaps maps) {
#ifdef TSCALE_SM90A_DEVICE
  static_assert(!DQ_PASS || WGS == 1, "the dQ pass walks the keys of one warpgroup's 64 queries");
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
  const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
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
      mbar_init(q_full + 16, 1);  // K and V's (DQ_PASS)
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
        mbar_arrive_expect_tx(bar, 2 * L::kTileBytes);
        tma_load_tile(q_buf(parity), L::kHalf, maps.q, bar, q0, h, b);
        tma_load_tile(do_buf(parity), L::kHalf, maps.dout, bar, q0, h, b);
      }
    } else {
      load_tile_sw128<BM, kThreads>(q_buf(parity), qg, p.sq.t, q0, T, tid);
      load_tile_sw128<BM, kThreads>(do_buf(parity), dog, p.sdo.t, q0, T, tid);
    }
    stage_query_rows(lse_g, delta_g, doc, q0, BM, T, lse_s + parity * BM, delta_s + parity * BM, qdocs_s + parity * BM,
                     tid, kThreads);
  };

  // Groups of cp.async: K and V, then the first query tile; then each step's next tile. With DQ_PASS the first query
  // tile is the block's own (tiles.first), whose dQ pass brings K and V last.
  int fills1 = 0;  // fills of buffer 1 before the walk (by the dQ pass), for its barrier's phases
  if constexpr (DQ_PASS) {
    fetch_queries(tiles.first, 0);
    fills1 = sm90_dq_pass<TMA_Q>(p, maps, base, smem, b, h, k0, slot);
  } else {
#pragma unroll
    for (int w = 0; w < WGS; ++w) {
      load_tile_sw128<64, kThreads>(k_all + w * L::kTileBytes, kg, p.sk.t, k0 + 64 * w, T, tid);
      load_tile_sw128<64, kThreads>(base + L::kV + w * L::kTileBytes, vg, p.sv.t, k0 + 64 * w, T, tid);
    }
    cp_async_commit();
    fetch_queries(tiles.first, 0);
    cp_async_commit();
  }

  const int key0 = kw0 + warp * 16 + g, key1 = key0 + 8;  // this thread's two key rows
  const int kdoc0 = docs && key0 < T ? doc[key0] : -1;
  const int kdoc1 = docs && key1 < T ? doc[key1] : -1;
  float dk[64], dv[64];  // 64 keys x 128 head dims per warpgroup
#pragma unroll
  for (int j = 0; j < 64; ++j) dk[j] = dv[j] = 0.f;
  float* dqa = DQ_PASS ? nullptr : p.dq_accum + bh * p.T_pad * 128;

  int i = tiles.first;
  for (int step = 0; i >= 0; ++step) {
    const int parity = step & 1;
    const int ni = tiles.next(i);
    cp_async_wait<0>();  // K, V and tile i landed
    if constexpr (TMA_Q)  // the (step / 2)-th fill of this buffer in the walk, after buffer 1's by the dQ pass
      mbar_wait(q_full + 8 * parity, ((step >> 1) + (parity ? fills1 : 0)) & 1);
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
        float pv = exp2f(s[4 * j + e] * p.scale_log2 - lse_t[qc]);
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
    if constexpr (!DQ_PASS) {  // dS^T as bf16 into its swizzled tile (key row kr, query columns 8 j.. in chunk j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int kr = warp * 16 + g + 8 * r;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          st_shared_u32(ds_s + kr * 128 + ((j ^ (kr & 7)) << 4) + t4 * 4, pack_bf16(dp[4 * j + 2 * r], dp[4 * j + 2 * r + 1]));
      }
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      acc_to_a(da[ks], *reinterpret_cast<const float(*)[4]>(&dp[8 * ks]), *reinterpret_cast<const float(*)[4]>(&dp[8 * ks + 4]));
    if constexpr (!DQ_PASS) {
      if constexpr (EARLY_DV) {  // dV is done by now: its A operand's registers are free
        wgmma_wait<0>();
        fence_registers(dv);
        fence_registers(pa);
      }
      fence_proxy_async();
      __syncthreads();  // dS^T complete for every warp's products
    }

    wgmma_fence();
    if constexpr (!EARLY_DV) {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_rs_n128_tb(dv, pa[ks], sw128_desc(dot_s + ks * 2048, L::kHalf, 1024));
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_rs_n128_tb(dk, da[ks], sw128_desc(qt_s + ks * 2048, L::kHalf, 1024));
    wgmma_commit();
    if constexpr (DQ_PASS) {
      wgmma_wait<0>();  // dK and dV: the next step refills the buffers they read
    } else {
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
      wgmma_wait<0>();  // (the first also retires the dK product, and the dV product when issued with it)
      fence_registers(dq);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) atomic_add_f32(blk + (half * 8 + j) * 128 + e * 32 + lane, dq[4 * j + e]);
      }
    }
    }
    fence_registers(dv);
    fence_registers(dk);
    if constexpr (!EARLY_DV || DQ_PASS) fence_registers(pa);
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

template <int WGS, int MIN_BLOCKS, bool TMA_Q, bool EARLY_DV, bool DQ_PASS>
void launch_bwd_sm90_main(const BwdCall& c) {
  using L = Sm90BwdLayout<WGS>;
  const BwdParams& p = c.p;
  Sm90BwdMaps maps{};
  if constexpr (TMA_Q) {
    maps.q = make_tile_map(p.q, p.sq, p.B, p.H, p.T, 64);
    maps.dout = make_tile_map(p.dout, p.sdo, p.B, p.H, p.T, 64);
    if constexpr (DQ_PASS) {
      maps.k = make_tile_map(p.k, p.sk, p.B, p.H, p.T, 64);
      maps.v = make_tile_map(p.v, p.sv, p.B, p.H, p.T, 64);
    }
  }
  const dim3 grid((p.T + L::kKeys - 1) / L::kKeys, p.H, p.B);
  launch_kernel(attention_bwd_sm90_kernel<WGS, MIN_BLOCKS, TMA_Q, EARLY_DV, DQ_PASS>, grid, dim3(L::kThreads),
                L::kBytes, p, maps);
}

// The widest window for which `auto` takes the dQ pass (TSCALE_ATTENTION_SM90_BWD_DQ_PASS).
constexpr int kDqPassMaxWindow = 512;

// The main kernel's form, from the environment (each setting takes `auto`, its default):
//   TSCALE_ATTENTION_SM90_BWD_WGS = 1 (107 KiB of shared memory: two blocks a multiprocessor) | 2 (147 KiB: one
//     block of 128-key tiles); default 1. Measured on the H200 (docs/BENCHMARKS.md "The Hopper backward's loads by
//     TMA"): one warpgroup with TMA loads took 1.54 ms at T 4096 causal, one or two with cp.async 1.74, and one with
//     TMA was the fastest on every mask and length measured.
//   TSCALE_ATTENTION_SM90_BWD_TMA = 1 (Q and dO by the TMA unit, issued by one thread) | 0 (cp.async from every
//     thread); default 1 (6-12% faster on every mask and length measured).
//   TSCALE_ATTENTION_SM90_BWD_EARLY_DV = 1 (dV += P^T dO issued as soon as P^T is formed, running while dS^T is) | 0
//     (issued with dK after the block's wait on dS^T); default 1: 2.5% off the kernel at T 4096 causal and 1.6% at
//     T 1024 causal on an H100, the windowed masks unchanged (docs/BENCHMARKS.md "The Hopper backward's schedule").
//   TSCALE_ATTENTION_SM90_BWD_DQ_PASS = 1 (each block computes its own queries' dQ whole first, recomputing S and dP:
//     no atomics, dq_accum or dq kernel; one warpgroup only) | 0 (dQ by atomics into dq_accum); default 1 for windows
//     of at most kDqPassMaxWindow keys with one warpgroup, where the atomics' traffic outweighs the products.
struct Sm90BwdForm {
  int wgs;
  bool tma, early_dv, dq_pass;
};

inline Sm90BwdForm sm90_backward_form(const BwdParams& p) {
  Sm90BwdForm f;
  f.wgs = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_WGS", {1, 2}, 1);
  f.tma = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_TMA", {0, 1}, 1) == 1;
  f.early_dv = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_EARLY_DV", {0, 1}, 1) == 1;
  const int dq_pass = sm90_env_choice("TSCALE_ATTENTION_SM90_BWD_DQ_PASS", {0, 1}, -1);
  TORCH_CHECK(dq_pass != 1 || f.wgs == 1,
              "TSCALE_ATTENTION_SM90_BWD_DQ_PASS=1 needs one warpgroup a block: set TSCALE_ATTENTION_SM90_BWD_WGS=1 "
              "or auto");
  f.dq_pass = dq_pass == -1 ? f.wgs == 1 && p.window > 0 && p.window <= kDqPassMaxWindow : dq_pass == 1;
  return f;
}

template <int WGS, int MIN_BLOCKS, bool DQ_PASS>
void launch_bwd_sm90_loads(const BwdCall& c, const Sm90BwdForm& f) {
  if (f.tma)
    f.early_dv ? launch_bwd_sm90_main<WGS, MIN_BLOCKS, true, true, DQ_PASS>(c)
               : launch_bwd_sm90_main<WGS, MIN_BLOCKS, true, false, DQ_PASS>(c);
  else
    f.early_dv ? launch_bwd_sm90_main<WGS, MIN_BLOCKS, false, true, DQ_PASS>(c)
               : launch_bwd_sm90_main<WGS, MIN_BLOCKS, false, false, DQ_PASS>(c);
}

// The kernels with this main kernel (head dim 128): delta, main, and dq unless the main kernel wrote dq itself.
inline void launch_bwd_sm90(BwdCall& c) {
  TORCH_CHECK(c.p.D == 128, "attention_bwd_cuda: the Hopper backward serves head dim 128, got ", c.p.D);
  const Sm90BwdForm f = sm90_backward_form(c.p);
  if (!f.dq_pass) attach_dq_accum(c);
  launch_bwd_delta<128>(c);
  if (f.dq_pass)
    launch_bwd_sm90_loads<1, 2, true>(c, f);
  else
    f.wgs == 1 ? launch_bwd_sm90_loads<1, 2, false>(c, f) : launch_bwd_sm90_loads<2, 1, false>(c, f);
  if (!f.dq_pass) launch_bwd_dq<128>(c);
}

}  // namespace
}  // namespace tscale::attn
