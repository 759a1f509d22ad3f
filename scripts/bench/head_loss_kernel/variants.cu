// The head's loss kernel of csrc/loss under several policies, for scripts/bench/head_loss_kernel.py (benchmark only).
#include "softcap_xent_cuda_backend.cuh"
#include "softcap_xent_kernel.cuh"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xent_bench {

using Fn = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&, int64_t, double, double);
using tscale::xent::Policy;
using tscale::xent::softcap_xent_grad_with;

// name -> policy: <blocks a multiprocessor, vectors of 8 a thread loads at once, pass 2 reads pass 1's stash>
const std::vector<std::pair<std::string, Fn>>& variants() {
  static const std::vector<std::pair<std::string, Fn>> v = {
      {"2blocks", &softcap_xent_grad_with<Policy<2, 4>>},
      {"2blocks_nostash", &softcap_xent_grad_with<Policy<2, 4, false>>},
      {"3blocks_batch2_nostash", &softcap_xent_grad_with<Policy<3, 2, false>>},
      {"3blocks", &softcap_xent_grad_with<Policy<3, 4>>},
      {"3blocks_batch2", &softcap_xent_grad_with<Policy<3, 2>>},
      {"2blocks_batch8", &softcap_xent_grad_with<Policy<2, 8>>},
  };
  return v;
}

}  // namespace xent_bench
