// The attention forward for Hopper with specialised warps: one producer warp loads every tile by TMA, two consumer
// warpgroups compute, and barriers in shared memory (mbarrier) pass the buffers between them.
//
// One block of three warpgroups (384 threads) per (128-query tile, head, batch row). Warpgroup 0 gives most of its
// registers to the others (setmaxnreg), and its first warp loads Q once, then, for each key tile of the walk
// (ForwardKeyTiles), K and V into a ring of STAGES buffers: two TMA boxes of 64 head dims each, in the 128-byte
// swizzled layout the wgmma products read (wgmma_sm90.cuh). Every buffer has a "full" barrier (the TMA bytes, and
// for K the key documents the warp's lanes write beside it) and an "empty" one (one arrival from each of the eight
// consumer warps once nothing of theirs reads it any more). Warpgroups 1 and 2 own queries [64 (w - 1), +64) and
// run the pipelined loop of attention_fwd_sm90.cuh per tile t:
//   wait K(t); issue S(t) = Q K(t)^T;  wait V(t - 1); issue O += P(t - 1) V(t - 1)
//   wait for S(t); mask, running max and exponentials of S(t); free K(t)
//   wait for the P V product; free V(t - 1); rescale O; P(t) from S(t)
// with no block-wide synchronisation after the start: a consumer waits only for the buffers it reads, the producer
// only for buffers to refill. With PINGPONG the two consumers take turns to issue their products (named barriers
// 1 and 2), a turn ending once its S(t) is done, so that one's softmax runs while the other's products hold the
// tensor cores. The epilogue is the other Hopper forward's (store_output_rows).
#pragma once

#include <algorithm>

#include "attention_fwd_sm90.cuh"
#include "tma_sm90.cuh"

namespace tscale::attn {
namespace {

// The TMA maps of q (boxes of the block's 128 queries) and of k and v (boxes of one key tile).
struct Sm90FwdMaps {
  TileMap q, k, v;
};

// QBUFS Q tiles: one, or two for the persistent kernel (the next work tile's Q lands during this one's last steps).
template <int BN, int STAGES, int QBUFS = 1>
struct Sm90WsLayout {
  static constexpr int kThreads = 384;
  static constexpr int kBM = 128;                           // queries per block: 64 per consumer warpgroup
  static constexpr uint32_t kHalfQ = kBM * 128;             // bytes of one half (64 head dims) of the Q tile
  static constexpr uint32_t kHalfKV = BN * 128;             // of a K or V tile
  static constexpr uint32_t kTileKV = 2 * kHalfKV;
  static constexpr uint32_t kQ = 0;                         // Q buffer qb at kQ + qb 2 kHalfQ
  static constexpr uint32_t kK = kQ + QBUFS * 2 * kHalfQ;   // buffer s at kK + s kTileKV
  static constexpr uint32_t kV = kK + STAGES * kTileKV;     // buffer s at kV + s kTileKV
  static constexpr uint32_t kKeyDocs = kV + STAGES * kTileKV;  // int32 [STAGES][BN], by K buffer
  // Barriers: Q full [QBUFS], Q empty [QBUFS] (persistent kernel only), then per buffer: K full, K empty, V full,
  // V empty.
  static constexpr uint32_t kBars = kKeyDocs + STAGES * BN * 4;
  static constexpr uint32_t kStageBars = kBars + 8 * (QBUFS == 1 ? 1 : 2 * QBUFS);
  static constexpr uint32_t kSlot = kStageBars + 8 * 4 * STAGES;
  static constexpr size_t kBytes = kSlot + 16 + 1024;  // + room to align the base to 1024 bytes
};

// The ring of K and V buffers of layout L at `base` (1024-byte aligned) and their barriers, by buffer s.
template <class L, int STAGES>
struct WsRing {
  uint32_t base;
  __device__ __forceinline__ uint32_t k_full(int s) const { return base + L::kStageBars + 32 * s; }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return k_full(s) + 8; }
  __device__ __forceinline__ uint32_t v_full(int s) const { return k_full(s) + 16; }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return k_full(s) + 24; }
  __device__ __forceinline__ uint32_t k_buf(int s) const { return base + L::kK + s * L::kTileKV; }
  __device__ __forceinline__ uint32_t v_buf(int s) const { return base + L::kV + s * L::kTileKV; }
  // Its barriers' counts: K full by the producer warp's lanes (after their key documents), the rest by one TMA
  // issue or by the eight consumer warps. By one thread.
  __device__ __forceinline__ void init() const {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(k_full(s), 32);
      mbar_init(k_empty(s), 8);
      mbar_init(v_full(s), 1);
      mbar_init(v_empty(s), 8);
    }
  }
};

