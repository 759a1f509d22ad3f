// CUDA registration of tscale::attention_fwd_cuda: a Hopper kernel (attention_fwd_sm90_ws.cuh with specialised
// warps, or the pipelined attention_fwd_sm90.cuh) where one serves the call, else the sm_80 one (attention_fwd.cuh;
// the CPU emulator of the tests builds all three).
#include <torch/library.h>

#include "attention_cuda_backend.cuh"
#include "attention_fwd.cuh"
#include "attention_fwd_sm90.cuh"
#include "attention_fwd_sm90_ws.cuh"

namespace tscale::attn {
namespace {

// Which forward serves a call: TSCALE_ATTENTION_FWD_KERNEL = auto (default: this one for calls without a window
// limit, where it was measured faster than the sm_80 kernel; the sm_80 one for windows, docs/BENCHMARKS.md
// "The Hopper forward") | sm90 (this one, an error where it cannot run) | mma (the sm_80 kernel).
inline bool sm90_forward_serves(const FwdParams& p, const at::Tensor& q) {
  return hopper_kernel_chosen("TSCALE_ATTENTION_FWD_KERNEL", "forward", q, p.D, /*auto_prefers=*/p.window == 0);
}

// Which Hopper forward: TSCALE_ATTENTION_SM90_FWD = auto (default: the specialised-warp one, 21-29% faster than the
// pipelined one on the causal mask; docs/BENCHMARKS.md "The Hopper forward with specialised warps") | ws | pipelined.
inline bool sm90_forward_specialised() {
  const char* env = std::getenv("TSCALE_ATTENTION_SM90_FWD");
  const bool pipelined = env != nullptr && std::strcmp(env, "pipelined") == 0;
  TORCH_CHECK(env == nullptr || pipelined || std::strcmp(env, "auto") == 0 || std::strcmp(env, "ws") == 0,
              "TSCALE_ATTENTION_SM90_FWD must be auto, ws or pipelined, got '", env, "'");
  return !pipelined;
}

std::tuple<at::Tensor, at::Tensor> attention_fwd_entry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const std::optional<at::Tensor>& doc_ids, int64_t window,
                                                       bool sink, double scale) {
  const DeviceScope scope(q);
  FwdCall c = prepare_fwd(q, k, v, doc_ids, window, sink, scale);
  if (c.out.numel() == 0) return {c.out, c.lse};
  if (!sm90_forward_serves(c.p, q))
    launch_fwd_mma(c.p);
  else if (sm90_forward_specialised())
    launch_fwd_sm90_ws(c.p);
  else
    launch_fwd_sm90(c.p);
  return {c.out, c.lse};
}

}  // namespace
}  // namespace tscale::attn

TORCH_LIBRARY_IMPL(tscale, CUDA, m) { m.impl("attention_fwd_cuda", &tscale::attn::attention_fwd_entry); }
