// Sign bit-packing for 1-bit gradient compression (CPU kernels and op schemas).
//
// pack_signs(x, chunk)   x: float32 (N,), chunk % 8 == 0
//   -> bits   uint8 (ceil(N/8),)  bit j of byte i is 1 iff x[8i+j] >= 0
//      scales float32 (ceil(N/chunk),)  mean |x| over each chunk
// unpack_signs(bits, scales, N, chunk) -> float32 (N,) = scale[i/chunk] * (bit ? +1 : -1)
// unpack_signs_accumulate_(out, bits, scales, chunk): out += unpack_signs(...)
// pack_signs_feedback_(x, chunk) -> (bits, scales) of pack_signs, and in place
//   x -= unpack_signs(bits, scales): what the signs failed to carry (error feedback). CPU only;
//   on other devices tscale/ops/bitpack.py composes pack_signs and unpack_signs_accumulate_.
// pack_signs_feedback_add_(x, add, chunk): x[:len(add)] += add, then pack_signs_feedback_(x, chunk),
//   in the same pass (a residual plus this step's values, packed). CPU only, as above.
// unpack_signs_into_(out, bits, scales, chunk): out = unpack_signs(...), written without reading
//   out. CPU only; elsewhere tscale/ops/bitpack.py zeroes out and accumulates.
//
// Chunks are whole bytes, so every chunk is packed and unpacked independently (one OpenMP
// task per chunk), and a chunk is small enough to stay in L1 between packing it and subtracting
// its decoded signs. The reference twin is tscale/ops/bitpack.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "bitpack_checks.h"
#include "sign_pack.h"

#include <algorithm>
#include <cstdint>

namespace tscale {
namespace {

// ap (an values, an <= n) is added into xp first, chunk by chunk, when given.
std::tuple<at::Tensor, at::Tensor> pack_into(float* xp, int64_t n, int64_t chunk, const at::TensorOptions& opts,
                                             bool feedback, const float* ap = nullptr, int64_t an = 0) {
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  at::Tensor bits = at::empty({(n + 7) / 8}, opts.dtype(at::kByte));
  at::Tensor scales = at::empty({n_chunks}, opts);
  uint8_t* bp = bits.data_ptr<uint8_t>();
  float* sp = scales.data_ptr<float>();
  at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
      for (int64_t i = lo, end = std::min(hi, an); i < end; ++i) xp[i] += ap[i];
      sp[c] = sign_pack::pack_chunk(xp, bp, lo, hi, feedback);
    }
  });
  return {bits, scales};
}

std::tuple<at::Tensor, at::Tensor> pack_signs_cpu(const at::Tensor& x_in, int64_t chunk) {
  check_pack_args(x_in, chunk);
  const at::Tensor x = x_in.contiguous();
  return pack_into(const_cast<float*>(x.data_ptr<float>()), x.numel(), chunk, x.options(), false);
}

std::tuple<at::Tensor, at::Tensor> pack_signs_feedback_cpu(at::Tensor& x, int64_t chunk) {
  check_pack_args(x, chunk);
  TORCH_CHECK(x.is_contiguous(), "pack_signs_feedback_: x must be contiguous (it is updated in place)");
  return pack_into(x.data_ptr<float>(), x.numel(), chunk, x.options(), true);
}

std::tuple<at::Tensor, at::Tensor> pack_signs_feedback_add_cpu(at::Tensor& x, const at::Tensor& add_in, int64_t chunk) {
  check_pack_args(x, chunk);
  TORCH_CHECK(x.is_contiguous(), "pack_signs_feedback_add_: x must be contiguous (it is updated in place)");
  TORCH_CHECK(add_in.dim() == 1 && add_in.scalar_type() == at::kFloat && add_in.device() == x.device(),
              "pack_signs_feedback_add_: add must be 1-D float32 on x's device");
  TORCH_CHECK(add_in.numel() <= x.numel(), "pack_signs_feedback_add_: add has ", add_in.numel(),
              " values, more than x's ", x.numel());
  const at::Tensor add = add_in.contiguous();
  return pack_into(x.data_ptr<float>(), x.numel(), chunk, x.options(), true, add.data_ptr<float>(), add.numel());
}

