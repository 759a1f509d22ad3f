// The attention inputs of a tscale layer from its fused qkv product, in one pass: q and k RMS-normalised over the head
// dimension and rotated (RoPE), v copied, each written contiguous; and the backward of the same, written straight
// into the gradient of the qkv product.
//
// qkv_prep(qkv (B, T, 3, H, D) bf16, cos (T, D) fp32, sin (T, D) fp32, eps, norm, rope) -> q, k, v (B, T, H, D) bf16
//   x  = qkv[:, :, p] for p = 0 (q), 1 (k), in float32
//   xh = x / sqrt(mean(x^2) + eps) when norm, else x
//   y  = xh * cos[t] + roll(xh, D / 2) * sin[t] when rope, else xh      (t: the position inside the row of T)
//   out = bf16(y); v = qkv[:, :, 2]
// qkv_prep_backward(dq, dk, dv (B, T, H, D), qkv, cos, sin, eps, norm, rope) -> dqkv (B, T, 3, H, D) bf16
//   dxh = dy * cos[t] + roll(dy * sin[t], D / 2)                        (roll by D / 2 is its own inverse)
//   dx  = (dxh - xh * mean(dxh * xh)) / sqrt(mean(x^2) + eps) when norm, else dxh;  dqkv[:, :, 2] = dv
// The arithmetic of the model's own path (tscale.model.tscale_lm: F.rms_norm in float32 under autocast, then
// apply_rope) and of the reference twin, tscale/ops/qkv_prep.py.
//
// One warp per (token, head) row of D = 32 E elements: lane l holds elements [l E, l E + E), so the element D / 2
// away, RoPE's partner, sits in the same slot of lane l ^ 16. Bound by memory: each pass reads and writes every
// element once (3 D values in, 3 D out a row and head), nothing is kept between rows.
// The backend (warp shuffle, bf16 packing, launches) comes from the includer: csrc/attention/attention_cuda_backend.cuh
// in the CUDA build, tests/attention_emu/emu_backend.h in the CPU emulator of the tests.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

namespace tscale::qkv {
namespace {

using attn::bf16_to_float;
using attn::check_device;
using attn::DeviceScope;
using attn::launch_kernel;
using attn::pack_bf16;
using attn::warp_xor;

constexpr int kWarpsPerBlock = 8;

template <int W>
struct alignas(4 * W) Words {  // W words of two bf16 each: one vector load or store
  uint32_t w[W];
};

template <int E>
__device__ __forceinline__ void load_row(const uint32_t* row, int lane, float (&x)[E]) {
  const Words<E / 2> v = reinterpret_cast<const Words<E / 2>*>(row)[lane];
#pragma unroll
  for (int i = 0; i < E / 2; ++i) {
    x[2 * i] = bf16_to_float(static_cast<uint16_t>(v.w[i] & 0xFFFFu));
    x[2 * i + 1] = bf16_to_float(static_cast<uint16_t>(v.w[i] >> 16));
  }
}

template <int E>
__device__ __forceinline__ void store_row(uint32_t* row, int lane, const float (&y)[E]) {
  Words<E / 2> v;
#pragma unroll
  for (int i = 0; i < E / 2; ++i) v.w[i] = pack_bf16(y[2 * i], y[2 * i + 1]);
  reinterpret_cast<Words<E / 2>*>(row)[lane] = v;
}

template <int E>
__device__ __forceinline__ void copy_row(const uint32_t* from, uint32_t* to, int lane) {
  reinterpret_cast<Words<E / 2>*>(to)[lane] = reinterpret_cast<const Words<E / 2>*>(from)[lane];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int mask = 16; mask >= 1; mask /= 2) v += warp_xor(v, mask);
  return v;
}

// x -> x / sqrt(mean(x^2) + eps) over the warp's row; returns the factor
template <int E>
__device__ __forceinline__ float normalise(float (&x)[E], float eps) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < E; ++j) ss += x[j] * x[j];
  const float r = 1.0f / sqrtf(warp_sum(ss) / (32 * E) + eps);
