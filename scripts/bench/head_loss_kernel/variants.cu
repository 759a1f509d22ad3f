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

// name -> policy: <polynomial exponential in pass 1, in pass 2, blocks a multiprocessor>
const std::vector<std::pair<std::string, Fn>>& variants() {
  static const std::vector<std::pair<std::string, Fn>> v = {
      {"poly1", &softcap_xent_grad_with<Policy<true, false, 2>>},
      {"sfu", &softcap_xent_grad_with<Policy<false, false, 2>>},
      {"poly2", &softcap_xent_grad_with<Policy<false, true, 2>>},
      {"poly12", &softcap_xent_grad_with<Policy<true, true, 2>>},
      {"poly1_3blocks", &softcap_xent_grad_with<Policy<true, false, 3>>},
  };
  return v;
}

}  // namespace xent_bench
