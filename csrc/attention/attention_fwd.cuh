// The fused attention forward: kernel and host entry attention_fwd_cuda(q, k, v, doc_ids?, window, sink, scale) -> (out, lse).
//
// Tiling (FlashAttention-2 style). One block of 4 warps per (QT consecutive 64-query tiles, head,
// batch row); each warp owns 16 rows of a tile and keeps their Q as mma A fragments in registers.
// For each of its query tiles the block walks the 64-key tiles the tile can see, for each:
//   S = Q K^T (16 x 64 fp32 per warp, mma.sync m16n8k16), mask, online softmax in registers,
//   O += P V with P converted in registers to the bf16 A operand (no trip through shared memory).
// The walk is one stream of steps over all of the block's (query tile, key tile) pairs. K and V
// are double-buffered: at the start of step j the block fetches (cp.async) the K and V tiles of
// step j + 1, and the Q tile when step j + 1 starts a query tile, so each load has a whole step to
// land and a step needs one barrier. Several query tiles per block (QT = 4 where a window limits
// each tile to a few key tiles) keep that stream long: a tile's first loads are hidden behind the
// last step of the one before. Q has one buffer: its fragments are taken at a tile's first step,
// and the next tile's Q is fetched at its last (after one more barrier when that is the same step).
// Shared memory: 87 KB a block for D = 128, within the 99 KB an sm_86 / sm_89 block may have.
//
// Which key tiles are visited, for the query tile [q0, q0 + 64):
//   * causal: none after the tile of key q0 + 63;
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

template <int D>
struct FwdLayout {
  static constexpr int kBM = kWarps * 16;                                 // queries per tile
  static constexpr int kPitch = D + kPad;                                 // bf16 per shared row
  static constexpr size_t kTileBytes = size_t{kTile} * kPitch * 2;        // one (64, D) query, key or value tile
  static constexpr size_t kQ = 0, kK = kQ + kTileBytes;                   // Q, K [2], V [2]
  static constexpr size_t kV = kK + 2 * kTileBytes;
  static constexpr size_t kKeyDocs = kV + 2 * kTileBytes;                // int32 [2][kTile], with K's buffers
  static constexpr size_t kSlot = kKeyDocs + 2 * kTile * sizeof(int32_t);  // one int for block_extreme
  static constexpr size_t kBytes = kSlot + 16;
  static_assert(kBM == kTile, "a query tile is one 64-row tile");
};

