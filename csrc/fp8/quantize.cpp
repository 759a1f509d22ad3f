// Fused quantize (amax + scale + cast, optionally also the transposed copy): the op schema and its CPU kernel.
//
// quantize(x, dtype, axis, transpose) -> (q, scale, q_t)
//   x      float32 / bfloat16 / float16 (M, K)
//   dtype  float8_e4m3fn (QMAX 448), float8_e5m2 (QMAX 57344) or int8 (QMAX 127)
//   axis   None: one scale, scale ()      -1 or 1: per row, scale (M, 1)      0: per column, scale (1, K)
//   q      (M, K) dtype = cast(x * (QMAX / amax)); fp8 saturates, int8 rounds half to even and clamps
//   scale  float32 amax / QMAX, amax floored at 1e-12 (an all-zero slice gives q = 0)
//   q_t    (K, M) = q transposed and contiguous when transpose, else an empty (0,) tensor
// quantize_delayed(x, dtype, state, transpose) -> (q, scale, q_t), one scale per tensor, CUDA only
//   state  int32 (history + 2,), zeros at first: the amax (float bits) of the last `history` calls on this
//          tensor, newest first, then two slots that are zero between calls
//   the scale is max(history) / QMAX (the first call, with an empty history, takes x's own amax), values
//          beyond it saturate; the call then shifts x's amax into the history
// The reference twins are quantize_reference and quantize_delayed_reference in tscale/ops/lowprec.py; both compute the inverse
// scale as one IEEE division and the scaled value as one multiply, so they agree bit for bit.
// The CUDA kernels are in quantize_cuda.cu.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

namespace tscale {
namespace {

constexpr float kAmaxFloor = 1e-12f;

enum class Mode { kTensor, kRows, kCols };

float qmax_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn: return 448.f;
    case at::kFloat8_e5m2: return 57344.f;
    case at::kChar: return 127.f;
    default: TORCH_CHECK(false, "quantize: dtype must be float8_e4m3fn, float8_e5m2 or int8, got ", t);
  }
  return 0.f;
}

Mode mode_of(std::optional<int64_t> axis) {
  if (!axis.has_value()) return Mode::kTensor;
  TORCH_CHECK(*axis == 0 || *axis == 1 || *axis == -1, "quantize: axis must be None, 0, 1 or -1, got ", *axis);
  return *axis == 0 ? Mode::kCols : Mode::kRows;
}

template <typename out_t>
inline out_t cast_to(float v, float qmax) {
  if constexpr (std::is_same_v<out_t, int8_t>) {
    return static_cast<int8_t>(std::min(std::max(std::nearbyint(v), -qmax), qmax));
  } else {
    return out_t(std::min(std::max(v, -qmax), qmax));
  }
}

template <typename in_t, typename out_t>
void quantize_cpu_typed(const at::Tensor& x, Mode mode, float qmax, at::Tensor& q, at::Tensor& scale, at::Tensor& q_t) {
  const int64_t M = x.size(0), K = x.size(1);
  const in_t* xp = x.data_ptr<in_t>();
  out_t* qp = q.data_ptr<out_t>();
  out_t* qtp = q_t.numel() ? q_t.data_ptr<out_t>() : nullptr;
  float* sp = scale.data_ptr<float>();
  const int64_t n_scales = mode == Mode::kTensor ? 1 : (mode == Mode::kRows ? M : K);
  std::vector<float> amax(n_scales, 0.f);
  if (mode == Mode::kRows) {
    at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float m = 0.f;
        for (int64_t c = 0; c < K; ++c) m = std::max(m, std::fabs(static_cast<float>(xp[r * K + c])));
        amax[r] = m;
      }
    });
  } else if (mode == Mode::kCols) {
    at::parallel_for(0, K, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = c0; c < c1; ++c) amax[c] = std::max(amax[c], std::fabs(static_cast<float>(xp[r * K + c])));
    });
  } else {
    amax[0] = at::parallel_reduce(0, M * K, 4096, 0.f, [&](int64_t i0, int64_t i1, float m) {
      for (int64_t i = i0; i < i1; ++i) m = std::max(m, std::fabs(static_cast<float>(xp[i])));
      return m;
    }, [](float a, float b) { return std::max(a, b); });
  }
  std::vector<float> inv(n_scales);
  for (int64_t i = 0; i < n_scales; ++i) {
    const float a = std::max(amax[i], kAmaxFloor);
    sp[i] = a / qmax;
    inv[i] = qmax / a;
  }
  at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < K; ++c) {
        const float s = mode == Mode::kTensor ? inv[0] : (mode == Mode::kRows ? inv[r] : inv[c]);
        const out_t v = cast_to<out_t>(static_cast<float>(xp[r * K + c]) * s, qmax);
        qp[r * K + c] = v;
        if (qtp) qtp[c * M + r] = v;
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& x_in, at::ScalarType dtype,
                                                          std::optional<int64_t> axis, bool transpose) {
  TORCH_CHECK(x_in.dim() == 2, "quantize: x must be 2-D (M, K), got ", x_in.dim(), "-D");
  const float qmax = qmax_of(dtype);
  const Mode mode = mode_of(axis);
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(dtype));
  at::Tensor q_t = transpose ? at::empty({K, M}, x.options().dtype(dtype)) : at::empty({0}, x.options().dtype(dtype));
  std::vector<int64_t> scale_shape;
  if (mode == Mode::kRows) scale_shape = {M, 1};
  if (mode == Mode::kCols) scale_shape = {1, K};
  at::Tensor scale = at::empty(scale_shape, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "quantize_cpu", [&] {
    switch (dtype) {
      case at::kFloat8_e4m3fn: quantize_cpu_typed<scalar_t, c10::Float8_e4m3fn>(x, mode, qmax, q, scale, q_t); break;
      case at::kFloat8_e5m2: quantize_cpu_typed<scalar_t, c10::Float8_e5m2>(x, mode, qmax, q, scale, q_t); break;
      default: quantize_cpu_typed<scalar_t, int8_t>(x, mode, qmax, q, scale, q_t); break;
    }
  });
  return {q, scale, q_t};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("quantize(Tensor x, ScalarType dtype, int? axis, bool transpose) -> (Tensor, Tensor, Tensor)");
  m.def("quantize_delayed(Tensor x, ScalarType dtype, Tensor(a!) state, bool transpose) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("quantize", &quantize_cpu);
}

}  // namespace tscale
