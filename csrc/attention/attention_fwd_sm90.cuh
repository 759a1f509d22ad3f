// The attention forward for Hopper (sm_90a): warpgroup products (wgmma) for head dim 128, same op, same masks.
//
// One block of WGS warpgroups (128 threads each) per (64 WGS-query tile, head, batch row); warpgroup w owns the
// block's queries [64 w, 64 w + 64). The block walks the BN-key tiles its queries can see (ForwardKeyTiles:
// causal, window, document ranges). Per tile t and warpgroup, the products are issued asynchronously so that the
// tensor cores work while the softmax runs:
//   issue S(t) = Q K(t)^T          wgmma m64nBNk16, Q and K from shared memory, 8 k-steps over the head dims
//   issue O += P(t-1) V(t-1)        wgmma m64n128k16, P from registers as bf16, V read transposed
//   wait for S(t); mask, running max and exponentials of S(t) (the accumulator layout is mma.sync's, so the
//   rules are the sm_80 kernel's)
//   wait for the P V product; rescale O; P(t) from S(t)
// K and V each have two buffers in 128-byte swizzled tiles (wgmma_sm90.cuh), filled by cp.async from all
// threads: K(t + 1) is fetched while tile t is computed, V(t + 1) once the P V product of tile t - 1, which read
// its buffer, is done. O is staged in the Q tile and written as 16-byte stores of whole rows; lse as the sm_80
// kernel writes it, so either backward can follow either forward.
#pragma once

#include <cstdlib>

#include "attention_sm90_tiles.cuh"