// The producer warp's loads of key tile t (of head h, batch row b) into ring buffer i % STAGES, once the consumers
// have released it: K and the tile's key documents (staged by the warp's lanes, doc != nullptr) on K full, V on V full.
template <class L, int BN, int STAGES>
__device__ __forceinline__ void produce_key_tile(const WsRing<L, STAGES>& r, const Sm90FwdMaps& maps, int i, int t,
                                                 int h, int b, const int32_t* doc, int T, int lane, int32_t* key_docs) {
  const int s = i % STAGES;
  const uint32_t freed = ((i / STAGES) & 1) ^ 1;  // the phase in which the consumers released buffer s
  mbar_wait(r.k_empty(s), freed);
  if (doc != nullptr) stage_key_docs(key_docs + s * BN, doc, t * BN, BN, T, lane, 32);
  if (lane == 0) {
    mbar_arrive_expect_tx(r.k_full(s), L::kTileKV);
    tma_load_tile(r.k_buf(s), L::kHalfKV, maps.k, r.k_full(s), t * BN, h, b);
  } else {
    mbar_arrive(r.k_full(s));
  }
  mbar_wait(r.v_empty(s), freed);
  if (lane == 0) {
    mbar_arrive_expect_tx(r.v_full(s), L::kTileKV);
    tma_load_tile(r.v_buf(s), L::kHalfKV, maps.v, r.v_full(s), t * BN, h, b);
  }
}

// A consumer warpgroup's rows of one query tile as it walks the key tiles: the O accumulator, the previous tile's
// P, the running max and sums, and which ring buffer holds the previous tile's V.
template <int BN>
struct WsRows {
  float o[64];              // O accumulator: 64 rows x 128 head dims
  uint32_t pa[BN / 16][4];  // P of the previous tile as bf16 A operands, one per k-step of 16 keys
  float m[2], l[2];         // running max (log2 domain) and this thread's share of the sums, per row
  int rdoc[2];              // the rows' document ids
  int prev = 0;             // the buffer of the previous tile
  uint32_t prev_parity = 0;
};

// One key tile t (ring buffer i % STAGES; `done` tiles of this query tile before it) of a consumer warpgroup cwg
// whose Q rows are at q_rows: the step of the consumers' loop in this file's head. With PINGPONG the issue and the
// wait for S(t) are a turn between named barriers 1 and 2 (`more`: a tile follows this one).
template <class L, int BN, int STAGES, bool PINGPONG>
__device__ __forceinline__ void consume_key_tile(const WsRing<L, STAGES>& r, const FwdParams& p,
                                                 const ForwardKeyTiles& tiles, WsRows<BN>& w, int t, int i, int done,
                                                 bool more, int cwg, uint32_t q_rows, int q0, int row0, int t4,
                                                 int lane, const int32_t* key_docs) {
  const int s = i % STAGES;
  const uint32_t parity = (i / STAGES) & 1;  // of the phase that fills buffer s with tile t
  mbar_wait(r.k_full(s), parity);
  if (done > 0) mbar_wait(r.v_full(w.prev), w.prev_parity);
  if (PINGPONG) named_barrier_sync(1 + cwg, 256);
  float s_acc[BN / 2];  // S = Q K^T: 64 rows x BN keys
  issue_s<BN>(s_acc, q_rows, L::kHalfQ, r.k_buf(s));
  if (done > 0) issue_pv<BN>(w.o, w.pa, r.v_buf(w.prev));
  if (done > 0) {
    wgmma_wait<1>();  // S(t) is done; the P V product may still run
  } else {
    wgmma_wait<0>();
  }
  // The other consumer's turn once S(t) is done: a barrier arrival between the products' issue and their wait makes
  // ptxas serialise every wgmma of the kernel (C7514).
  if (PINGPONG && (cwg == 0 || more)) named_barrier_arrive(2 - cwg, 256);
  fence_registers(s_acc);

  const TileMask mask = tile_mask<L::kBM, BN>(tiles, t, q0, row0, t4, p.T, p.window, key_docs + s * BN);
  float alpha[2];
  softmax_tile<BN>(s_acc, w.m, w.l, alpha, p.scale_log2, mask, w.rdoc);
  if (lane == 0) mbar_arrive(r.k_empty(s));  // K(t) and its key documents are read

  wgmma_wait<0>();  // the P V product of tile t - 1: O and P free again
  fence_registers(w.o);
  fence_registers(w.pa);
  if (done > 0 && lane == 0) mbar_arrive(r.v_empty(w.prev));
  rescale_and_pack<BN>(w.o, w.pa, s_acc, alpha);
  w.prev = s;
  w.prev_parity = parity;
}

