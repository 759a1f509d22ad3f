// The fused attention kernels of csrc/attention, compiled for the CPU emulator (tests only).
//
// fwd / fwd_sm90 / fwd_sm90_ws / bwd / bwd_sm90 take CPU tensors and run the very kernel source of the CUDA build, thread by thread;
// tests/test_attention_kernel.py builds this with torch.utils.cpp_extension.load and compares
// it with attention_reference.
#include <torch/extension.h>

#include "emu_backend.h"

#include "attention_bwd.cuh"
#include "attention_bwd_sm90.cuh"
#include "attention_fwd.cuh"
#include "attention_fwd_sm90.cuh"
#include "attention_fwd_sm90_ws.cuh"

namespace {

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const std::optional<at::Tensor>& doc_ids, int64_t window, bool sink,
                                       double scale) {
  return tscale::attn::attention_fwd_host(q, k, v, doc_ids, window, sink, scale);
}

// sm_90's shared-memory limit for the Hopper kernels' launches while it lives.
struct HopperSharedLimit {
  size_t before = emu::rt().smem_limit;
  HopperSharedLimit() { emu::rt().smem_limit = 227 * 1024; }
  ~HopperSharedLimit() { emu::rt().smem_limit = before; }
};

// A Hopper forward (wgmma) through `launch`, with the settings of its environment, under sm_90's shared-memory limit:
// launch_fwd_sm90 (pipelined) or launch_fwd_sm90_ws (specialised warps: TMA loads, mbarriers).
template <void (*launch)(const tscale::attn::FwdParams&)>
std::tuple<at::Tensor, at::Tensor> fwd_hopper(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const std::optional<at::Tensor>& doc_ids, int64_t window, bool sink,
                                              double scale) {
  const HopperSharedLimit limit;
  tscale::attn::FwdCall c = tscale::attn::prepare_fwd(q, k, v, doc_ids, window, sink, scale);
  if (c.out.numel() != 0) launch(c.p);
  return {c.out, c.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                   const std::optional<at::Tensor>& doc_ids, int64_t window, bool sink,
                                                   double scale) {
  return tscale::attn::attention_bwd_host(dout, q, k, v, out, lse, doc_ids, window, sink, scale);
}

// The backward with the Hopper main kernel (wgmma) between the sm_80 delta and dq kernels, under sm_90's
// shared-memory limit.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_sm90(const at::Tensor& dout, const at::Tensor& q,
                                                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                                        const at::Tensor& lse, const std::optional<at::Tensor>& doc_ids,
                                                        int64_t window, double scale) {
  const HopperSharedLimit limit;
  tscale::attn::BwdCall c = tscale::attn::prepare_bwd(dout, q, k, v, out, lse, doc_ids, window, scale);
  if (c.dq.numel() != 0) tscale::attn::launch_bwd_sm90(c);
  return {c.dq, c.dk, c.dv};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd);
  m.def("fwd_sm90", &fwd_hopper<tscale::attn::launch_fwd_sm90>);
  m.def("fwd_sm90_ws", &fwd_hopper<tscale::attn::launch_fwd_sm90_ws>);
  m.def("bwd_sm90", &bwd_sm90);
  m.def("bwd", &bwd);
  m.def("set_seed", [](uint64_t seed) { emu::rt().rng.seed(seed); });
  m.def("set_copy_mode", [](int mode) { emu::rt().copy_mode = mode; });
  m.def("set_block_order", [](int order) { emu::rt().block_order = order; });
  m.def("switches", [] { return emu::rt().switches; });
  m.def("tile_grid", [](int tiles, int H, int B) {
    const dim3 g = tscale::attn::tile_grid(tiles, H, B);
    return std::make_tuple(g.x, g.y, g.z);
  });
}