namespace tscale::attn {
namespace {

// BN keys per tile, WGS warpgroups a block (64 queries each).
template <int BN, int WGS>
struct Sm90FwdLayout {
  static constexpr int kThreads = 128 * WGS;
  static constexpr int kBM = 64 * WGS;                    // queries per block
  static constexpr uint32_t kHalfQ = kBM * 128;           // bytes of one half (64 head dims) of the Q tile
  static constexpr uint32_t kHalfKV = BN * 128;           // of a K or V tile
  static constexpr uint32_t kTileKV = 2 * kHalfKV;
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kQ + 2 * kHalfQ;         // buffer s at kK + s kTileKV
  static constexpr uint32_t kV = kK + 2 * kTileKV;        // buffer s at kV + s kTileKV
  static constexpr uint32_t kKeyDocs = kV + 2 * kTileKV;  // int32 [2][BN], by K buffer
  static constexpr uint32_t kSlot = kKeyDocs + 2 * BN * 4;
  static constexpr size_t kBytes = kSlot + 16 + 1024;  // + room to align the base to 1024 bytes
};

// This thread's start for its rows row0 and row0 + 8: their document ids (-1 past T or without documents), O = 0, the
// running max at the sink's logit 0 (or -inf without it) and empty sums.
__device__ __forceinline__ void start_rows(const FwdParams& p, const int32_t* doc, int row0, int (&rdoc)[2],
                                           float (&o)[64], float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rdoc[r] = doc != nullptr && row0 + 8 * r < p.T ? doc[row0 + 8 * r] : -1;
    m[r] = p.sink ? 0.f : -INFINITY;
    l[r] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
}

// One key tile of the online softmax for this thread's rows row0 and row0 + 8: S (s[4 j + e]: row row0 + 8 (e >> 1),
// key 8 j + 2 t4 + (e & 1) of the tile) masked, the running max m (log2 domain) and this thread's share of the sums
// l brought up to date, s replaced by its exponentials, alpha the factor for what was summed before. The scale
// (scale_log2 > 0, so the raw maximum scales to the scaled one) goes into each exponent's fused multiply-add.
template <int BN>
__device__ __forceinline__ void softmax_tile(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             float scale_log2, const TileMask& mask, const int (&rdoc)[2]) {
  constexpr int kNB = BN / 8;  // n8-blocks of keys in S
  if (!mask.full) {
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * 8 + (e & 1), r = e >> 1;
        if (!mask.sees(r, c, rdoc)) s[4 * j + e] = -INFINITY;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;  // of the raw scores
#pragma unroll
    for (int j = 0; j < kNB; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = fmaxf(mx, warp_xor(mx, 1));  // the 4 lanes of a quad share the row
    mx = fmaxf(mx, warp_xor(mx, 2));
    mx = fmaxf(m[r], mx * scale_log2);
    const float top = mx == -INFINITY ? 0.f : mx;  // all hidden so far: exponentials against 0
    alpha[r] = exp2f(m[r] - top);                  // rescales what was summed against the old max
    m[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
      s[4 * j + 2 * r] = exp2f(fmaf(s[4 * j + 2 * r], scale_log2, -top));
      s[4 * j + 2 * r + 1] = exp2f(fmaf(s[4 * j + 2 * r + 1], scale_log2, -top));
      sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    l[r] = l[r] * alpha[r] + sum;
  }
}

// O (64 x 128, this thread's rows) *= alpha per row, skipped by a warp none of whose rows' max moved (alpha 1 is
// exact); P (the exponentials in s) as the bf16 A operands of O += P V.
template <int BN>
__device__ __forceinline__ void rescale_and_pack(float (&o)[64], uint32_t (&pa)[BN / 16][4], const float (&s)[BN / 2],
                                                 const float (&alpha)[2]) {
  if (warp_any(alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
#pragma unroll
  for (int ks = 0; ks < BN / 16; ++ks) {
    const float(&lo)[4] = *reinterpret_cast<const float(*)[4]>(&s[8 * ks]);
    const float(&hi)[4] = *reinterpret_cast<const float(*)[4]>(&s[8 * ks + 4]);
    acc_to_a(pa[ks], lo, hi);
  }
}

// Epilogue of one warp: O / denominator and the logsumexp for its 16 rows (rows 16 warp.. of the block's BM-query
// tile at q0) inside T, O staged in the swizzled Q tile at q_s, which no product reads any more.
template <int BM>
__device__ __forceinline__ void store_output_rows(const FwdParams& p, const float (&o)[64], const float (&m)[2],
                                                  const float (&l)[2], uint32_t q_s, int warp, int lane, int q0, int b,
                                                  int h) {
  const int g = lane >> 2, t4 = lane & 3, T = p.T;
  float* lse = p.lse + (static_cast<int64_t>(b) * p.H + h) * T;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += warp_xor(sum, 1);
    sum += warp_xor(sum, 2);
    const float top = m[r] == -INFINITY ? 0.f : m[r];
    if (p.sink) sum += exp2f(-top);  // the null slot: logit 0, value 0
    inv[r] = sum > 0.f ? 1.f / sum : 0.f;
    const int rw = q0 + 16 * warp + g + 8 * r;
    if (t4 == 0 && rw < T) lse[rw] = sum > 0.f ? (top + log2f(sum)) * kLn2 : INFINITY;
  }
  store_acc_rows<BM>(p.o + b * p.so.b + h * p.so.h, p.so.t, o, inv, q_s, warp, lane, q0, T);
}

// MIN_BLOCKS: blocks per multiprocessor the registers must leave room for (__launch_bounds__).
template <int BN, int WGS, int MIN_BLOCKS>
__global__ void __launch_bounds__(128 * WGS, MIN_BLOCKS) attention_fwd_sm90_kernel(const FwdParams p) {
#ifdef TSCALE_SM90A_DEVICE
  using L = Sm90FwdLayout<BN, WGS>;
  constexpr int BM = L::kBM, kThreads = L::kThreads;
  TSCALE_ATTN_DYNAMIC_SMEM(smem_raw);
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled tiles start at multiples of 1024 bytes
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t q_s = base + L::kQ;
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const int n_qtiles = (T + BM - 1) / BM;
  const BlockTile bt = block_tile();
  const int qt = n_qtiles - 1 - bt.rank;  // the longest rows (latest tiles) start first
  const int h = bt.h, b = bt.b;
  const int q0 = qt * BM;
  const uint16_t* qg = p.q + b * p.sq.b + h * p.sq.h;  // (T, D) rows of this (b, h)
  const uint16_t* kg = p.k + b * p.sk.b + h * p.sk.h;
  const uint16_t* vg = p.v + b * p.sv.b + h * p.sv.h;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const ForwardKeyTiles tiles = forward_key_tiles(p, b, q0, BM, BN);
  const int first = tiles.first(q0, window, tid, kThreads, slot);
  auto k_buf = [&](int i) { return base + L::kK + i * L::kTileKV; };
  auto v_buf = [&](int i) { return base + L::kV + i * L::kTileKV; };
  auto fetch_keys = [&](int t, int i) {  // K and the key documents of tile t into buffer i
    load_tile_sw128<BN, kThreads>(k_buf(i), kg, p.sk.t, t * BN, T, tid);
    if (docs) stage_key_docs(key_docs + i * BN, doc, t * BN, BN, T, tid, kThreads);
  };

  // Groups of cp.async, in order: Q + K(first), V(first); then per step K(next) at its start and V(next) at its
  // end. At a step's start all but the newest group (V of this tile) have landed once one is waited for.
  load_tile_sw128<BM, kThreads>(q_s, qg, p.sq.t, q0, T, tid);
  fetch_keys(first, 0);
  cp_async_commit();
  load_tile_sw128<BN, kThreads>(v_buf(0), vg, p.sv.t, first * BN, T, tid);
  cp_async_commit();

  // This thread's rows: q0 + 16 warp + g (r = 0) and + 8 (r = 1), in its warpgroup's 64.
  const int row0 = q0 + 16 * warp + g;
  int rdoc[2];
  float o[64];              // O accumulator: 64 rows x 128 head dims
  uint32_t pa[BN / 16][4];  // P of the previous tile as bf16 A operands, one per k-step of 16 keys
  float m[2], l[2];         // running max (log2 domain) and this thread's share of the sums, per row
  start_rows(p, doc, row0, rdoc, o, m, l);

  int t = first;
  for (int step = 0; t >= 0; ++step) {
    const int buf = step & 1;
    const int nt = tiles.next(t);
    cp_async_wait<1>();  // K(t) (and Q) landed, and V(t - 1); V(t) may still be on its way
    fence_proxy_async();
    __syncthreads();  // ... for every thread's copies
    if (nt >= 0) fetch_keys(nt, buf ^ 1);  // that buffer's K was last read by S(t - 1), complete
    cp_async_commit();

    float s[BN / 2];  // S = Q K^T: 64 rows x BN keys
    issue_s<BN>(s, q_s + wg * 64 * 128, L::kHalfQ, k_buf(buf));
    if (step > 0) {
      issue_pv<BN>(o, pa, v_buf(buf ^ 1));
      wgmma_wait<1>();  // S(t) is done; the P V product may still run
    } else {
      wgmma_wait<0>();
    }
    fence_registers(s);

    const TileMask mask = tile_mask<BM, BN>(tiles, t, q0, row0, t4, T, window, key_docs + buf * BN);
    float alpha[2];
    softmax_tile<BN>(s, m, l, alpha, p.scale_log2, mask, rdoc);

    wgmma_wait<0>();  // the P V product of tile t - 1: O and P free again
    fence_registers(o);
    fence_registers(pa);
    rescale_and_pack<BN>(o, pa, s, alpha);
    __syncthreads();  // no warp reads V(t - 1) any more: its buffer takes V(next)
    if (nt >= 0) load_tile_sw128<BN, kThreads>(v_buf(buf ^ 1), vg, p.sv.t, nt * BN, T, tid);
    cp_async_commit();
    t = nt;
    if (t < 0) {  // the last tile's P V product
      cp_async_wait<2>();  // V of this tile (two groups back, the last two empty) landed
      fence_proxy_async();
      __syncthreads();
      issue_pv<BN>(o, pa, v_buf(buf));
      wgmma_wait<0>();
      fence_registers(o);
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight

  store_output_rows<BM>(p, o, m, l, q_s, warp, lane, q0, b, h);
#endif
}

template <int BN, int WGS, int MIN_BLOCKS>
void launch_fwd_sm90_config(const FwdParams& p) {
  using L = Sm90FwdLayout<BN, WGS>;
  const dim3 grid = tile_grid((p.T + L::kBM - 1) / L::kBM, p.H, p.B);
  launch_kernel(attention_fwd_sm90_kernel<BN, WGS, MIN_BLOCKS>, grid, dim3(L::kThreads), L::kBytes, p);
}

// Keys per tile (TSCALE_ATTENTION_SM90_BN = 64 | 128) and warpgroups a block (TSCALE_ATTENTION_SM90_WGS = 1 | 2).
// Defaults, measured (docs/BENCHMARKS.md, "The Hopper forward"): without a window, 128-key tiles and two
// warpgroups, which share their K and V tiles (half the traffic from L2; 160 KiB of shared memory, one block a
// multiprocessor); with one, 64-key tiles and one warpgroup (80 KiB: two blocks a multiprocessor, whose products
// and softmax overlap).
inline void launch_fwd_sm90(const FwdParams& p) {
  TORCH_CHECK(p.D == 128, "attention_fwd_cuda: the Hopper forward serves head dim 128, got ", p.D);
  const bool windowed = p.window > 0;
  const int bn = sm90_env_choice("TSCALE_ATTENTION_SM90_BN", {64, 128}, windowed ? 64 : 128);
  const int wgs = sm90_env_choice("TSCALE_ATTENTION_SM90_WGS", {1, 2}, windowed ? 1 : 2);
  if (wgs == 1)
    bn == 64 ? launch_fwd_sm90_config<64, 1, 2>(p) : launch_fwd_sm90_config<128, 1, 1>(p);
  else
    bn == 64 ? launch_fwd_sm90_config<64, 2, 1>(p) : launch_fwd_sm90_config<128, 2, 1>(p);
}

}  // namespace
}  // namespace tscale::attn
