// CUDA registration of tscale::attention_bwd_cuda: the sm_80 kernels (attention_bwd.cuh, which the CPU emulator of
// the tests also builds), or on request the Hopper main kernel between the same delta and dq kernels
// (attention_bwd_sm90.cuh).
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "attention_cuda_backend.cuh"
#include "attention_bwd.cuh"
#include "attention_bwd_sm90.cuh"

namespace tscale::attn {
namespace {

// TSCALE_ATTENTION_BWD_KERNEL = mma (default: the sm_80 main kernel) | sm90 (the Hopper one: head dim 128 on an
// sm_90 GPU, built for sm_90a; an error elsewhere). The Hopper backward is not the default until it has been timed
// against the sm_80 one.
bool sm90_backward_requested(const BwdParams& p, const at::Tensor& q) {
  const char* env = std::getenv("TSCALE_ATTENTION_BWD_KERNEL");
  if (env == nullptr || std::strcmp(env, "mma") == 0) return false;
  TORCH_CHECK(std::strcmp(env, "sm90") == 0, "TSCALE_ATTENTION_BWD_KERNEL must be mma or sm90, got '", env, "'");
  const bool can = hopper_kernels_serve(q, p.D);
  TORCH_CHECK(can, "TSCALE_ATTENTION_BWD_KERNEL=sm90: the Hopper backward needs head dim 128, an sm_90 GPU and a ",
              "build for sm_90a (TORCH_CUDA_ARCH_LIST with 9.0); got head dim ", p.D);
  return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_bwd_entry(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& doc_ids, int64_t window, bool /*sink*/, double scale) {
  const DeviceScope scope(q);
  BwdCall c = prepare_bwd(dout, q, k, v, out, lse, doc_ids, window, scale);
  if (c.dq.numel() == 0) return {c.dq, c.dk, c.dv};
  if (sm90_backward_requested(c.p, q))
    launch_bwd_sm90(c);
  else
    launch_bwd_mma(c);
  return {c.dq, c.dk, c.dv};
}

}  // namespace
}  // namespace tscale::attn

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("attention_bwd_cuda", &tscale::attn::attention_bwd_entry); }