// The last tile's P V product, and (release) its V buffer freed for the producer.
template <class L, int BN, int STAGES>
__device__ __forceinline__ void finish_rows(const WsRing<L, STAGES>& r, WsRows<BN>& w, int lane, bool release) {
  mbar_wait(r.v_full(w.prev), w.prev_parity);
  issue_pv<BN>(w.o, w.pa, r.v_buf(w.prev));
  wgmma_wait<0>();
  fence_registers(w.o);
  if (release && lane == 0) mbar_arrive(r.v_empty(w.prev));
}

template <int BN, int STAGES, bool PINGPONG>
__global__ void __launch_bounds__(384, 1)
    attention_fwd_sm90_ws_kernel(const FwdParams p, const __grid_constant__ Sm90FwdMaps maps) {
#ifdef TSCALE_SM90A_DEVICE
  using L = Sm90WsLayout<BN, STAGES>;
  constexpr int BM = L::kBM;
  TSCALE_ATTN_DYNAMIC_SMEM(smem_raw);
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled tiles start at multiples of 1024 bytes
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t q_s = base + L::kQ;
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);
  const uint32_t q_full = base + L::kBars;
  const WsRing<L, STAGES> ring{base};

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  const int T = p.T, window = p.window;
  const int n_qtiles = (T + BM - 1) / BM;
  const BlockTile bt = block_tile();
  const int qt = n_qtiles - 1 - bt.rank;  // the longest rows (latest tiles) start first
  const int h = bt.h, b = bt.b;
  const int q0 = qt * BM;
  const int32_t* doc = p.doc != nullptr ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const ForwardKeyTiles tiles = forward_key_tiles(p, b, q0, BM, BN);
  const int first = tiles.first(q0, window, tid, L::kThreads, slot);
  if (tid == 0) {
    mbar_init(q_full, 1);
    ring.init();
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // the producer
    setmaxnreg_dec<40>();
    if (tid >= 32) return;
    if (lane == 0) {
      mbar_arrive_expect_tx(q_full, 2 * L::kHalfQ);
      tma_load_tile(q_s, L::kHalfQ, maps.q, q_full, q0, h, b);
    }
    int i = 0;
    for (int t = first; t >= 0; t = tiles.next(t), ++i)
      produce_key_tile<L, BN, STAGES>(ring, maps, i, t, h, b, doc, T, lane, key_docs);
    return;
  }

  setmaxnreg_inc<232>();
  const int cw = (tid - 128) / 32, cwg = wg - 1;  // the warp's 16 rows among the block's 128; its warpgroup's 64
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = q0 + 16 * cw + g;  // this thread's rows: row0 and row0 + 8
  WsRows<BN> rows;
  start_rows(p, doc, row0, rows.rdoc, rows.o, rows.m, rows.l);

  // PINGPONG: consumer c issues after named_barrier_sync(1 + c), then lets the other go; the first turn is the first
  // consumer's. Each barrier sees as many arrivals as waits: the second consumer skips its last hand-over.
  if (PINGPONG && cwg == 1) named_barrier_arrive(1, 256);
  mbar_wait(q_full, 0);
  int i = 0;  // tiles done
  for (int t = first, nt; t >= 0; t = nt, ++i) {
    nt = tiles.next(t);
    consume_key_tile<L, BN, STAGES, PINGPONG>(ring, p, tiles, rows, t, i, i, nt >= 0, cwg, q_s + cwg * 64 * 128, q0,
                                              row0, t4, lane, key_docs);
  }
  if (i > 0) finish_rows<L, BN, STAGES>(ring, rows, lane, /*release=*/false);
  store_output_rows<BM>(p, rows.o, rows.m, rows.l, q_s, cw, lane, q0, b, h);
