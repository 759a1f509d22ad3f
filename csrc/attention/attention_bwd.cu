// CUDA registration of tscale::attention_bwd_cuda: the sm_80 kernels (attention_bwd.cuh, which the CPU emulator of
// the tests also builds), or on Hopper GPUs the sm_90a main kernel between the same delta and dq kernels
// (attention_bwd_sm90.cuh).
#include <torch/library.h>

#include "attention_cuda_backend.cuh"
#include "attention_bwd.cuh"
#include "attention_bwd_sm90.cuh"

namespace tscale::attn {
namespace {

// Which main kernel serves a call: TSCALE_ATTENTION_BWD_KERNEL = auto (default: the Hopper one wherever it can run,
// measured faster than the sm_80 one on every mask; docs/BENCHMARKS.md "The Hopper backward") | sm90 | mma.
bool sm90_backward_serves(const BwdParams& p, const at::Tensor& q) {
  return hopper_kernel_chosen("TSCALE_ATTENTION_BWD_KERNEL", "backward", q, p.D, /*auto_prefers=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_bwd_entry(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& doc_ids, int64_t window, bool /*sink*/, double scale) {
  const DeviceScope scope(q);
  BwdCall c = prepare_bwd(dout, q, k, v, out, lse, doc_ids, window, scale);
  if (c.dq.numel() == 0) return {c.dq, c.dk, c.dv};
  if (sm90_backward_serves(c.p, q))
    launch_bwd_sm90(c);
  else
    launch_bwd_mma(c);
  return {c.dq, c.dk, c.dv};
}

}  // namespace
}  // namespace tscale::attn

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("attention_bwd_cuda", &tscale::attn::attention_bwd_entry); }
