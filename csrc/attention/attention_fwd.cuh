// The fused attention forward: kernel and host entry attention_fwd_cuda(q, k, v, doc_ids?, window, sink, scale) -> (out, lse).
//
// Tiling (FlashAttention-2 style). One block of 4 warps per (query tile, head, batch row); each
// warp owns MT consecutive 16-row m-tiles of the tile (MT = 1: 64-query tiles; MT = 2: 128-query
// tiles, so each K and V fragment loaded feeds twice the products). The Q tile is loaded once
// (cp.async); the block then walks the 64-key tiles it can see, for each:
//   S = Q K^T (16 MT x 64 fp32 per warp, mma.sync m16n8k16), mask, online softmax in registers,
//   O += P V with P converted in registers to the bf16 A operand (no trip through shared memory).
// K and V have one shared buffer each; the next K tile is fetched while softmax and P V run, the
// next V tile while the next S = Q K^T runs (cp.async groups, see the loop). At the end each warp
// stages its rows of O in its own rows of the Q tile and writes them as 16-byte stores of whole rows.
// The kernel is bound by the latency of its dependent instructions, so what matters most is how
// many warps a multiprocessor holds, and registers set that (docs/BENCHMARKS.md, "What bounds the
// kernels"). MIN_BLOCKS = 3 caps them at 168 a thread for three blocks (12 warps) per
// multiprocessor instead of two; Q is then read from shared memory at each k-step instead of
// being held as A fragments. The host (fwd_config) takes 64-query tiles and three blocks for
// head dim 128; for head dim 64 (167 registers with Q in registers: three blocks already) it
// takes 128-query tiles unless a window of at most 128 keys would leave them mostly masked.
// Shared memory sets the count where a multiprocessor has little of it: at head dim 128 a block takes 53 KB, so the
// 100 KB of an sm_86 / sm_89 GPU (the RTX 4090) hold one. V_IN_Q holds Q in registers and stages each V tile in Q's
// buffer, free once they are loaded: 36 KB a block, two a multiprocessor (opt-in until it has run on a GPU).
//
// Which key tiles are visited, for the query tile [q0, q0 + BM):
//   * causal: none after the tile of key q0 + BM - 1;
//   * window: none before the tile of key q0 - window + 1 (the first key query q0 may see);
//   * documents: from that range, only key tiles whose document-id range [min, max] meets the
//     query tile's (ranges per 32 positions precomputed by doc_stats_kernel). The first such tile
//     is found by all threads at once; later tiles are tested as the loop reaches them (with
//     non-decreasing ids, as from a cumsum of document starts, every later tile meets).
// A visited tile pair gets the per-element mask only when some pair in it may be hidden
// (all_visible); the mask also hides keys at or past T.
//
// Softmax with the sink (softmax plus one): the running max starts at 0 instead of -inf (the
// null slot's logit), and the final denominator adds exp2(0 - m). Without the sink a row whose
// keys so far are all hidden has m = -inf; exponentials are then taken against 0 so that no
// (-inf) - (-inf) appears, and a row with no visible key at all ends with output 0 and lse +inf.
#pragma once

#include <cstdlib>

#include "attention_host.h"