// QT: query tiles per block, consecutive, of one (batch row, head).
template <int D, int QT>
__global__ void __launch_bounds__(kThreads) attention_fwd_kernel(const FwdParams p) {
  using L = FwdLayout<D>;
  constexpr int P = L::kPitch, BM = L::kBM;
  constexpr int kNB = kTile / 8;  // n8-blocks of keys in S
  constexpr int kDB = D / 8;      // n8-blocks of head dims in O
  TSCALE_ATTN_DYNAMIC_SMEM(smem);
  const uint32_t base = smem_addr(smem);
  const uint32_t q_s = base + L::kQ;  // (64, D) queries of the current (or, at its last step, the next) tile
  auto k_buf = [&](int i) { return base + static_cast<uint32_t>(L::kK + i * L::kTileBytes); };  // (64, D) keys
  auto v_buf = [&](int i) { return base + static_cast<uint32_t>(L::kV + i * L::kTileBytes); };  // (64, D) values
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const int n_qtiles = (T + BM - 1) / BM, n_ktiles = (T + kTile - 1) / kTile;
  const int n_groups = (n_qtiles + QT - 1) / QT;
  const int group = n_groups - 1 - static_cast<int>(blockIdx.x);  // the longest rows (latest tiles) start first
  const int qt_end = imin(n_qtiles, (group + 1) * QT);
  const int h = blockIdx.y, b = blockIdx.z;
  const uint16_t* qg = p.q + b * p.sq.b + h * p.sq.h;  // (T, D) rows of this (b, h)
  const uint16_t* kg = p.k + b * p.sk.b + h * p.sk.h;
  const uint16_t* vg = p.v + b * p.sv.b + h * p.sv.h;
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;
  uint16_t* og = p.o + bh * T * D;
  float* lse = p.lse + bh * T;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const int32_t* dmin = docs ? p.doc_min + static_cast<int64_t>(b) * p.n_stat : nullptr;
  const int32_t* dmax = docs ? p.doc_max + static_cast<int64_t>(b) * p.n_stat : nullptr;
  auto query_range = [&](int qt) { return docs ? doc_range(dmin, dmax, qt * BM, BM, p.n_stat) : DocRange{0, 0}; };
  auto key_range = [&](int t) { return docs ? doc_range(dmin, dmax, t * kTile, kTile, p.n_stat) : DocRange{0, 0}; };
  auto last_key_tile = [&](int qt) { return imin((qt * BM + BM - 1) / kTile, n_ktiles - 1); };  // causal bound

  // First key tile of query tile qt: the window's, then the first whose documents meet the tile's
  // (the tile of its first query always does). Every thread of the block must call it.
  auto first_key_tile = [&](int qt) {
    const int q0 = qt * BM;
    const int first = window > 0 ? imax(0, q0 - window + 1) / kTile : 0;
    if (!docs) return first;
    const DocRange qd = query_range(qt);
    const int own = q0 / kTile;
    int mine = own;
    for (int t = first + tid; t < own; t += kThreads) {
      if (overlaps(qd, key_range(t))) {
        mine = t;
        break;  // this thread's later candidates are larger
      }
    }
    return block_extreme(slot, true, mine, own, /*is_min=*/true);
  };
  auto fetch_keys = [&](int t, int buf) {  // K and V tile t, and the keys' document ids, into buffer buf
    load_tile<kTile, D>(k_buf(buf), kg, p.sk.t, t * kTile, T, tid);
    load_tile<kTile, D>(v_buf(buf), vg, p.sv.t, t * kTile, T, tid);
    if (docs) {
      for (int i = tid; i < kTile; i += kThreads) {
        const int j = t * kTile + i;
        key_docs[buf * kTile + i] = j < T ? doc[j] : INT_MIN;
      }
    }
  };

  // The current query tile: its first query, document range and last key tile, and this thread's
  // rows (half r: rows g and g + 8 of the warp's 16) with their document ids.
  int qt = group * QT, q0 = qt * BM, last = last_key_tile(qt);
  DocRange qd = query_range(qt);
  const int wrow = warp * 16;  // the warp's first row within the tile
  auto row_of = [&](int r) { return q0 + wrow + r * 8 + g; };
  int rdoc[2];
  uint32_t qf[D / 16][4];  // the warp's Q rows as A fragments, per k-step of 16 dims
  float o[kDB][4];         // O accumulator: 16 rows x D
  float m[2], l[2];        // running max (log2 domain) and this thread's share of the sums

  // Prologue: the first step's Q, K and V, one group.
  int t = first_key_tile(qt);
  load_tile<BM, D>(q_s, qg, p.sq.t, q0, T, tid);
  fetch_keys(t, 0);
  cp_async_commit();

  bool tile_start = true;
  for (int step = 0;; ++step) {
    const int buf = step & 1;
    // The next step: the next key tile this query tile sees, else the first of the next query tile.
    int nt = t + 1;
    while (nt <= last && docs && !overlaps(qd, key_range(nt))) ++nt;
    const bool tile_ends = nt > last;
    const bool more = !tile_ends || qt + 1 < qt_end;
    if (tile_ends && more) nt = first_key_tile(qt + 1);

    cp_async_wait<0>();  // this step's loads (fetched during the last one) are in
    __syncthreads();     // ... for every thread, and every warp is done with the other buffers
    if (tile_start) {
#pragma unroll
      for (int kd = 0; kd < D / 16; ++kd) load_a(qf[kd], q_s, P, wrow, kd * 16, lane);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        rdoc[r] = docs && row_of(r) < T ? doc[row_of(r)] : -1;
        m[r] = p.sink ? 0.f : -INFINITY;
        l[r] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < kDB; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    }
    if (more) {
      if (tile_ends) {
        if (tile_start) __syncthreads();  // a one-step tile: every warp has its Q fragments first
        load_tile<BM, D>(q_s, qg, p.sq.t, (qt + 1) * BM, T, tid);
      }
      fetch_keys(nt, buf ^ 1);
    }
    cp_async_commit();

    float s[kNB][4];  // S = Q K^T: 16 rows x 64 keys per warp
#pragma unroll
    for (int j = 0; j < kNB; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
#pragma unroll
      for (int np = 0; np < kNB / 2; ++np) {
        uint32_t bf[4];
        load_b_nk(bf, k_buf(buf), P, np * 16, kd * 16, lane);
        mma_bf16(s[2 * np], qf[kd], bf[0], bf[1]);
        mma_bf16(s[2 * np + 1], qf[kd], bf[2], bf[3]);
      }
    }

    // Mask, then online softmax (s[.][0..1]: row g, s[.][2..3]: row g + 8).
    const int k0 = t * kTile;
    const bool full = all_visible(q0, q0 + BM - 1, k0, k0 + kTile - 1, window, docs, qd, key_range(t));
    const int32_t* kdocs = key_docs + buf * kTile;
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * p.scale_log2;
        if (!full) {
          const int key = k0 + j * 8 + t4 * 2 + (e & 1);
          const int r = e >> 1;
          if (!visible(row_of(r), key, T, window, docs, rdoc[r], docs ? kdocs[key - k0] : 0)) x = -INFINITY;
        }
        s[j][e] = x;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int j = 0; j < kNB; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      mx = fmaxf(mx, warp_xor(mx, 1));  // the 4 lanes of a quad share the row
      mx = fmaxf(mx, warp_xor(mx, 2));
      const float ref = mx == -INFINITY ? 0.f : mx;  // all hidden so far: exponentials against 0
      const float alpha = exp2f(m[r] - ref);         // rescales what was summed against the old max
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNB; ++j) {
        s[j][2 * r] = exp2f(s[j][2 * r] - ref);
        s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - ref);
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kDB; ++j) {
        o[j][2 * r] *= alpha;
        o[j][2 * r + 1] *= alpha;
      }
    }

