// Python binding of the benchmark's kernels: variants(), run(name, ...) and, when built with base.cu, base(...).
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace xent_bench {
using Fn = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&, int64_t, double, double);
const std::vector<std::pair<std::string, Fn>>& variants();
#ifdef XENT_BENCH_BASE
std::tuple<at::Tensor, at::Tensor> base(const at::Tensor&, const at::Tensor&, int64_t, double, double);
#endif
}  // namespace xent_bench

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("variants", [] {
    std::vector<std::string> names;
    for (const auto& [name, fn] : xent_bench::variants()) names.push_back(name);
    return names;
  });
  m.def("run", [](const std::string& name, const at::Tensor& logits, const at::Tensor& targets, int64_t vocab,
                  double softcap, double scale) {
    for (const auto& [n, fn] : xent_bench::variants())
      if (n == name) return fn(logits, targets, vocab, softcap, scale);
    TORCH_CHECK(false, "no variant ", name);
  });
#ifdef XENT_BENCH_BASE
  m.def("base", &xent_bench::base);
#endif
}
