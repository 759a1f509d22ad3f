// Sign bit-packing for 1-bit gradient compression (CPU kernels and op schemas).
//
// pack_signs(x, chunk)   x: float32 (N,), chunk % 8 == 0
//   -> bits   uint8 (ceil(N/8),)  bit j of byte i is 1 iff x[8i+j] >= 0
//      scales float32 (ceil(N/chunk),)  mean |x| over each chunk
// unpack_signs(bits, scales, N, chunk) -> float32 (N,) = scale[i/chunk] * (bit ? +1 : -1)
// unpack_signs_accumulate_(out, bits, scales, chunk): out += unpack_signs(...)
//
// Chunks are whole bytes, so every chunk is packed and unpacked independently (one OpenMP
// task per chunk). The reference twin is tscale/ops/bitpack.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "bitpack_checks.h"

#include <cmath>
#include <cstdint>

namespace tscale {
namespace {

std::tuple<at::Tensor, at::Tensor> pack_signs_cpu(const at::Tensor& x_in, int64_t chunk) {
  check_pack_args(x_in, chunk);
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  at::Tensor bits = at::empty({(n + 7) / 8}, x.options().dtype(at::kByte));
  at::Tensor scales = at::empty({n_chunks}, x.options());
  const float* xp = x.data_ptr<float>();
  uint8_t* bp = bits.data_ptr<uint8_t>();
  float* sp = scales.data_ptr<float>();
  at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * chunk, hi = std::min(n, lo + chunk);
      double abs_sum = 0.0;
      for (int64_t i = lo; i < hi; i += 8) {
        uint8_t byte = 0;
        const int64_t end = std::min(hi, i + 8);
        for (int64_t j = i; j < end; ++j) {
          const float v = xp[j];
          abs_sum += std::fabs(v);
          byte |= static_cast<uint8_t>(v >= 0.f) << (j - i);
        }
        bp[i / 8] = byte;
      }
      sp[c] = static_cast<float>(abs_sum / static_cast<double>(hi - lo));
    }
  });
  return {bits, scales};
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
  check_accumulate_out(out, bits);
  check_unpack_args(bits, scales, out.numel(), chunk);
  unpack_into(bits, scales, out, chunk, true);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("pack_signs(Tensor x, int chunk) -> (Tensor, Tensor)");
  m.def("unpack_signs(Tensor bits, Tensor scales, int numel, int chunk) -> Tensor");
  m.def("unpack_signs_accumulate_(Tensor(a!) out, Tensor bits, Tensor scales, int chunk) -> ()");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("pack_signs", &pack_signs_cpu);
  m.impl("unpack_signs", &unpack_signs_cpu);
  m.impl("unpack_signs_accumulate_", &unpack_signs_accumulate_cpu);
}

}  // namespace tscale
