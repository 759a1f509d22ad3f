// The fused attention forward: kernel and host entry attention_fwd_cuda(q, k, v, doc_ids?, window, sink, scale) -> (out, lse).
//
// Tiling (FlashAttention-2 style). One block of 4 warps per (64-query tile, head, batch row);
// warp w owns query rows 16w..16w+15 of the tile. The Q tile is loaded once (cp.async) and kept
// in registers as mma A fragments; the block then walks the 64-key tiles it can see, for each:
//   S = Q K^T (16 x 64 fp32 per warp, mma.sync m16n8k16), mask, online softmax in registers,
//   O += P V with P converted in registers to the bf16 A operand (no trip through shared memory).
// K and V have one shared buffer each; the next K tile is fetched while softmax and P V run, the
// next V tile while the next S = Q K^T runs (cp.async groups, see the loop).
//
// Which key tiles are visited, for the query tile [q0, q0 + 64):
//   * causal: none after the diagonal tile (the tile of q0 itself; key tiles = query tiles);
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

#include "attention_host.h"

namespace tscale::attn {
namespace {

template <int D>
struct FwdLayout {
  static constexpr int kPitch = D + kPad;                                 // bf16 per shared row
  static constexpr size_t kTileBytes = size_t{kTile} * kPitch * 2;        // one (64, D) tile
  static constexpr size_t kQ = 0, kK = kQ + kTileBytes, kV = kK + kTileBytes;
  static constexpr size_t kKeyDocs = kV + kTileBytes;                    // int32 [2][kTile], by step parity
  static constexpr size_t kSlot = kKeyDocs + 2 * kTile * sizeof(int32_t);  // one int for block_extreme
  static constexpr size_t kBytes = kSlot + 16;
};

template <int D>
__global__ void __launch_bounds__(kThreads) attention_fwd_kernel(const FwdParams p) {
  using L = FwdLayout<D>;
  constexpr int P = L::kPitch;
  constexpr int kNB = kTile / 8;  // n8-blocks of keys in S
  constexpr int kDB = D / 8;      // n8-blocks of head dims in O
  TSCALE_ATTN_DYNAMIC_SMEM(smem);
  const uint32_t base = smem_addr(smem);
  const uint32_t q_s = base + L::kQ;  // (64, D) queries
  const uint32_t k_s = base + L::kK;  // (64, D) keys of the current tile
  const uint32_t v_s = base + L::kV;  // (64, D) values of the current tile
  int32_t* key_docs = reinterpret_cast<int32_t*>(smem + L::kKeyDocs);
  int* slot = reinterpret_cast<int*>(smem + L::kSlot);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
  const int T = p.T, window = p.window;
  const int n_tiles = (T + kTile - 1) / kTile;
  const int qt = n_tiles - 1 - static_cast<int>(blockIdx.x);  // the longest rows (latest tiles) start first
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = qt * kTile;
  const uint16_t* qg = p.q + b * p.sq.b + h * p.sq.h;  // (T, D) rows of this (b, h)
  const uint16_t* kg = p.k + b * p.sk.b + h * p.sk.h;
  const uint16_t* vg = p.v + b * p.sv.b + h * p.sv.h;
  const int64_t bh = static_cast<int64_t>(b) * p.H + h;

  const bool docs = p.doc != nullptr;
  const int32_t* doc = docs ? p.doc + static_cast<int64_t>(b) * T : nullptr;
  const int32_t* dmin = docs ? p.doc_min + static_cast<int64_t>(b) * p.n_stat : nullptr;
  const int32_t* dmax = docs ? p.doc_max + static_cast<int64_t>(b) * p.n_stat : nullptr;
  const DocRange qd = docs ? doc_range(dmin, dmax, q0, kTile, p.n_stat) : DocRange{0, 0};
  auto key_range = [&](int t) { return docs ? doc_range(dmin, dmax, t * kTile, kTile, p.n_stat) : DocRange{0, 0}; };
  auto tile_seen = [&](int t) { return !docs || overlaps(qd, key_range(t)); };

  // First key tile: the window's, then the first whose documents meet ours (tile qt always does).
  int first = window > 0 ? imax(0, q0 - window + 1) / kTile : 0;
  if (docs) {
    int mine = qt;
    for (int t = first + tid; t < qt; t += kThreads) {
      if (tile_seen(t)) {
        mine = t;
        break;  // this thread's later candidates are larger
      }
    }
    first = block_extreme(slot, true, mine, qt, /*is_min=*/true);
  }
  auto next_tile = [&](int t) {  // the next key tile to visit after t, or -1
    for (++t; t <= qt; ++t)
      if (tile_seen(t)) return t;
    return -1;
  };
  auto fetch_keys = [&](int t, int parity) {
    load_tile<kTile, D>(k_s, kg, p.sk.t, t * kTile, T, tid);
    if (docs) {
      for (int i = tid; i < kTile; i += kThreads) {
        const int j = t * kTile + i;
        key_docs[parity * kTile + i] = j < T ? doc[j] : INT_MIN;
      }
    }
  };

  // Prologue: group 1 = Q + K(first), group 2 = V(first).
  load_tile<kTile, D>(q_s, qg, p.sq.t, q0, T, tid);
  fetch_keys(first, 0);
  cp_async_commit();
  load_tile<kTile, D>(v_s, vg, p.sv.t, first * kTile, T, tid);
  cp_async_commit();

  const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;  // this thread's two query rows
  const int doc0 = docs && row0 < T ? doc[row0] : -1;
  const int doc1 = docs && row1 < T ? doc[row1] : -1;

  uint32_t qf[D / 16][4];                       // Q rows of this warp as A fragments, per k-step of 16 dims
  float o[kDB][4];                              // O accumulator: 16 rows x D
  float m[2] = {p.sink ? 0.f : -INFINITY, p.sink ? 0.f : -INFINITY};  // running max (log2 domain)
  float l[2] = {0.f, 0.f};                      // this thread's share of the running denominators
#pragma unroll
  for (int j = 0; j < kDB; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  int t = first;
  for (int step = 0; t >= 0; ++step) {
    const int parity = step & 1;
    const int nt = next_tile(t);
    cp_async_wait<1>();  // all but the newest group (V(t)) are in: K(t), and Q on the first step
    __syncthreads();
    if (step == 0) {
#pragma unroll
      for (int kd = 0; kd < D / 16; ++kd) load_a(qf[kd], q_s, P, warp * 16, kd * 16, lane);
    }

    float s[kNB][4];  // S = Q K^T: 16 rows x 64 keys per warp
#pragma unroll
    for (int j = 0; j < kNB; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
#pragma unroll
      for (int np = 0; np < kNB / 2; ++np) {
        uint32_t bf[4];
        load_b_nk(bf, k_s, P, np * 16, kd * 16, lane);
        mma_bf16(s[2 * np], qf[kd], bf[0], bf[1]);
        mma_bf16(s[2 * np + 1], qf[kd], bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp is done with k_s: fetch the next K tile into it
    if (nt >= 0) fetch_keys(nt, parity ^ 1);
    cp_async_commit();

    // Mask, then online softmax on rows row0 (s[.][0..1]) and row1 (s[.][2..3]).
    const int k0 = t * kTile;
    const bool full = all_visible(q0, q0 + kTile - 1, k0, k0 + kTile - 1, window, docs, qd, key_range(t));
    const int32_t* kdocs = key_docs + parity * kTile;
#pragma unroll
    for (int j = 0; j < kNB; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * p.scale_log2;
        if (!full) {
          const int key = k0 + j * 8 + t4 * 2 + (e & 1);
          const bool ok = e < 2 ? visible(row0, key, T, window, docs, doc0, docs ? kdocs[key - k0] : 0)
                                : visible(row1, key, T, window, docs, doc1, docs ? kdocs[key - k0] : 0);
          if (!ok) x = -INFINITY;
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
      const float base = mx == -INFINITY ? 0.f : mx;  // all hidden so far: exponentials against 0
      const float alpha = exp2f(m[r] - base);         // rescales what was summed against the old max
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kNB; ++j) {
        s[j][2 * r] = exp2f(s[j][2 * r] - base);
        s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - base);
        sum += s[j][2 * r] + s[j][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kDB; ++j) {
        o[j][2 * r] *= alpha;
        o[j][2 * r + 1] *= alpha;
      }
    }

    cp_async_wait<1>();  // all but the newest group (K(nt)) are in: V(t)
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kTile / 16; ++ks) {  // O += P V, 16 keys per k-step
      uint32_t a[4];
      acc_to_a(a, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bf[4];
        load_b_kn(bf, v_s, P, ks * 16, dp * 16, lane);
        mma_bf16(o[2 * dp], a, bf[0], bf[1]);
        mma_bf16(o[2 * dp + 1], a, bf[2], bf[3]);
      }
    }
    __syncthreads();  // every warp is done with v_s: fetch the next V tile into it
    if (nt >= 0) load_tile<kTile, D>(v_s, vg, p.sv.t, nt * kTile, T, tid);
    cp_async_commit();
    t = nt;
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight

  // Epilogue: O / denominator and the logsumexp, for rows inside T.
  uint16_t* og = p.o + bh * T * D;
  float* lse = p.lse + bh * T;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += warp_xor(sum, 1);
    sum += warp_xor(sum, 2);
    const float base = m[r] == -INFINITY ? 0.f : m[r];
    if (p.sink) sum += exp2f(-base);  // the null slot: logit 0, value 0
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = r == 0 ? row0 : row1;
    if (row < T) {
      uint16_t* orow = og + static_cast<int64_t>(row) * D;
#pragma unroll
      for (int j = 0; j < kDB; ++j) {
        *reinterpret_cast<uint32_t*>(orow + j * 8 + t4 * 2) = pack_bf16(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      }
      if (t4 == 0) lse[row] = sum > 0.f ? (base + log2f(sum)) * kLn2 : INFINITY;
    }
  }
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
  const dim3 grid((T + kTile - 1) / kTile, H, B);
  if (D == 64)
    launch_kernel(attention_fwd_kernel<64>, grid, dim3(kThreads), FwdLayout<64>::kBytes, p);
  else
    launch_kernel(attention_fwd_kernel<128>, grid, dim3(kThreads), FwdLayout<128>::kBytes, p);
  return {out, lse};
}

}  // namespace
}  // namespace tscale::attn