#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // O += P V, 16 keys per k-step
      uint32_t a[4];
      acc_to_a(a, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bf[4];
        load_b_kn(bf, v_buf(buf), P, ks * 16, dp * 16, lane);
        mma_bf16(o[2 * dp], a, bf[0], bf[1]);
        mma_bf16(o[2 * dp + 1], a, bf[2], bf[3]);
      }
    }

    tile_start = tile_ends;
    if (tile_ends) {  // O / denominator and the logsumexp of the tile, for rows inside T
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float sum = l[r];
        sum += warp_xor(sum, 1);
        sum += warp_xor(sum, 2);
        const float mx = m[r] == -INFINITY ? 0.f : m[r];
        if (p.sink) sum += exp2f(-mx);  // the null slot: logit 0, value 0
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        const int rw = row_of(r);
        if (rw < T) {
          uint16_t* orow = og + static_cast<int64_t>(rw) * D;
#pragma unroll
          for (int j = 0; j < kDB; ++j) {
            *reinterpret_cast<uint32_t*>(orow + j * 8 + t4 * 2) = pack_bf16(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
          }
          if (t4 == 0) lse[rw] = sum > 0.f ? (mx + log2f(sum)) * kLn2 : INFINITY;
        }
      }
      if (!more) break;
      ++qt;
      q0 = qt * BM;
      last = last_key_tile(qt);
      qd = query_range(qt);
    }
    t = nt;
  }
  cp_async_wait<0>();  // only an empty group remains; leave nothing in flight
}