#endif
}

// One work tile of the persistent kernel: the BM-query tile at q0 of head h, batch row b. Work tiles are numbered
// longest first: all the last query tiles of every (head, batch row), then the ones before, and so on.
struct FwdWork {
  int q0, h, b;
};

__device__ __forceinline__ FwdWork fwd_work(int w, int n_qtiles, int H, int B, int bm) {
  const int band = H * B, r = w % band;
  return FwdWork{(n_qtiles - 1 - w / band) * bm, r % H, r / H};
}

// The specialised-warp forward as a persistent kernel: gridDim.x blocks (one a multiprocessor) walk the work tiles in
// the order of fwd_work, block b starting with tile b and then taking the next one from a counter in global memory
// (next_work, zero at the launch: tile gridDim.x + its value), so that a block that finishes early takes more, as
// the hardware's own block dispatch would, and its start (barriers, the first loads) is paid once: the next work
// tile's Q and first K and V tiles land while this one's last steps and its epilogue run. The producer warp takes the
// tiles, keeps one ring of K and V buffers across them and loads each Q into one of two buffers, writing the tile's
// number beside it (-1 after the last: the consumers stop); the eight consumer warps release a Q buffer ("Q empty")
// once their epilogue has copied out the output rows staged there. Each warp finds a work tile's first key tile
// itself (ForwardKeyTiles::first_by_warp). Consumers do not take turns here.
template <int BN, int STAGES>
__global__ void __launch_bounds__(384, 1)
    attention_fwd_sm90_ws_persistent_kernel(const FwdParams p, const __grid_constant__ Sm90FwdMaps maps,
                                            int* next_work) {
#ifdef TSCALE_SM90A_DEVICE
  using L = Sm90WsLayout<BN, STAGES, 2>;
  constexpr int BM = L::kBM;
  TSCALE_ATTN_DYNAMIC_SMEM(smem_raw);
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // swizzled tiles start at multiples of 1024 bytes
  unsigned char* smem = smem_raw + (base - raw);
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  int* work_of = reinterpret_cast<int*>(smem + L::kSlot);  // [2]: the work tile of Q buffer qb, -1 after the last
  auto q_buf = [&](int qb) { return base + L::kQ + qb * 2 * L::kHalfQ; };
  auto q_full = [&](int qb) { return base + L::kBars + 8 * qb; };
  auto q_empty = [&](int qb) { return base + L::kBars + 16 + 8 * qb; };
  const WsRing<L, STAGES> ring{base};

  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  const int T = p.T, window = p.window;
  const int n_qtiles = (T + BM - 1) / BM, n_work = n_qtiles * p.H * p.B;
  if (tid == 0) {
    for (int qb = 0; qb < 2; ++qb) {
      mbar_init(q_full(qb), 1);
      mbar_init(q_empty(qb), 8);  // the consumer warps, after their epilogue
    }
    ring.init();
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {  // the producer
    setmaxnreg_dec<40>();  // (its walk over work tiles spills 32 bytes at 40; the consumers' 232 need the rest)
    if (tid >= 32) return;
    int i = 0, w = blockIdx.x;  // key tiles loaded; the work tile
    for (int n = 0;; ++n) {      // work tiles begun
      const int qb = n & 1;
      mbar_wait(q_empty(qb), ((n >> 1) & 1) ^ 1);  // released by the work tile two before
      if (w >= n_work) {  // no more: the consumers read -1 and stop
        if (lane == 0) {
          work_of[qb] = -1;
          mbar_arrive(q_full(qb));
        }
        return;
      }
      const FwdWork wk = fwd_work(w, n_qtiles, p.H, p.B, BM);
      const int32_t* doc = p.doc != nullptr ? p.doc + static_cast<int64_t>(wk.b) * T : nullptr;
      const ForwardKeyTiles tiles = forward_key_tiles(p, wk.b, wk.q0, BM, BN);
      if (lane == 0) {
        work_of[qb] = w;
        mbar_arrive_expect_tx(q_full(qb), 2 * L::kHalfQ);
        tma_load_tile(q_buf(qb), L::kHalfQ, maps.q, q_full(qb), wk.q0, wk.h, wk.b);
      }
      for (int t = tiles.first_by_warp(wk.q0, window, lane); t >= 0; t = tiles.next(t), ++i)
        produce_key_tile<L, BN, STAGES>(ring, maps, i, t, wk.h, wk.b, doc, T, lane, key_docs);
      int next = lane == 0 ? static_cast<int>(gridDim.x) + atomic_fetch_add_i32(next_work, 1) : 0;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) next += warp_xor_i32(next, o);  // lane 0's to every lane
      w = next;
    }
  }

  setmaxnreg_inc<232>();
  const int cw = (tid - 128) / 32, cwg = wg - 1;  // the warp's 16 rows among the block's 128; its warpgroup's 64
  const int g = lane >> 2, t4 = lane & 3;
  int i = 0;                  // key tiles consumed
  for (int n = 0;; ++n) {      // work tiles begun
    const int qb = n & 1;
    mbar_wait(q_full(qb), (n >> 1) & 1);
    const int w = work_of[qb];
    if (w < 0) break;
    const FwdWork wk = fwd_work(w, n_qtiles, p.H, p.B, BM);
    const int32_t* doc = p.doc != nullptr ? p.doc + static_cast<int64_t>(wk.b) * T : nullptr;
    const ForwardKeyTiles tiles = forward_key_tiles(p, wk.b, wk.q0, BM, BN);
    const int q0 = wk.q0, row0 = q0 + 16 * cw + g;  // this thread's rows: row0 and row0 + 8
    const uint32_t q_s = q_buf(qb);
    WsRows<BN> rows;
    start_rows(p, doc, row0, rows.rdoc, rows.o, rows.m, rows.l);
    int done = 0;  // key tiles of this work tile
    for (int t = tiles.first_by_warp(q0, window, lane), nt; t >= 0; t = nt, ++i, ++done) {
      nt = tiles.next(t);
      consume_key_tile<L, BN, STAGES, false>(ring, p, tiles, rows, t, i, done, nt >= 0, cwg, q_s + cwg * 64 * 128,
                                             q0, row0, t4, lane, key_docs);
    }
    if (done > 0) finish_rows<L, BN, STAGES>(ring, rows, lane, /*release=*/true);
    store_output_rows<BM>(p, rows.o, rows.m, rows.l, q_s, cw, lane, q0, wk.b, wk.h);
    warp_sync();          // every lane's rows copied out of the Q buffer
    fence_proxy_async();  // ... before the next TMA load writes it
    if (lane == 0) mbar_arrive(q_empty(qb));
  }
#endif
}