#pragma unroll
  for (int j = 0; j < E; ++j) x[j] *= r;
  return r;
}

// The row's place: token (b, t) and head h of warp w; word offsets of its qkv part p and of its output rows.
struct RowAt {
  int64_t token, head, pos;
  __device__ __forceinline__ RowAt(int64_t w, int H, int T) : token(w / H), head(w % H), pos((w / H) % T) {}
  __device__ __forceinline__ int64_t in(int p, int H, int words) const { return ((token * 3 + p) * H + head) * words; }
  __device__ __forceinline__ int64_t out(int H, int words) const { return (token * H + head) * words; }
};

template <int E>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
qkv_prep_kernel(const uint32_t* qkv, const float* cos, const float* sin, uint32_t* q, uint32_t* k, uint32_t* v,
                int64_t rows, int H, int T, float eps, bool norm, bool rope) {
  constexpr int D = 32 * E, words = D / 2;
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= rows) return;  // the whole warp: every lane has the same w
  const RowAt at(w, H, T);
  uint32_t* outs[2] = {q, k};
  float xs[2][E];  // both rows loaded before either is worked on: their loads overlap
#pragma unroll
  for (int p = 0; p < 2; ++p) load_row<E>(qkv + at.in(p, H, words), lane, xs[p]);
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    float (&x)[E] = xs[p];
    if (norm) normalise<E>(x, eps);
    if (rope) {
      const float* c = cos + at.pos * D + lane * E;
      const float* s = sin + at.pos * D + lane * E;
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const float partner = warp_xor(x[j], 16);
        x[j] = x[j] * c[j] + partner * s[j];
      }
    }
    store_row<E>(outs[p] + at.out(H, words), lane, x);
  }
  copy_row<E>(qkv + at.in(2, H, words), v + at.out(H, words), lane);
}

template <int E>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
qkv_prep_backward_kernel(const uint32_t* dq, const uint32_t* dk, const uint32_t* dv, const uint32_t* qkv,
                         const float* cos, const float* sin, uint32_t* dqkv, int64_t rows, int H, int T, float eps,
                         bool norm, bool rope) {
  constexpr int D = 32 * E, words = D / 2;
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= rows) return;
  const RowAt at(w, H, T);
  const uint32_t* grads[2] = {dq, dk};
  float gs[2][E], xs[2][E];  // every row this warp reads, loaded before any is worked on: the loads overlap
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    load_row<E>(grads[p] + at.out(H, words), lane, gs[p]);
    if (norm) load_row<E>(qkv + at.in(p, H, words), lane, xs[p]);
  }
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    float (&g)[E] = gs[p];
    if (rope) {  // through the rotation: dy cos + roll(dy sin, D / 2)
      const float* c = cos + at.pos * D + lane * E;
      const float* s = sin + at.pos * D + lane * E;
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const float partner = warp_xor(g[j] * s[j], 16);
        g[j] = g[j] * c[j] + partner;
      }
    }
    if (norm) {  // through the normalisation, its factor recomputed from the input row
      float (&x)[E] = xs[p];
      const float r = normalise<E>(x, eps);
      float dot = 0.f;
#pragma unroll
      for (int j = 0; j < E; ++j) dot += g[j] * x[j];
      const float mean = warp_sum(dot) / D;
#pragma unroll
      for (int j = 0; j < E; ++j) g[j] = r * (g[j] - x[j] * mean);
    }
    store_row<E>(dqkv + at.in(p, H, words), lane, g);
  }
  copy_row<E>(dv + at.out(H, words), dqkv + at.in(2, H, words), lane);
}

// ---- host side ----

struct Shape {
  int64_t B, T, H, D;
};