// Query tiles per block: TSCALE_ATTENTION_FWD_TILES=1 or 4 if set (for benchmarks and tests), else 4
// where a window of at most 256 keys limits each query tile to a few key tiles, 1 otherwise (causal
// rows are long enough, and one tile per block balances their unequal lengths best).
inline int fwd_query_tiles(int window) {
  if (const char* env = std::getenv("TSCALE_ATTENTION_FWD_TILES")) {
    const int tiles = std::atoi(env);
    TORCH_CHECK(tiles == 1 || tiles == 4, "TSCALE_ATTENTION_FWD_TILES must be 1 or 4, got '", env, "'");
    return tiles;
  }
  return window > 0 && window <= 4 * kTile ? 4 : 1;
}

template <int D, int QT>
void launch_fwd(const FwdParams& p) {
  const int n_qtiles = (p.T + FwdLayout<D>::kBM - 1) / FwdLayout<D>::kBM;
  const dim3 grid((n_qtiles + QT - 1) / QT, p.H, p.B);
  launch_kernel(attention_fwd_kernel<D, QT>, grid, dim3(kThreads), FwdLayout<D>::kBytes, p);
}

template <int D>
void launch_fwd_for(const FwdParams& p) {
  fwd_query_tiles(p.window) == 4 ? launch_fwd<D, 4>(p) : launch_fwd<D, 1>(p);
}

// The op tscale::attention_fwd_cuda: out bf16 (B, H, T, D) and lse fp32 (B, H, T), contiguous.
std::tuple<at::Tensor, at::Tensor> attention_fwd_host(const at::Tensor& q_in, const at::Tensor& k_in,
                                                      const at::Tensor& v_in, const std::optional<at::Tensor>& doc_ids,
                                                      int64_t window, bool sink, double scale) {
  constexpr const char* op = "attention_fwd_cuda";
  check_qkv(q_in, k_in, v_in, op);
  TORCH_CHECK(std::isfinite(scale), op, ": scale must be finite");
  const DeviceScope scope(q_in);
  const int B = static_cast<int>(q_in.size(0)), H = static_cast<int>(q_in.size(1));
  const int T = static_cast<int>(q_in.size(2)), D = static_cast<int>(q_in.size(3));
  at::Tensor out = at::empty({B, H, T, D}, q_in.options());
  at::Tensor lse = at::empty({B, H, T}, q_in.options().dtype(at::kFloat));
  const at::Tensor docs = prepare_docs(doc_ids, q_in, op);
  if (out.numel() == 0) return {out, lse};
  const at::Tensor q = kernel_layout(q_in), k = kernel_layout(k_in), v = kernel_layout(v_in);

  FwdParams p{};
  p.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  p.k = reinterpret_cast<const uint16_t*>(k.data_ptr());
  p.v = reinterpret_cast<const uint16_t*>(v.data_ptr());
  p.sq = strides_of(q);
  p.sk = strides_of(k);
  p.sv = strides_of(v);
  p.o = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.lse = lse.data_ptr<float>();
  p.B = B, p.H = H, p.T = T, p.D = D;
  p.window = normalised_window(window, T);
  p.n_stat = (T + kStatTile - 1) / kStatTile;
  p.sink = sink;
  p.scale_log2 = static_cast<float>(scale) * kLog2e;
  DocStats stats;
  if (docs.defined()) {
    stats = doc_stats(docs, B, T, p.n_stat);
    p.doc = docs.data_ptr<int32_t>();
    p.doc_min = stats.dmin.data_ptr<int32_t>();
    p.doc_max = stats.dmax.data_ptr<int32_t>();
  }
  if (D == 64)
    launch_fwd_for<64>(p);
  else
    launch_fwd_for<128>(p);
  return {out, lse};
}

}  // namespace
}  // namespace tscale::attn
