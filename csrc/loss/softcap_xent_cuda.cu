// The head's cross-entropy and its gradient in one pass over bf16 logits (schema: softcap_xent.cpp).
//
// One block of 512 threads per row. Each thread loads its share of the row (up to 16 vectors of
// 8 bf16, 16 bytes each) into registers once; pass 1 turns them into the row's running max and
// sum of exponentials (online softmax, one rescale per vector), a block reduction gives the
// logsumexp; pass 2 rebuilds each value from the registers and writes its gradient. DRAM sees one
// read and one write of the row: a training step's 32,768 x 50,304 logits are 3.3 GB each way.
// The soft-cap's tanh is written with one exponential: tanh(y) = 1 - 2 / (exp(2y) + 1).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <torch/library.h>

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

__device__ __forceinline__ SoftmaxState merge(SoftmaxState a, SoftmaxState b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float tanh_exp(float y) { return 1.f - 2.f / (__expf(2.f * y) + 1.f); }

// z of one logit and, through t, what its derivative needs (t = tanh(x / softcap); unused without the cap).
__device__ __forceinline__ float capped(float x, float softcap, float inv_cap, float& t) {
  if (softcap == 0.f) return x;
  t = tanh_exp(x * inv_cap);
  return softcap * t;
}

// The block's merged state, the same in every thread.
__device__ SoftmaxState block_merge(SoftmaxState st) {
  __shared__ SoftmaxState part[kWarps];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    st = merge(st, {__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off)});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[warp] = st;
  __syncthreads();
  st = lane < kWarps ? part[lane] : SoftmaxState{-INFINITY, 0.f};
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    st = merge(st, {__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.s, off)});
  return st;
}

template <int kVecs>
__global__ void __launch_bounds__(kThreads) softcap_xent_kernel(const uint4* __restrict__ logits,
                                                                const int64_t* __restrict__ targets,
                                                                float* __restrict__ losses, uint4* __restrict__ grad,
                                                                int row_vecs, int vocab, float softcap, float scale) {
  const int64_t row = blockIdx.x;
  const uint4* in = logits + row * row_vecs;
  uint4* out = grad + row * row_vecs;
  const float inv_cap = softcap == 0.f ? 0.f : 1.f / softcap;

  uint4 cache[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int v = threadIdx.x + k * kThreads;
    if (v < row_vecs) cache[k] = __ldcs(in + v);
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
      st.s *= __expf(st.m - mv);
      st.m = mv;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) st.s += __expf(x[i] - st.m);
  }
  st = block_merge(st);
  const float lse = st.m + __logf(st.s);

  const int64_t y = targets[row];
  const bool valid = y >= 0 && y < vocab;
  if (threadIdx.x == 0) {
    float t;
    const float xy = valid ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(in)[y]) : 0.f;
    losses[row] = valid ? lse - capped(xy, softcap, inv_cap, t) : NAN;
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
      float g = __expf(z - lse) - (j == y ? 1.f : 0.f);
      if (softcap != 0.f) g *= 1.f - t * t;
      x[i] = j < vocab ? g * scale : 0.f;
    }
    __stcs(out + v, pack8(x));
  }
}

template <int kVecs>
void launch(const at::Tensor& logits, const at::Tensor& targets, at::Tensor& losses, at::Tensor& grad, int vocab,
            float softcap, float scale) {
  const int64_t rows = logits.size(0);
  const int row_vecs = static_cast<int>(logits.size(1) / 8);
  softcap_xent_kernel<kVecs><<<static_cast<unsigned>(rows), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint4*>(logits.data_ptr()), targets.data_ptr<int64_t>(), losses.data_ptr<float>(),
      reinterpret_cast<uint4*>(grad.data_ptr()), row_vecs, vocab, softcap, scale);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> softcap_xent_grad_cuda(const at::Tensor& logits, const at::Tensor& targets,
                                                          int64_t vocab_size, double softcap, double scale) {
  TORCH_CHECK(logits.is_cuda() && logits.scalar_type() == at::kBFloat16 && logits.dim() == 2,
              "softcap_xent_grad: logits must be a bf16 CUDA matrix (N, V_padded), got ", logits.scalar_type(),
              " of ", logits.sizes());
  TORCH_CHECK(logits.is_contiguous(), "softcap_xent_grad: logits must be contiguous");
  const int64_t rows = logits.size(0), cols = logits.size(1);
  TORCH_CHECK(cols % 8 == 0 && cols <= int64_t{kThreads} * kMaxVecs * 8,
              "softcap_xent_grad: V_padded must be a multiple of 8 and at most ", kThreads * kMaxVecs * 8, ", got ",
              cols);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 == 0, "softcap_xent_grad: logits must be 16-byte "
              "aligned");
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= cols, "softcap_xent_grad: vocab_size ", vocab_size,
              " must be in [1, ", cols, "]");
  TORCH_CHECK(softcap >= 0, "softcap_xent_grad: softcap must be >= 0, got ", softcap);
  TORCH_CHECK(targets.is_cuda() && targets.scalar_type() == at::kLong && targets.dim() == 1 &&
                  targets.size(0) == rows,
              "softcap_xent_grad: targets must be int64 (N,) on the logits' device, got ", targets.scalar_type(), " of ",
              targets.sizes());
  TORCH_CHECK(rows < (int64_t{1} << 31), "softcap_xent_grad: at most 2^31 - 1 rows");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor y = targets.contiguous();
  at::Tensor losses = at::empty({rows}, logits.options().dtype(at::kFloat));
  at::Tensor grad = at::empty_like(logits);
  if (rows == 0) return {losses, grad};
  const int per_thread = static_cast<int>((cols / 8 + kThreads - 1) / kThreads);
  const int v = static_cast<int>(vocab_size);
  const float c = static_cast<float>(softcap), s = static_cast<float>(scale);
  if (per_thread <= 1) launch<1>(logits, y, losses, grad, v, c, s);
  else if (per_thread <= 2) launch<2>(logits, y, losses, grad, v, c, s);
  else if (per_thread <= 4) launch<4>(logits, y, losses, grad, v, c, s);
  else if (per_thread <= 8) launch<8>(logits, y, losses, grad, v, c, s);
  else launch<16>(logits, y, losses, grad, v, c, s);
  return {losses, grad};
}

}  // namespace
}  // namespace tscale::xent

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("softcap_xent_grad", &tscale::xent::softcap_xent_grad_cuda); }
