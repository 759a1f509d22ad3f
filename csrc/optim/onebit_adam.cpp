// The elementwise passes of 1-bit Adam's frozen-variance phase, each fused into one pass (CPU).
//
// onebit_adam_fold_(g, m, inv_d, beta1, bound):  g = (1 - beta1) clamp(g inv_d, -bound, bound) + beta1 m inv_d
//   this rank's next preconditioned momentum u, written over its gradient (before compression);
//   inv_d = 1 / d is kept with the frozen denominators, so the pass has no division
// onebit_adam_step_(p, m, u, d, decay, step_size):  m = u d;  p = decay p - step_size u
//   the optimizer step from the exchanged u (decay = 1 - lr wd, step_size = lr / (1 - beta1^t))
// onebit_adam_fold_pack_(worker, g, m[], inv_d[], offsets[], beta1, bound, chunk) -> (bits, scales)
//   a bucket g (n,) whose parameter k sits at g[offsets[k] : offsets[k] + m[k].numel()]: each
//   such value becomes its fold u as above (values outside every parameter stay g), is added to
//   the residual worker (n_pad >= n,) and worker is packed with error feedback, as
//   pack_signs_feedback_add_(worker, u, chunk) does: fold, add and pack in one pass, g unchanged.
//
// All tensors float32, contiguous, of one size. On other devices, and as the reference,
// tscale/ops/onebit_adam.py does the same with torch operations.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "../bitpack/sign_pack.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace tscale {
namespace {

constexpr int64_t kGrain = 1 << 16;

void check_same(const char* op, const at::Tensor& a, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(a.scalar_type() == at::kFloat && a.is_contiguous(), op, ": ", name, " must be contiguous float32");
  TORCH_CHECK(a.numel() == ref.numel(), op, ": ", name, " has ", a.numel(), " elements, expected ", ref.numel());
  TORCH_CHECK(a.device() == ref.device(), op, ": ", name, " is on another device");
}

// u = (1 - beta1) clamp(g inv_d, +-bound) + beta1 m inv_d, the one expression both fold passes use
inline float fold_value(float g, float m, float inv_d, float b1, float keep, float bound) {
  const float scaled = std::min(std::max(g * inv_d, -bound), bound);
  return scaled * keep + (m * inv_d) * b1;
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
    for (int64_t i = lo; i < end; ++i) gp[i] = fold_value(gp[i], mp[i], ip[i], b1, keep, hi);
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

std::tuple<at::Tensor, at::Tensor> onebit_adam_fold_pack_cpu(at::Tensor& worker, const at::Tensor& g, at::TensorList m,
                                                             at::TensorList inv_d, at::IntArrayRef offsets, double beta1,
                                                             double bound, int64_t chunk) {
  const char* op = "onebit_adam_fold_pack_";
  TORCH_CHECK(chunk > 0 && chunk % 8 == 0, op, ": chunk must be a positive multiple of 8, got ", chunk);
  TORCH_CHECK(worker.dim() == 1 && worker.scalar_type() == at::kFloat && worker.is_contiguous(), op,
              ": worker must be contiguous 1-D float32");
  TORCH_CHECK(g.dim() == 1 && g.scalar_type() == at::kFloat && g.is_contiguous() && g.numel() <= worker.numel(), op,
              ": g must be contiguous 1-D float32, no longer than worker");
  const int64_t S = static_cast<int64_t>(offsets.size()), n = g.numel(), n_pad = worker.numel();
  TORCH_CHECK(static_cast<int64_t>(m.size()) == S && static_cast<int64_t>(inv_d.size()) == S, op,
              ": one m and one inv_d per offset");
  std::vector<const float*> mp(S), ip(S);
  std::vector<int64_t> len(S);
  for (int64_t k = 0; k < S; ++k) {
    check_same(op, m[k], "m", m[k]);
    check_same(op, inv_d[k], "inv_d", m[k]);
    len[k] = m[k].numel();
    TORCH_CHECK(offsets[k] >= (k ? offsets[k - 1] + len[k - 1] : 0) && offsets[k] + len[k] <= n, op,
                ": parameter ", k, " at offset ", offsets[k], " overlaps another or leaves the bucket");
    mp[k] = m[k].data_ptr<float>();
    ip[k] = inv_d[k].data_ptr<float>();
  }
  const int64_t n_chunks = (n_pad + chunk - 1) / chunk;
  at::Tensor bits = at::empty({(n_pad + 7) / 8}, worker.options().dtype(at::kByte));
  at::Tensor scales = at::empty({n_chunks}, worker.options());
  float* xp = worker.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  uint8_t* bp = bits.data_ptr<uint8_t>();
  float* sp = scales.data_ptr<float>();
  const float b1 = static_cast<float>(beta1), keep = static_cast<float>(1.0 - beta1), hi_clamp = static_cast<float>(bound);
  at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * chunk, hi = std::min(n_pad, lo + chunk), end = std::min(hi, n);
      // the last parameter starting at or before lo (-1: none); it may have ended before lo
      int64_t k = std::upper_bound(offsets.begin(), offsets.end(), lo) - offsets.begin() - 1;
      for (int64_t i = lo; i < end;) {
        if (k >= 0 && i < offsets[k] + len[k]) {  // inside parameter k: its fold
          const int64_t e = std::min(end, offsets[k] + len[k]);
          const float* mk = mp[k] + (i - offsets[k]);  // parameter k's values from position i on
          const float* ik = ip[k] + (i - offsets[k]);
          float* x = xp + i;
          const float* gi = gp + i;
          for (int64_t j = 0; j < e - i; ++j) x[j] += fold_value(gi[j], mk[j], ik[j], b1, keep, hi_clamp);
          i = e;
        } else {  // between parameters: the bucket's value as it is
          const int64_t e = std::min(end, k + 1 < S ? offsets[k + 1] : n);
          for (; i < e; ++i) xp[i] += gp[i];
        }
        while (k + 1 < S && i >= offsets[k + 1]) ++k;
      }
      sp[c] = sign_pack::pack_chunk(xp, bp, lo, hi, /*feedback=*/true);
    }
  });
  return {bits, scales};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("onebit_adam_fold_(Tensor(a!) g, Tensor m, Tensor inv_d, float beta1, float bound) -> ()");
  m.def("onebit_adam_step_(Tensor(a!) p, Tensor(b!) m, Tensor u, Tensor d, float decay, float step_size) -> ()");
  m.def("onebit_adam_fold_pack_(Tensor(a!) worker, Tensor g, Tensor[] m, Tensor[] inv_d, int[] offsets, float beta1, "
        "float bound, int chunk) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("onebit_adam_fold_", &onebit_adam_fold_cpu);
  m.impl("onebit_adam_step_", &onebit_adam_step_cpu);
  m.impl("onebit_adam_fold_pack_", &onebit_adam_fold_pack_cpu);
}

}  // namespace tscale
