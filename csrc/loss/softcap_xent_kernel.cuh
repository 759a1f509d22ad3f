// The head's cross-entropy kernel and its host entry, written against a backend of a few primitives.
//
// softcap_xent_grad_host(logits, targets, vocab_size, softcap, scale) -> (losses, grad): see softcap_xent.cpp.
// The backend, included first, defines in namespace tscale::xent: Vec8 (16 bytes, 8 bf16), load_cached / store_cached
// (global memory, read again soon), load_streaming / store_streaming (read or written for the last time), unpack8 /
// pack8 (bf16 <-> float), fast_exp2, fast_log2, fast_rcp, warp_xor, TSCALE_XENT_DYNAMIC_SMEM, check_device,
// DeviceScope and launch_kernel. The CUDA build takes softcap_xent_cuda_backend.cuh; tests/loss_emu
// runs this very source on a CPU emulator.
//
// One block of 512 threads per row, at least two blocks a multiprocessor (64 registers a thread at most). Pass 1
// reads the row and sums exp(z - ref); a block reduction gives the logsumexp; pass 2 reads the row again and
// writes its gradient. Two blocks a multiprocessor keep about 2 x 132 rows of 100 KB in flight on an H200 (2 x
// 128 on a 4090), well inside L2, so pass 2's reads come from L2 and DRAM sees one read and one write of the
// logits: a training step's 32,768 x 50,304 are 3.3 GB each way. One block overlaps its pass 1 with the other's
// pass 2. (Holding the row in registers instead, 128 a thread, allowed one block a multiprocessor whose loads,
// arithmetic and stores took turns.)
//
// The arithmetic is in base 2: zl = z log2(e). With the soft-cap c, |z| < c, so pass 1 sums 2^(zl - c log2 e)
// without a running maximum (every term lies in (e^-2c, 1], normal floats while c <= kFixedRefMaxCap); tanh is
// written with one exponential and one reciprocal: tanh(y) = 1 - 2 / (exp(2y) + 1), so a capped value costs three
// special-function operations in pass 1. Pass 1 then also stashes each term e = 2^(zl - c log2 e) as bf16 in the
// gradient's own memory, and pass 2 reads the stash instead of the logits: the softmax is e 2^(c log2 e - lse), and
// t = tanh(x / c) = 1 + log2(e) / (c log2 e), so 1 - t^2 costs one logarithm instead of a tanh and an exponential
// (three special-function operations become one). The stash's rounding (2^-9 relative) moves t by less than 1e-4;
// the two terms where that matters are computed from the logits as before: the target's (softmax - 1 cancels) and
// those with t > kStashMaxTanh (1 - t^2 small). (Moving the softmax's exponential to a polynomial on the FMA pipe
// made the kernel slower, not faster: docs/BENCHMARKS.md.)
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <tuple>

namespace tscale::xent {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kFixedRefMaxCap = 40.f;  // 2^(-2 c log2 e) stays a normal float up to c ~ 43
constexpr float kStashMaxTanh = 0.95f;   // above it 1 - t^2 < 0.1: such terms are computed from the logits

// How many blocks share a multiprocessor, how many vectors of 8 a thread loads before using any of them, and
// whether a soft-capped row's pass 2 reads pass 1's stash (scripts/bench/head_loss_kernel.py times others: on the
// H200 each other split was within 4% of the default, none faster at both the soft-cap and without it).
template <int MinBlocks, int Batch, bool Stash = true>
struct Policy {
  static constexpr int kMinBlocks = MinBlocks, kBatch = Batch;
  static constexpr bool kStash = Stash;
};
using DefaultPolicy = Policy<2, 4>;

// One logit x in base 2: zl = z log2(e), and t = tanh(x / c) for the cap's derivative (kCap only).
template <bool kCap>
struct Capper {
  float a, cl;  // 2 log2(e) / c, c log2(e)
  __device__ __forceinline__ float operator()(float x, float& t) const {
    if constexpr (!kCap) return x * kLog2e;
    t = fmaf(-2.f, fast_rcp(fast_exp2(x * a) + 1.f), 1.f);
    return t * cl;
  }
};

struct SoftmaxState {
  float m, s;  // base-2 reference and sum of 2^(zl - m); (-inf, 0) before any value
};

constexpr size_t kSharedBytes = kWarps * sizeof(SoftmaxState);

__device__ __forceinline__ SoftmaxState merge(SoftmaxState a, SoftmaxState b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * fast_exp2(a.m - m) + b.s * fast_exp2(b.m - m)};
}

__device__ __forceinline__ SoftmaxState warp_merge(SoftmaxState st) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) st = merge(st, {warp_xor(st.m, off), warp_xor(st.s, off)});
  return st;
}