namespace tscale::attn {
namespace {

// V_IN_Q: V tiles in Q's buffer (64-query tiles only, as large as a V tile), one tile buffer fewer.
template <int D, int MT, bool V_IN_Q = false>
struct FwdLayout {
  static constexpr int kBM = kWarps * 16 * MT;                            // queries per block
  static constexpr int kPitch = D + kPad;                                 // bf16 per shared row
  static constexpr size_t kTileBytes = size_t{kTile} * kPitch * 2;        // one (64, D) key or value tile
  static_assert(!V_IN_Q || kBM == kTile, "V in Q's buffer needs 64-query tiles");
  static constexpr size_t kQ = 0, kK = kQ + size_t{kBM} * kPitch * 2, kV = V_IN_Q ? kQ : kK + kTileBytes;
  static constexpr size_t kKeyDocs = kK + (V_IN_Q ? 1 : 2) * kTileBytes;  // int32 [2][kTile], by step parity
  static constexpr size_t kSlot = kKeyDocs + 2 * kTile * sizeof(int32_t);  // one int for block_extreme
  static constexpr size_t kBytes = kSlot + 16;
};

// MT: 16-row m-tiles per warp (1 or 2). MIN_BLOCKS: blocks per multiprocessor the registers must
// leave room for (__launch_bounds__). Q rows stay in registers as A fragments only with MT = 1 and
// MIN_BLOCKS = 2; otherwise they are read from shared memory at each k-step. V_IN_Q (with Q in
// registers): V tiles go to Q's buffer, the first once every warp holds its Q fragments.
template <int D, int MT, int MIN_BLOCKS, bool V_IN_Q = false>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) attention_fwd_kernel(const FwdParams p) {
  using L = FwdLayout<D, MT, V_IN_Q>;
  constexpr int P = L::kPitch, BM = L::kBM;
  constexpr int kNB = kTile / 8;  // n8-blocks of keys in S
  constexpr int kDB = D / 8;      // n8-blocks of head dims in O
  constexpr bool kQInRegs = MT == 1 && MIN_BLOCKS < 3;
  static_assert(kQInRegs || !V_IN_Q, "V in Q's buffer needs Q in registers");
  TSCALE_ATTN_DYNAMIC_SMEM(smem);
  const uint32_t base = smem_addr(smem);
  const uint32_t q_s = base + L::kQ;  // (BM, D) queries
  const uint32_t k_s = base + L::kK;  // (64, D) keys of the current tile
  const uint32_t v_s = base + L::kV;  // (64, D) values of the current tile
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const unsigned span = window > 0 ? window : 1u << 31;  // row - key < span: in the window (any key, without one)
  const int n_qtiles = (T + BM - 1) / BM;
  const BlockTile bt = block_tile();
  const int qt = n_qtiles - 1 - bt.rank;  // the longest rows (latest tiles) start first
  const int h = bt.h, b = bt.b;
  const int q0 = qt * BM;
  const uint16_t* qg = p.q + b * p.sq.b + h * p.sq.h;  // (T, D) rows of this (b, h)
  const uint16_t* kg = p.k + b * p.sk.b + h * p.sk.h;
  const uint16_t* vg = p.v + b * p.sv.b + h * p.sv.h;
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const ForwardKeyTiles tiles = forward_key_tiles(p, b, q0, BM, kTile);
  const DocRange qd = tiles.qd;
  const int first = tiles.first(q0, window, tid, kThreads, slot);
  auto fetch_keys = [&](int t, int parity) {
    load_tile<kTile, D>(k_s, kg, p.sk.t, t * kTile, T, tid);
    if (docs) {
      for (int i = tid; i < kTile; i += kThreads) {
        const int j = t * kTile + i;
        key_docs[parity * kTile + i] = j < T ? doc[j] : INT_MIN;
      }
    }
  };

  // Prologue: group 1 = Q + K(first), group 2 = V(first) (V_IN_Q: empty; V(first) is fetched on the first step).
  load_tile<BM, D>(q_s, qg, p.sq.t, q0, T, tid);
  fetch_keys(first, 0);
  cp_async_commit();
  if (!V_IN_Q) load_tile<kTile, D>(v_s, vg, p.sv.t, first * kTile, T, tid);
  cp_async_commit();

  // This thread's query rows: m-tile mt, half r (rows g and g + 8 of the tile).
  const int wrow = warp * 16 * MT;  // the warp's first row within the block
  auto row_of = [&](int mt, int r) { return q0 + wrow + mt * 16 + r * 8 + g; };
  int rdoc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) rdoc[mt][r] = docs && row_of(mt, r) < T ? doc[row_of(mt, r)] : -1;
  }

  uint32_t qf[kQInRegs ? D / 16 : 1][4];  // kQInRegs: Q rows of this warp as A fragments, per k-step of 16 dims
  float o[MT][kDB][4];                      // O accumulator: 16 MT rows x D
  float m[MT][2], l[MT][2];                 // running max (log2 domain) and this thread's share of the sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[mt][r] = p.sink ? 0.f : -INFINITY;
      l[mt][r] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < kDB; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
  }

  int t = first;
  for (int step = 0; t >= 0; ++step) {
    const int parity = step & 1;
    const int nt = tiles.next(t);
    cp_async_wait<1>();  // all but the newest group (V(t)) are in: K(t), and Q on the first step
    __syncthreads();
    if (kQInRegs && step == 0) {
#pragma unroll
      for (int kd = 0; kd < D / 16; ++kd) load_a(qf[kd], q_s, P, wrow, kd * 16, lane);
      if (V_IN_Q) {  // V(first) into Q's buffer once every warp holds its Q: a group between K(first) and K(nt)
        __syncthreads();
        load_tile<kTile, D>(v_s, vg, p.sv.t, first * kTile, T, tid);
        cp_async_commit();
      }
    }

    float s[MT][kNB][4];  // S = Q K^T: 16 MT rows x 64 keys per warp
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < kNB; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
    }
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[mt][i] = qf[kd][i];
        } else {
          load_a(qa[mt], q_s, P, wrow + mt * 16, kd * 16, lane);
        }
      }