template <int BN, int STAGES, bool PINGPONG>
void launch_fwd_sm90_ws_config(const FwdParams& p) {
  using L = Sm90WsLayout<BN, STAGES>;
  const Sm90FwdMaps maps{make_tile_map(p.q, p.sq, p.B, p.H, p.T, L::kBM), make_tile_map(p.k, p.sk, p.B, p.H, p.T, BN),
                         make_tile_map(p.v, p.sv, p.B, p.H, p.T, BN)};
  const dim3 grid = tile_grid((p.T + L::kBM - 1) / L::kBM, p.H, p.B);
  launch_kernel(attention_fwd_sm90_ws_kernel<BN, STAGES, PINGPONG>, grid, dim3(L::kThreads), L::kBytes, p, maps);
}

template <int BN, int STAGES>
void launch_fwd_sm90_ws_persistent(const FwdParams& p) {
  using L = Sm90WsLayout<BN, STAGES, 2>;
  const Sm90FwdMaps maps{make_tile_map(p.q, p.sq, p.B, p.H, p.T, L::kBM), make_tile_map(p.k, p.sk, p.B, p.H, p.T, BN),
                         make_tile_map(p.v, p.sv, p.B, p.H, p.T, BN)};
  const int64_t n_work = static_cast<int64_t>((p.T + L::kBM - 1) / L::kBM) * p.H * p.B;
  TORCH_CHECK(n_work < INT_MAX, "attention_fwd_cuda: too many query tiles for the persistent forward: ", n_work);
  const int blocks = static_cast<int>(std::min<int64_t>(n_work, persistent_blocks()));
  const at::Tensor next_work = zeroed_i32(1);  // (freed after the launch: the allocator reuses it in stream order)
  launch_kernel(attention_fwd_sm90_ws_persistent_kernel<BN, STAGES>, dim3(blocks), dim3(L::kThreads), L::kBytes, p,
                maps, next_work.data_ptr<int>());
}

