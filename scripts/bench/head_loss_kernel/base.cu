// An earlier version of the head's loss kernel (its two files copied in as base_*.cuh by head_loss_kernel.py).
#include "base_backend.cuh"
#include "base_kernel.cuh"

namespace xent_bench {

std::tuple<at::Tensor, at::Tensor> base(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_size,
                                        double softcap, double scale) {
  return tscale::xent::softcap_xent_grad_host(logits, targets, vocab_size, softcap, scale);
}

}  // namespace xent_bench