Shape check_qkv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const char* op) {
  check_device(qkv, op, "qkv");
  check_device(cos, op, "cos");
  check_device(sin, op, "sin");
  TORCH_CHECK(qkv.dim() == 5 && qkv.size(2) == 3, op, ": qkv must be (B, T, 3, H, D), got ", qkv.sizes());
  TORCH_CHECK(qkv.scalar_type() == at::kBFloat16 && qkv.is_contiguous(), op, ": qkv must be contiguous bf16");
  const Shape s{qkv.size(0), qkv.size(1), qkv.size(3), qkv.size(4)};
  TORCH_CHECK(s.D == 64 || s.D == 128, op, ": head dimension ", s.D, " (the kernel takes 64 or 128)");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 && t->size(0) == s.T &&
                    t->size(1) == s.D,
                op, ": cos and sin must be contiguous float32 (T, D) = (", s.T, ", ", s.D, "), got ", t->sizes());
  return s;
}

// One warp a (token, head) row: the kernel for s.D with the pointers first, then rows, H, T, eps, norm, rope.
template <typename Kernel, typename... Pointers>
void launch_rows(Kernel k64, Kernel k128, const Shape& s, double eps, bool norm, bool rope, Pointers... pointers) {
  const int64_t rows = s.B * s.T * s.H;
  if (rows == 0) return;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "qkv_prep: too many rows (", rows, ")");
  launch_kernel(s.D == 64 ? k64 : k128, dim3(static_cast<unsigned>(blocks)), dim3(32 * kWarpsPerBlock), 0,
                pointers..., rows, static_cast<int>(s.H), static_cast<int>(s.T), static_cast<float>(eps), norm, rope);
}

const uint32_t* words_of(const at::Tensor& t) { return reinterpret_cast<const uint32_t*>(t.data_ptr()); }
uint32_t* words_of_mut(at::Tensor& t) { return reinterpret_cast<uint32_t*>(t.data_ptr()); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_prep_host(const at::Tensor& qkv, const at::Tensor& cos,
                                                             const at::Tensor& sin, double eps, bool norm, bool rope) {
  const Shape s = check_qkv(qkv, cos, sin, "qkv_prep");
  DeviceScope scope(qkv);
  auto q = at::empty({s.B, s.T, s.H, s.D}, qkv.options());
  auto k = at::empty_like(q), v = at::empty_like(q);
  launch_rows(&qkv_prep_kernel<2>, &qkv_prep_kernel<4>, s, eps, norm, rope, words_of(qkv), cos.data_ptr<float>(),
              sin.data_ptr<float>(), words_of_mut(q), words_of_mut(k), words_of_mut(v));
  return {q, k, v};
}

at::Tensor qkv_prep_backward_host(const at::Tensor& dq_in, const at::Tensor& dk_in, const at::Tensor& dv_in,
                                  const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, double eps,
                                  bool norm, bool rope) {
  const Shape s = check_qkv(qkv, cos, sin, "qkv_prep_backward");
  DeviceScope scope(qkv);
  const at::Tensor dq = dq_in.contiguous(), dk = dk_in.contiguous(), dv = dv_in.contiguous();
  for (const at::Tensor* t : {&dq, &dk, &dv}) {
    check_device(*t, "qkv_prep_backward", "the gradients");
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->sizes() == at::IntArrayRef({s.B, s.T, s.H, s.D}),
                "qkv_prep_backward: gradients must be bf16 (B, T, H, D), got ", t->sizes());
  }
  auto dqkv = at::empty_like(qkv);
  launch_rows(&qkv_prep_backward_kernel<2>, &qkv_prep_backward_kernel<4>, s, eps, norm, rope, words_of(dq),
              words_of(dk), words_of(dv), words_of(qkv), cos.data_ptr<float>(), sin.data_ptr<float>(),
              words_of_mut(dqkv));
  return dqkv;
}

}  // namespace
}  // namespace tscale::qkv
