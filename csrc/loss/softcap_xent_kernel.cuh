// The head's cross-entropy kernel and its host entry, written against a backend of a few primitives.
//
// softcap_xent_grad_host(logits, targets, vocab_size, softcap, scale) -> (losses, grad): see softcap_xent.cpp.
// The backend, included first, defines in namespace tscale::xent: Vec8 (16 bytes, 8 bf16), load_streaming /
// store_streaming (global memory, read or written once), unpack8 / pack8 (bf16 <-> float), fast_exp, fast_log,
// warp_xor, TSCALE_XENT_DYNAMIC_SMEM, check_device, DeviceScope and launch_kernel. The CUDA build takes
// softcap_xent_cuda_backend.cuh; tests/loss_emu runs this very source on a CPU emulator.
//
// One block of 512 threads per row. Each thread loads its share of the row (up to 16 vectors of
// 8 bf16, 16 bytes each) into registers once; pass 1 turns them into the row's running max and
// sum of exponentials (online softmax, one rescale per vector), a block reduction gives the
// logsumexp; pass 2 rebuilds each value from the registers and writes its gradient. DRAM sees one
// read and one write of the row: a training step's 32,768 x 50,304 logits are 3.3 GB each way.
// The soft-cap's tanh is written with one exponential: tanh(y) = 1 - 2 / (exp(2y) + 1).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <tuple>

namespace tscale::xent {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxVecs = 16;  // vectors of 8 per thread: rows up to 512 * 16 * 8 = 65,536 columns

struct SoftmaxState {
  float m, s;  // running max and sum of exp(z - m); (-inf, 0) before any value
};

constexpr size_t kSharedBytes = kWarps * sizeof(SoftmaxState);

__device__ __forceinline__ SoftmaxState merge(SoftmaxState a, SoftmaxState b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * fast_exp(a.m - m) + b.s * fast_exp(b.m - m)};
}

__device__ __forceinline__ float tanh_exp(float y) { return 1.f - 2.f / (fast_exp(2.f * y) + 1.f); }

// z of one logit and, through t, what its derivative needs (t = tanh(x / softcap); unused without the cap).
__device__ __forceinline__ float capped(float x, float softcap, float inv_cap, float& t) {
  if (softcap == 0.f) return x;
  t = tanh_exp(x * inv_cap);
  return softcap * t;
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

template <int kVecs>
__global__ void __launch_bounds__(kThreads) softcap_xent_kernel(const Vec8* __restrict__ logits,
                                                                const int64_t* __restrict__ targets,
                                                                float* __restrict__ losses, Vec8* __restrict__ grad,
                                                                int row_vecs, int vocab, float softcap, float scale) {
  TSCALE_XENT_DYNAMIC_SMEM(smem);
  const int64_t row = blockIdx.x;
  const Vec8* in = logits + row * row_vecs;
  Vec8* out = grad + row * row_vecs;
  const float inv_cap = softcap == 0.f ? 0.f : 1.f / softcap;

  Vec8 cache[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int v = threadIdx.x + k * kThreads;
    if (v < row_vecs) cache[k] = load_streaming(in + v);
  }
  SoftmaxState st{-INFINITY, 0.f};
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int v = threadIdx.x + k * kThreads;
    if (v >= row_vecs) break;
    float x[8], t;
    unpack8(cache[k], x);
    float mv = -INFINITY;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = v * 8 + i < vocab ? capped(x[i], softcap, inv_cap, t) : -INFINITY;
      mv = fmaxf(mv, x[i]);
    }
    if (mv == -INFINITY) continue;  // padding only
    if (mv > st.m) {
      st.s *= fast_exp(st.m - mv);
      st.m = mv;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) st.s += fast_exp(x[i] - st.m);
  }
  st = block_merge(st, reinterpret_cast<SoftmaxState*>(smem));
  const float lse = st.m + fast_log(st.s);

  const int64_t y = targets[row];
  const bool valid = y >= 0 && y < vocab;
  if (threadIdx.x == 0) {
    float t, x[8];
    if (valid) unpack8(in[y / 8], x);
    losses[row] = valid ? lse - capped(x[y % 8], softcap, inv_cap, t) : NAN;
  }
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int v = threadIdx.x + k * kThreads;
    if (v >= row_vecs) break;
    float x[8];
    unpack8(cache[k], x);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = v * 8 + i;
      float t = 0.f;
      const float z = capped(x[i], softcap, inv_cap, t);
      float g = fast_exp(z - lse) - (j == y ? 1.f : 0.f);
      if (softcap != 0.f) g *= 1.f - t * t;
      x[i] = j < vocab ? g * scale : 0.f;
    }
    store_streaming(out + v, pack8(x));
  }
}

template <int kVecs>
void launch_rows(const at::Tensor& logits, const at::Tensor& targets, at::Tensor& losses, at::Tensor& grad, int vocab,
                 float softcap, float scale) {
  const int row_vecs = static_cast<int>(logits.size(1) / 8);
  launch_kernel(softcap_xent_kernel<kVecs>, dim3(static_cast<unsigned>(logits.size(0))), dim3(kThreads), kSharedBytes,
                reinterpret_cast<const Vec8*>(logits.data_ptr()), targets.data_ptr<int64_t>(),
                losses.data_ptr<float>(), reinterpret_cast<Vec8*>(grad.data_ptr()), row_vecs, vocab, softcap, scale);
}

std::tuple<at::Tensor, at::Tensor> softcap_xent_grad_host(const at::Tensor& logits, const at::Tensor& targets,
                                                          int64_t vocab_size, double softcap, double scale) {
  check_device(logits, "logits");
  check_device(targets, "targets");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 && logits.dim() == 2,
              "softcap_xent_grad: logits must be a bf16 matrix (N, V_padded), got ", logits.scalar_type(), " of ",
              logits.sizes());
  TORCH_CHECK(logits.is_contiguous(), "softcap_xent_grad: logits must be contiguous");
  const int64_t rows = logits.size(0), cols = logits.size(1);
  TORCH_CHECK(cols % 8 == 0 && cols <= int64_t{kThreads} * kMaxVecs * 8,
              "softcap_xent_grad: V_padded must be a multiple of 8 and at most ", kThreads * kMaxVecs * 8, ", got ",
              cols);
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
  const int per_thread = static_cast<int>((cols / 8 + kThreads - 1) / kThreads);
  const int v = static_cast<int>(vocab_size);
  const float c = static_cast<float>(softcap), s = static_cast<float>(scale);
  if (per_thread <= 1) launch_rows<1>(logits, y, losses, grad, v, c, s);
  else if (per_thread <= 2) launch_rows<2>(logits, y, losses, grad, v, c, s);
  else if (per_thread <= 4) launch_rows<4>(logits, y, losses, grad, v, c, s);
  else if (per_thread <= 8) launch_rows<8>(logits, y, losses, grad, v, c, s);
  else launch_rows<16>(logits, y, losses, grad, v, c, s);
  return {losses, grad};
}

}  // namespace
}  // namespace tscale::xent