#pragma unroll
      for (int np = 0; np < kNB / 2; ++np) {
        uint32_t bf[4];
        load_b_nk(bf, k_s, P, np * 16, kd * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(s[mt][2 * np], qa[mt], bf[0], bf[1]);
          mma_bf16(s[mt][2 * np + 1], qa[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with k_s: fetch the next K tile into it
    if (nt >= 0) fetch_keys(nt, parity ^ 1);
    cp_async_commit();

    // Mask, then online softmax on each m-tile's rows (s[mt][.][0..1]: row g, s[mt][.][2..3]: row g + 8).
    // Without a document boundary in the tile pair (single_document), the mask skips the key documents'
    // shared-memory reads: the causal, window and T bounds decide alone.
    const int k0 = t * kTile;
    const DocRange kd = tiles.key_range(t);
    const bool full = all_visible(q0, q0 + BM - 1, k0, k0 + kTile - 1, window, docs, qd, kd);
    const bool doc_mask = !single_document(docs, qd, kd);
    const int32_t* kdocs = key_docs + parity * kTile + t4 * 2;
    // This thread's element (mt, j, e) pairs row q0 + wrow + g + mt 16 + (e >> 1) 8 with key k0 + t4 2 + c,
    // c = j 8 + (e & 1): its distance row - key is diff0 plus a constant of the unrolled loop, visible when
    // 0 <= distance < span (one unsigned comparison) and c < keys_left (the T bound), as visible() decides.
    const int diff0 = q0 + wrow + g - k0 - t4 * 2, keys_left = T - k0 - t4 * 2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < kNB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][j][e] * p.scale_log2;
          if (!full) {
            const int c = j * 8 + (e & 1), r = e >> 1;
            bool seen = static_cast<unsigned>(diff0 + mt * 16 + r * 8 - c) < span && c < keys_left;
            if (doc_mask) seen = seen && rdoc[mt][r] == kdocs[c];
            if (!seen) x = -INFINITY;
          }
          s[mt][j][e] = x;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m[mt][r];
#pragma unroll
        for (int j = 0; j < kNB; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
        mx = fmaxf(mx, warp_xor(mx, 1));  // the 4 lanes of a quad share the row
        mx = fmaxf(mx, warp_xor(mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx;  // all hidden so far: exponentials against 0
        const float alpha = exp2f(m[mt][r] - base);     // rescales what was summed against the old max
        m[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kNB; ++j) {
          s[mt][j][2 * r] = exp2f(s[mt][j][2 * r] - base);
          s[mt][j][2 * r + 1] = exp2f(s[mt][j][2 * r + 1] - base);
          sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
        }
        l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
        for (int j = 0; j < kDB; ++j) {
          o[mt][j][2 * r] *= alpha;
          o[mt][j][2 * r + 1] *= alpha;
        }
      }
    }

    cp_async_wait<1>();  // all but the newest group (K(nt)) are in: V(t)
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // O += P V, 16 keys per k-step
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a(a[mt], s[mt][2 * ks], s[mt][2 * ks + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bf[4];
        load_b_kn(bf, v_s, P, ks * 16, dp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(o[mt][2 * dp], a[mt], bf[0], bf[1]);
          mma_bf16(o[mt][2 * dp + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with v_s: fetch the next V tile into it
    if (nt >= 0) load_tile<kTile, D>(v_s, vg, p.sv.t, nt * kTile, T, tid);
    cp_async_commit();
    t = nt;
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight

  // Epilogue: O / denominator and the logsumexp, for rows inside T. O is staged in the warp's own rows of the
  // Q tile (no other warp reads them) and leaves as 16-byte stores of whole rows.
  uint16_t* og = p.o + b * p.so.b + h * p.so.h;  // (T, D) rows of this (b, h), p.so.t apart
  float* lse = p.lse + bh * T;
  const uint32_t o_s = q_s + wrow * P * 2;  // (16 MT, D) bf16, pitch P
  warp_sync();                              // every lane's last read of Q is behind it
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += warp_xor(sum, 1);
      sum += warp_xor(sum, 2);
      const float base = m[mt][r] == -INFINITY ? 0.f : m[mt][r];
      if (p.sink) sum += exp2f(-base);  // the null slot: logit 0, value 0
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const uint32_t at = o_s + ((mt * 16 + r * 8 + g) * P + t4 * 2) * 2;
#pragma unroll
      for (int j = 0; j < kDB; ++j)
        st_shared_u32(at + j * 16, pack_bf16(o[mt][j][2 * r] * inv, o[mt][j][2 * r + 1] * inv));
      const int rw = row_of(mt, r);
      if (t4 == 0 && rw < T) lse[rw] = sum > 0.f ? (base + log2f(sum)) * kLn2 : INFINITY;
    }
  }
  warp_sync();
  store_rows<D>(og, p.so.t, q0 + wrow, o_s, imin(16 * MT, T - q0 - wrow), lane);
}

// The forward's configuration: rows per warp (16: 64-query tiles, 32: 128-query tiles), the blocks per
// multiprocessor its registers leave room for (2, or 3 with Q read from shared memory), and whether V tiles go
// to Q's buffer (v_in_q: 16 rows and 2 blocks, Q in registers).
struct FwdConfig {
  int rows, blocks;
  bool v_in_q;
};

// TSCALE_ATTENTION_FWD_ROWS=16|32, TSCALE_ATTENTION_FWD_BLOCKS=2|3 and TSCALE_ATTENTION_FWD_V_IN_Q=0|1|auto override
// the choice (for benchmarks and tests; three blocks only with 16 rows, V in Q's buffer only with 16 rows and two
// blocks). Head dim 128: 16 rows, 3 blocks (measured faster on every mask, docs/BENCHMARKS.md). Head dim 64: 2
// blocks, and 32 rows unless a window of at most 128 keys. V_IN_Q=auto: at head dim 128, where a multiprocessor's
// shared memory (smem_per_multiprocessor) holds fewer than two blocks of that layout, 16 rows, 2 blocks and V in Q's
// buffer. It is not the default (unset: 0) until it has run on a GPU: checked on the emulator only
// (docs/BENCHMARKS.md "The forward on a GPU with 100 KB a multiprocessor").
inline FwdConfig fwd_config(int D, int window) {
  FwdConfig c = D == 128 ? FwdConfig{16, 3, false} : FwdConfig{window > 0 && window <= 2 * kTile ? 16 : 32, 2, false};
  const char* rows = std::getenv("TSCALE_ATTENTION_FWD_ROWS");
  const char* blocks = std::getenv("TSCALE_ATTENTION_FWD_BLOCKS");
  const char* v_in_q = std::getenv("TSCALE_ATTENTION_FWD_V_IN_Q");
  const bool forced = v_in_q != nullptr && std::strcmp(v_in_q, "1") == 0;
  const bool automatic = v_in_q != nullptr && std::strcmp(v_in_q, "auto") == 0;
  TORCH_CHECK(v_in_q == nullptr || forced || automatic || std::strcmp(v_in_q, "0") == 0,
              "TSCALE_ATTENTION_FWD_V_IN_Q must be 0, 1 or auto, got '", v_in_q, "'");
  if (forced || (automatic && D == 128 &&
                 smem_per_multiprocessor() < 2 * static_cast<int>(FwdLayout<128, 1>::kBytes + kBlockReservedSmem)))
    c = FwdConfig{16, 2, true};
  if (rows != nullptr) {
    c.rows = std::atoi(rows);
    TORCH_CHECK(c.rows == 16 || c.rows == 32, "TSCALE_ATTENTION_FWD_ROWS must be 16 or 32, got '", rows, "'");
    if (c.rows == 32) c.blocks = 2;
  }
  if (blocks != nullptr) {
    c.blocks = std::atoi(blocks);
    TORCH_CHECK(c.blocks == 2 || c.blocks == 3, "TSCALE_ATTENTION_FWD_BLOCKS must be 2 or 3, got '", blocks, "'");
    TORCH_CHECK(c.blocks == 2 || c.rows == 16, "TSCALE_ATTENTION_FWD_BLOCKS=3 needs 16 rows per warp");
  }
  TORCH_CHECK(!c.v_in_q || (c.rows == 16 && c.blocks == 2),
              "TSCALE_ATTENTION_FWD_V_IN_Q needs 16 rows per warp and 2 blocks (Q held in registers)");
  return c;
}

template <int D, int MT, int MIN_BLOCKS = 2, bool V_IN_Q = false>
void launch_fwd(const FwdParams& p) {
  using L = FwdLayout<D, MT, V_IN_Q>;
  const dim3 grid = tile_grid((p.T + L::kBM - 1) / L::kBM, p.H, p.B);
  launch_kernel(attention_fwd_kernel<D, MT, MIN_BLOCKS, V_IN_Q>, grid, dim3(kThreads), L::kBytes, p);
}

template <int D>
void launch_fwd_for(const FwdParams& p) {
  const FwdConfig c = fwd_config(D, p.window);
  if (c.rows == 32)
    launch_fwd<D, 2>(p);
  else if (c.blocks == 3)
    launch_fwd<D, 1, 3>(p);
  else if (c.v_in_q)
    launch_fwd<D, 1, 2, true>(p);
  else
    launch_fwd<D, 1>(p);
}

// The forward's launch parameters with the tensors they point into (kept alive until the kernel is queued).
struct FwdCall {
  FwdParams p{};
  at::Tensor out, lse, q, k, v, docs;
  DocStats stats;
};

// Checks the op's arguments and allocates its outputs: out bf16 (B, H, T, D) in (B, T, H, D) storage
// (token_major), lse fp32 (B, H, T) contiguous. Nothing is launched yet but the document ranges' kernel.
inline FwdCall prepare_fwd(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                           const std::optional<at::Tensor>& doc_ids, int64_t window, bool sink, double scale) {
  constexpr const char* op = "attention_fwd_cuda";
  check_qkv(q_in, k_in, v_in, op);
  // (positive: the Hopper forwards scale the raw scores' running max)
  TORCH_CHECK(std::isfinite(scale) && scale > 0, op, ": scale must be finite and positive, got ", scale);
  const int B = static_cast<int>(q_in.size(0)), H = static_cast<int>(q_in.size(1));
  const int T = static_cast<int>(q_in.size(2)), D = static_cast<int>(q_in.size(3));
  FwdCall c;
  c.out = token_major(B, H, T, D, q_in);
  c.lse = at::empty({B, H, T}, q_in.options().dtype(at::kFloat));
  c.docs = prepare_docs(doc_ids, q_in, op);
  if (c.out.numel() == 0) return c;
  c.q = kernel_layout(q_in), c.k = kernel_layout(k_in), c.v = kernel_layout(v_in);

  FwdParams& p = c.p;
  p.q = reinterpret_cast<const uint16_t*>(c.q.data_ptr());
  p.k = reinterpret_cast<const uint16_t*>(c.k.data_ptr());
  p.v = reinterpret_cast<const uint16_t*>(c.v.data_ptr());
  p.sq = strides_of(c.q);
  p.sk = strides_of(c.k);
  p.sv = strides_of(c.v);
  p.o = reinterpret_cast<uint16_t*>(c.out.data_ptr());
  p.so = strides_of(c.out);
  p.lse = c.lse.data_ptr<float>();
  p.B = B, p.H = H, p.T = T, p.D = D;
  p.window = normalised_window(window, T);
  p.n_stat = (T + kStatTile - 1) / kStatTile;
  p.sink = sink;
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  if (c.docs.defined()) {
    c.stats = doc_stats(c.docs, B, T, p.n_stat);
    p.doc = c.docs.data_ptr<int32_t>();
    p.doc_min = c.stats.dmin.data_ptr<int32_t>();
    p.doc_max = c.stats.dmax.data_ptr<int32_t>();
  }
  return c;
}

// The sm_80 kernel (mma.sync) for either head dim.
inline void launch_fwd_mma(const FwdParams& p) {
  if (p.D == 64)
    launch_fwd_for<64>(p);
  else
    launch_fwd_for<128>(p);
}

// The op tscale::attention_fwd_cuda through the sm_80 kernel (the CUDA build's entry, attention_fwd.cu, also
// chooses the Hopper one).
inline std::tuple<at::Tensor, at::Tensor> attention_fwd_host(const at::Tensor& q_in, const at::Tensor& k_in,
                                                      const at::Tensor& v_in, const std::optional<at::Tensor>& doc_ids,
                                                      int64_t window, bool sink, double scale) {
  const DeviceScope scope(q_in);
  FwdCall c = prepare_fwd(q_in, k_in, v_in, doc_ids, window, sink, scale);
  if (c.out.numel() != 0) launch_fwd_mma(c.p);
  return {c.out, c.lse};
}

}  // namespace
}  // namespace tscale::attn