// The block's merged state, the same in every thread (part: kWarps states of shared memory).
__device__ SoftmaxState block_merge(SoftmaxState st, SoftmaxState* part) {
  st = warp_merge(st);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[warp] = st;
  __syncthreads();
  return warp_merge(lane < kWarps ? part[lane] : SoftmaxState{-INFINITY, 0.f});
}

// Pass 1 over one vector: with a fixed reference add 2^(zl - m) to s; without one keep (m, s) a running pair.
// e: the eight terms 2^(zl - m) (0 past the vocabulary).
template <bool kFixedRef, bool kCap>
__device__ __forceinline__ void accumulate(const Vec8& v, int first_col, int vocab, const Capper<kCap>& cap,
                                           SoftmaxState& st, float (&e)[8]) {
  float x[8], t;
  unpack8(v, x);
  const bool full = first_col + 8 <= vocab;
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = full || first_col + i < vocab ? cap(x[i], t) : -INFINITY;
  if constexpr (!kFixedRef) {
    float mv = x[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) mv = fmaxf(mv, x[i]);
    if (mv == -INFINITY) return;  // padding only
    if (mv > st.m) {
      st.s *= fast_exp2(st.m - mv);
      st.m = mv;
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = fast_exp2(x[i] - st.m);
  st.s += ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

// A thread's next kBatch vectors of the row, kThreads apart from base on (those past the row are left unset):
// kept in L2 for pass 2 on the first read, streamed on the last.
template <bool kLastRead, int kBatch>
__device__ __forceinline__ void load_batch(Vec8 (&vecs)[kBatch], const Vec8* in, int base, int row_vecs) {
#pragma unroll
  for (int k = 0; k < kBatch; ++k) {
    const int v = base + k * kThreads;
    if (v < row_vecs) vecs[k] = kLastRead ? load_streaming(in + v) : load_cached(in + v);
  }
}

template <class P, bool kCap, bool kFixedRef>
__global__ void __launch_bounds__(kThreads, P::kMinBlocks)
    softcap_xent_kernel(const Vec8* __restrict__ logits, const int64_t* __restrict__ targets,
                        float* __restrict__ losses, Vec8* __restrict__ grad, int row_vecs, int vocab, float softcap,
                        float scale) {
  TSCALE_XENT_DYNAMIC_SMEM(smem);
  const int64_t row = blockIdx.x;
  const Vec8* in = logits + row * row_vecs;
  Vec8* out = grad + row * row_vecs;
  const Capper<kCap> cap{kCap ? 2.f * kLog2e / softcap : 0.f, softcap * kLog2e};
  constexpr bool kStash = P::kStash && kCap && kFixedRef;  // pass 2 reads pass 1's terms, not the logits

  SoftmaxState st{kFixedRef ? cap.cl : -INFINITY, 0.f};
  for (int base = threadIdx.x; base < row_vecs; base += P::kBatch * kThreads) {
    Vec8 vecs[P::kBatch];
    load_batch</*kLastRead=*/kStash>(vecs, in, base, row_vecs);
#pragma unroll
    for (int k = 0; k < P::kBatch; ++k) {
      const int v = base + k * kThreads;
      if (v >= row_vecs) break;
      float e[8];
      accumulate<kFixedRef, kCap>(vecs[k], v * 8, vocab, cap, st, e);
      if constexpr (kStash) store_cached(out + v, pack8(e));
    }
  }
  st = block_merge(st, reinterpret_cast<SoftmaxState*>(smem));
  const float lse2 = st.m + fast_log2(st.s);  // base 2

  const int64_t y = targets[row];
  const bool valid = y >= 0 && y < vocab;
  if (threadIdx.x == 0) {
    float t, x[8];
    if (valid) unpack8(in[y / 8], x);
    losses[row] = valid ? (lse2 - cap(x[y % 8], t)) * kLn2 : NAN;
  }
  const int y_vec = valid ? static_cast<int>(y / 8) : -1, y_lane = static_cast<int>(y & 7);
  // the stash: softmax = e 2^(m - lse2); w = log2(e) / (c log2 e) = t - 1, so 1 - t^2 = -w (w + 2)
  const float to_softmax = kStash ? fast_exp2(st.m - lse2) : 0.f, per_cl = kStash ? 1.f / cap.cl : 0.f;
  const float exact_above = kStash ? fast_exp2((kStashMaxTanh - 1.f) * cap.cl) : 0.f;  // e at t = kStashMaxTanh
  for (int base = threadIdx.x; base < row_vecs; base += P::kBatch * kThreads) {
    Vec8 vecs[P::kBatch];
    load_batch</*kLastRead=*/true>(vecs, kStash ? out : in, base, row_vecs);
#pragma unroll
    for (int k = 0; k < P::kBatch; ++k) {
      const int v = base + k * kThreads;
      if (v >= row_vecs) break;
      float x[8];
      unpack8(vecs[k], x);
      const bool full = v * 8 + 8 <= vocab, has_y = v == y_vec;
      if constexpr (kStash) {
        bool exact = has_y;
#pragma unroll
        for (int i = 0; i < 8; ++i) exact |= x[i] > exact_above;
        if (!exact) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float w = fast_log2(x[i]) * per_cl;
            x[i] = full || v * 8 + i < vocab ? x[i] * to_softmax * (-w * (w + 2.f)) * scale : 0.f;
          }
          store_streaming(out + v, pack8(x));
          continue;
        }
        unpack8(load_streaming(in + v), x);  // the vector of the target or of a term near the cap: from the logits
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float t = 0.f;
        float g = fast_exp2(cap(x[i], t) - lse2);
        if (has_y && i == y_lane) g -= 1.f;
        if constexpr (kCap) g *= fmaf(-t, t, 1.f);
        x[i] = full || v * 8 + i < vocab ? g * scale : 0.f;
      }
      store_streaming(out + v, pack8(x));
    }
  }
}

template <class P>
void launch_rows(const at::Tensor& logits, const at::Tensor& targets, at::Tensor& losses, at::Tensor& grad, int vocab,
                 float softcap, float scale) {
  const int row_vecs = static_cast<int>(logits.size(1) / 8);
  auto* kernel = softcap == 0.f                ? softcap_xent_kernel<P, false, false>
                 : softcap <= kFixedRefMaxCap ? softcap_xent_kernel<P, true, true>
                                              : softcap_xent_kernel<P, true, false>;
  launch_kernel(kernel, dim3(static_cast<unsigned>(logits.size(0))), dim3(kThreads), kSharedBytes,
                reinterpret_cast<const Vec8*>(logits.data_ptr()), targets.data_ptr<int64_t>(),
                losses.data_ptr<float>(), reinterpret_cast<Vec8*>(grad.data_ptr()), row_vecs, vocab, softcap, scale);
}

// The op under any policy (benchmarks instantiate others; the op registers DefaultPolicy's).
template <class P>
std::tuple<at::Tensor, at::Tensor> softcap_xent_grad_with(const at::Tensor& logits, const at::Tensor& targets,
                                                          int64_t vocab_size, double softcap, double scale) {
  check_device(logits, "logits");
  check_device(targets, "targets");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 && logits.dim() == 2,
              "softcap_xent_grad: logits must be a bf16 matrix (N, V_padded), got ", logits.scalar_type(), " of ",
              logits.sizes());
  TORCH_CHECK(logits.is_contiguous(), "softcap_xent_grad: logits must be contiguous");
  const int64_t rows = logits.size(0), cols = logits.size(1);
  TORCH_CHECK(cols % 8 == 0 && cols < (int64_t{1} << 31), "softcap_xent_grad: V_padded must be a multiple of 8 below ",
              "2^31, got ", cols);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 == 0,
              "softcap_xent_grad: logits must be 16-byte aligned");
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= cols, "softcap_xent_grad: vocab_size ", vocab_size,
              " must be in [1, ", cols, "]");
  TORCH_CHECK(softcap >= 0, "softcap_xent_grad: softcap must be >= 0, got ", softcap);
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.dim() == 1 && targets.size(0) == rows &&
                  targets.device() == logits.device(),
              "softcap_xent_grad: targets must be int64 (N,) on the logits' device, got ", targets.scalar_type(), " of ",
              targets.sizes());
  TORCH_CHECK(rows < (int64_t{1} << 31), "softcap_xent_grad: at most 2^31 - 1 rows");
  const DeviceScope scope(logits);
  const at::Tensor y = targets.contiguous();
  at::Tensor losses = at::empty({rows}, logits.options().dtype(at::kFloat));
  at::Tensor grad = at::empty_like(logits);
  if (rows == 0) return {losses, grad};
  launch_rows<P>(logits, y, losses, grad, static_cast<int>(vocab_size), static_cast<float>(softcap),
                 static_cast<float>(scale));
  return {losses, grad};
}

std::tuple<at::Tensor, at::Tensor> softcap_xent_grad_host(const at::Tensor& logits, const at::Tensor& targets,
                                                          int64_t vocab_size, double softcap, double scale) {
  return softcap_xent_grad_with<DefaultPolicy>(logits, targets, vocab_size, softcap, scale);
}

}  // namespace
}  // namespace tscale::xent