// kSigns[b][j] = +1 if bit j of byte b is set, else -1: a byte decodes to eight floats with one
// row read and a multiply, which the compiler vectorises (a per-bit shift-and-branch did not).
struct SignTable {
  float v[256][8];
  SignTable() {
    for (int b = 0; b < 256; ++b)
      for (int j = 0; j < 8; ++j) v[b][j] = ((b >> j) & 1) ? 1.f : -1.f;
  }
};
const SignTable kSigns;

template <bool Accumulate>
void unpack_chunk(const uint8_t* bp, float s, float* op, int64_t lo, int64_t hi) {
  int64_t i = lo;  // lo is a multiple of chunk, so of 8: whole bytes
  for (; i + 8 <= hi; i += 8) {
    const float* t = kSigns.v[bp[i >> 3]];
    float* o = op + i;
    for (int j = 0; j < 8; ++j) o[j] = Accumulate ? o[j] + s * t[j] : s * t[j];
  }
  for (; i < hi; ++i) {
    const float v = ((bp[i >> 3] >> (i & 7)) & 1) ? s : -s;
    op[i] = Accumulate ? op[i] + v : v;
  }
}

void unpack_into(const at::Tensor& bits_in, const at::Tensor& scales_in, at::Tensor& out, int64_t chunk, bool accumulate) {
  const at::Tensor bits = bits_in.contiguous();
  const at::Tensor scales = scales_in.contiguous();
  const int64_t n = out.numel();
  const uint8_t* bp = bits.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t n_chunks = scales.numel();
  at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
      if (accumulate)
        unpack_chunk<true>(bp, sp[c], op, lo, hi);
      else
        unpack_chunk<false>(bp, sp[c], op, lo, hi);
    }
  });
}

at::Tensor unpack_signs_cpu(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t chunk) {
  check_unpack_args(bits, scales, n, chunk);
  at::Tensor out = at::empty({n}, scales.options());
  unpack_into(bits, scales, out, chunk, false);
  return out;
}

void unpack_signs_accumulate_cpu(at::Tensor& out, const at::Tensor& bits, const at::Tensor& scales, int64_t chunk) {
  check_accumulate_out(out, bits, "unpack_signs_accumulate_");
  check_unpack_args(bits, scales, out.numel(), chunk);
  unpack_into(bits, scales, out, chunk, true);
}

void unpack_signs_into_cpu(at::Tensor& out, const at::Tensor& bits, const at::Tensor& scales, int64_t chunk) {
  check_accumulate_out(out, bits, "unpack_signs_into_");
  check_unpack_args(bits, scales, out.numel(), chunk);
  unpack_into(bits, scales, out, chunk, false);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("pack_signs(Tensor x, int chunk) -> (Tensor, Tensor)");
  m.def("unpack_signs(Tensor bits, Tensor scales, int numel, int chunk) -> Tensor");
  m.def("unpack_signs_accumulate_(Tensor(a!) out, Tensor bits, Tensor scales, int chunk) -> ()");
  m.def("pack_signs_feedback_(Tensor(a!) x, int chunk) -> (Tensor, Tensor)");
  m.def("pack_signs_feedback_add_(Tensor(a!) x, Tensor add, int chunk) -> (Tensor, Tensor)");
  m.def("unpack_signs_into_(Tensor(a!) out, Tensor bits, Tensor scales, int chunk) -> ()");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("pack_signs", &pack_signs_cpu);
  m.impl("unpack_signs", &unpack_signs_cpu);
  m.impl("unpack_signs_accumulate_", &unpack_signs_accumulate_cpu);
  m.impl("pack_signs_feedback_", &pack_signs_feedback_cpu);
  m.impl("pack_signs_feedback_add_", &pack_signs_feedback_add_cpu);
  m.impl("unpack_signs_into_", &unpack_signs_into_cpu);
}

}  // namespace tscale
