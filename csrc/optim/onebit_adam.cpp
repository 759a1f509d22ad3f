// The elementwise passes of 1-bit Adam's frozen-variance phase, each fused into one pass (CPU).
//
// onebit_adam_fold_(g, m, inv_d, beta1, bound):  g = (1 - beta1) clamp(g inv_d, -bound, bound) + beta1 m inv_d
//   this rank's next preconditioned momentum u, written over its gradient (before compression);
//   inv_d = 1 / d is kept with the frozen denominators, so the pass has no division
// onebit_adam_step_(p, m, u, d, decay, step_size):  m = u d;  p = decay p - step_size u
//   the optimizer step from the exchanged u (decay = 1 - lr wd, step_size = lr / (1 - beta1^t))
//
// All tensors float32, contiguous, of one size. On other devices, and as the reference,
// tscale/ops/onebit_adam.py does the same with torch operations.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace tscale {
namespace {

constexpr int64_t kGrain = 1 << 16;

void check_same(const char* op, const at::Tensor& a, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && a.is_contiguous(), op, ": ", name, " must be contiguous float32");
  TORCH_CHECK(a.numel() == ref.numel(), op, ": ", name, " has ", a.numel(), " elements, expected ", ref.numel());
  TORCH_CHECK(a.device() == ref.device(), op, ": ", name, " is on another device");
}

void onebit_adam_fold_cpu(at::Tensor& g, const at::Tensor& m, const at::Tensor& inv_d, double beta1, double bound) {
  check_same("onebit_adam_fold_", g, "g", g);
  check_same("onebit_adam_fold_", m, "m", g);
  check_same("onebit_adam_fold_", inv_d, "inv_d", g);
  float* gp = g.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  const float* ip = inv_d.data_ptr<float>();
  const float b1 = static_cast<float>(beta1), keep = static_cast<float>(1.0 - beta1), hi = static_cast<float>(bound);
  at::parallel_for(0, g.numel(), kGrain, [&](int64_t lo, int64_t end) {
    for (int64_t i = lo; i < end; ++i) {
      const float scaled = std::min(std::max(gp[i] * ip[i], -hi), hi);
      gp[i] = scaled * keep + (mp[i] * ip[i]) * b1;
    }
  });
}

void onebit_adam_step_cpu(at::Tensor& p, at::Tensor& m, const at::Tensor& u, const at::Tensor& d, double decay,
                          double step_size) {
  check_same("onebit_adam_step_", p, "p", p);
  check_same("onebit_adam_step_", m, "m", p);
  check_same("onebit_adam_step_", u, "u", p);
  check_same("onebit_adam_step_", d, "d", p);
  float* pp = p.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  const float* dp = d.data_ptr<float>();
  const float keep = static_cast<float>(decay), step = static_cast<float>(step_size);
  at::parallel_for(0, p.numel(), kGrain, [&](int64_t lo, int64_t end) {
    for (int64_t i = lo; i < end; ++i) {
      mp[i] = up[i] * dp[i];
      pp[i] = pp[i] * keep - up[i] * step;
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("onebit_adam_fold_(Tensor(a!) g, Tensor m, Tensor inv_d, float beta1, float bound) -> ()");
  m.def("onebit_adam_step_(Tensor(a!) p, Tensor(b!) m, Tensor u, Tensor d, float decay, float step_size) -> ()");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("onebit_adam_fold_", &onebit_adam_fold_cpu);
  m.impl("onebit_adam_step_", &onebit_adam_step_cpu);
}

}  // namespace tscale