template <int BN, int STAGES>
void launch_fwd_sm90_ws_stages(const FwdParams& p, bool pingpong) {
  pingpong ? launch_fwd_sm90_ws_config<BN, STAGES, true>(p) : launch_fwd_sm90_ws_config<BN, STAGES, false>(p);
}

// Keys per tile (TSCALE_ATTENTION_SM90_BN = 64 | 128, default 128), buffers of K and V in the ring
// (TSCALE_ATTENTION_SM90_STAGES = 2 | 3, default 2) and turns between the consumers (TSCALE_ATTENTION_SM90_PINGPONG
// = 0 | 1, default 0). Defaults as measured on an H100 (docs/BENCHMARKS.md): 128-key tiles 18-28% faster than
// 64-key ones on the causal mask, a third buffer no faster, turns no faster (within 0.6% of the call, once the turn
// ended after the wait for S and ptxas no longer serialised their wgmma products; each consumer already overlaps
// its softmax with its own P V product). TSCALE_ATTENTION_SM90_PERSISTENT = 0 | 1 (the
// persistent kernel, two buffers without turns only; its block count TSCALE_ATTENTION_SM90_BLOCKS, default the
// multiprocessors); default 0: with a fixed order of work tiles it made the causal forward 15-19% slower on an H100
// (docs/BENCHMARKS.md "A persistent Hopper forward"); the order taken from a counter has not been timed yet.
inline void launch_fwd_sm90_ws(const FwdParams& p) {
  TORCH_CHECK(p.D == 128, "attention_fwd_cuda: the Hopper forward serves head dim 128, got ", p.D);
  const int bn = sm90_env_choice("TSCALE_ATTENTION_SM90_BN", {64, 128}, 128);
  const int stages = sm90_env_choice("TSCALE_ATTENTION_SM90_STAGES", {2, 3}, 2);
  const bool pingpong = sm90_env_choice("TSCALE_ATTENTION_SM90_PINGPONG", {0, 1}, 0) == 1;
  const bool persistent = sm90_env_choice("TSCALE_ATTENTION_SM90_PERSISTENT", {0, 1}, 0) == 1;
  if (persistent) {
    TORCH_CHECK(!pingpong && stages == 2, "TSCALE_ATTENTION_SM90_PERSISTENT=1 runs two buffers without turns: "
                "set TSCALE_ATTENTION_SM90_PINGPONG and TSCALE_ATTENTION_SM90_STAGES to auto");
    bn == 128 ? launch_fwd_sm90_ws_persistent<128, 2>(p) : launch_fwd_sm90_ws_persistent<64, 2>(p);
    return;
  }
  if (bn == 128)
    stages == 2 ? launch_fwd_sm90_ws_stages<128, 2>(p, pingpong) : launch_fwd_sm90_ws_stages<128, 3>(p, pingpong);
  else
    stages == 2 ? launch_fwd_sm90_ws_stages<64, 2>(p, pingpong) : launch_fwd_sm90_ws_stages<64, 3>(p, pingpong);
}

}  // namespace
}  // namespace tscale::attn
