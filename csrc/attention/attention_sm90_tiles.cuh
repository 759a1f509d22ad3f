// Pieces the Hopper (sm_90a) query-major kernels share: a forward (attention_fwd_sm90.cuh, _ws.cuh) and the split
// backward's dQ kernel (attention_bwd_query_sm90.cuh) walk key tiles the same way, with the same products, masks and
// staged row stores.
#pragma once

#include "attention_host.h"
#include "wgmma_sm90.cuh"

namespace tscale::attn {
namespace {

// O (64 x 128) += P V for one tile: P as BN / 16 bf16 A operands, V the swizzled tile at v_s. Issued, not waited.
template <int BN>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[BN / 16][4], uint32_t v_s) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < BN / 16; ++ks) wgmma_rs_n128_tb(o, pa[ks], sw128_desc(v_s + ks * 2048, BN * 128, 1024));
  wgmma_commit();
}

// S (64 x BN) = Q K^T for one warpgroup, issued and committed, not waited: q_rows is its 64 rows in the first half of
// the swizzled Q tile (the second half_q bytes further), k_tile a swizzled BN-key tile.
template <int BN>
__device__ __forceinline__ void issue_s(float (&s)[BN / 2], uint32_t q_rows, uint32_t half_q, uint32_t k_tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t half = kk >> 2, within = (kk & 3) * 32;
    wgmma_ss<BN>(s, sw128_desc(q_rows + half * half_q + within, 16, 1024),
                 sw128_desc(k_tile + half * BN * 128 + within, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

// What hides keys of one tile from this thread's two rows: nothing (full), else the window and causal bound
// (diff0: row0 - the tile's first key - 2 t4; span: the window, or 2^31), T (keys_left: keys at or after this
// thread's first column) and, when doc_mask, the key documents at kdocs (this thread's columns) against rdoc.
struct TileMask {
  bool full, doc_mask;
  const int32_t* kdocs;
  int diff0, keys_left;
  unsigned span;

  // Whether this thread's row row0 + 8 r (document rdoc[r]) sees the tile's key in column 2 t4 + c.
  __device__ __forceinline__ bool sees(int r, int c, const int (&rdoc)[2]) const {
    const bool seen = static_cast<unsigned>(diff0 + r * 8 - c) < span && c < keys_left;
    return doc_mask ? seen && rdoc[r] == kdocs[c] : seen;
  }
};

// The TileMask of key tile t (BN keys) for this thread's rows row0 and row0 + 8 of the BM-query tile at q0, the
// tile's key document ids at tile_docs.
template <int BM, int BN>
__device__ __forceinline__ TileMask tile_mask(const ForwardKeyTiles& tiles, int t, int q0, int row0, int t4, int T,
                                              int window, const int32_t* tile_docs) {
  const int k0 = t * BN;
  const DocRange kd = tiles.key_range(t);
  const unsigned span = window > 0 ? window : 1u << 31;  // row - key < span: in the window (any key, without one)
  return TileMask{all_visible(q0, q0 + BM - 1, k0, k0 + BN - 1, window, tiles.docs, tiles.qd, kd),
                  !single_document(tiles.docs, tiles.qd, kd), tile_docs + t4 * 2, row0 - k0 - t4 * 2,
                  T - k0 - t4 * 2, span};
}

// The document ids of keys [k0, k0 + bn) into `dst` (INT_MIN past T), by threads tid, tid + nthreads, ...
__device__ __forceinline__ void stage_key_docs(int32_t* dst, const int32_t* doc, int k0, int bn, int T, int tid,
                                               int nthreads) {
  for (int c = tid; c < bn; c += nthreads) {
    const int j = k0 + c;
    dst[c] = j < T ? doc[j] : INT_MIN;
  }
}

// Rows [q0 + 16 warp, q0 + 16 warp + 16) of a 64 x 128 fp32 accumulator (acc[4 j + e]: row 16 warp + g + 8 (e >> 1)
// of the tile, column 8 j + 2 t4 + (e & 1)) times mul[e >> 1], as bf16 into rows of `dst` (row stride `stride`
// elements) inside T: one warp stages its rows in the same rows of the swizzled tile at tile_s (BM rows), which no
// product may read any more, then writes whole rows as 16-byte stores.
template <int BM>
__device__ __forceinline__ void store_acc_rows(uint16_t* dst, int64_t stride, const float (&acc)[64],
                                               const float (&mul)[2], uint32_t tile_s, int warp, int lane, int q0,
                                               int T) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int tr = 16 * warp + g + 8 * r;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      st_shared_u32(tile_s + sw128_offset(tr, j, BM) + t4 * 4,
                    pack_bf16(acc[4 * j + 2 * r] * mul[r], acc[4 * j + 2 * r + 1] * mul[r]));
  }
  warp_sync();
  for (int i = lane; i < 16 * 16; i += 32) {
    const int r = 16 * warp + (i >> 4), c = i & 15, row = q0 + r;
    if (row < T) copy_shared_to_global_16(dst + static_cast<int64_t>(row) * stride + c * 8, tile_s + sw128_offset(r, c, BM));
  }
}

}  // namespace
}  // namespace tscale::attn
