// Schemas of the fp8 / int8 matrix products (always built, so the op names exist in every build);
// the CUDA kernels are in gemm_cublaslt.cu and register only when cuBLASLt was found at build time.
//
// Row-major torch view of every product, the same as fp8_mm / int8_mm in tscale/ops/lowprec.py:
//   a        (M, K) row-major (contiguous): activations, one row per token
//   b        (K, N) column-major, i.e. b.t() is a contiguous (N, K) row-major weight
//   scale_a  float32, one value (numel 1) or one per row of a (numel M, e.g. shape (M, 1))
//   scale_b  float32, one value (numel 1) or one per column of b (numel N, e.g. shape (1, N))
//   out      (M, N) row-major, out[m, n] = (sum_k a[m, k] * b[k, n]) * scale_a[m] * scale_b[n]
// The sums are exact int32 for int8 and fp32 accumulations of exact fp8 products for fp8.
//
// fp8_gemm(a, b, scale_a, scale_b, out_dtype, fuse_scales=True, fast_accum=False)
//   a, b float8_e4m3fn or float8_e5m2 (not both e5m2); out_dtype bfloat16, float16 or float32.
//   fuse_scales: apply the scales inside cuBLASLt (scale pointers / outer-vector scale mode)
//   where it can; False forces the fp32 product followed by our scaling pass (for tests).
//   fast_accum: cuBLASLt's fp8 fast accumulation (fewer promotions to fp32; faster, less exact).
// int8_gemm(a, b, scale_a, scale_b, out_dtype): a, b int8; the int32 product, then one pass that
//   scales it into out_dtype (cuBLASLt's int8 kernels write only int32 or int8).
// int8_gemm_i32(a, b): the raw int32 product (M, N), autotuned; int32 sums are exact.
// lowprec_gemm_stats() -> [cached algorithm choices, autotuning runs, cache hits, heuristic-only picks,
//   fp8 products that asked for fused scales but took the scaling pass] (declared by gemm_cublaslt.cu,
//   CUDA builds with cuBLASLt only).
// Shape rules (checked by the kernels): K and N multiples of 16, pointers 16-byte aligned.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("fp8_gemm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType out_dtype, "
        "bool fuse_scales=True, bool fast_accum=False) -> Tensor");
  m.def("int8_gemm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, ScalarType out_dtype) -> Tensor");
  m.def("int8_gemm_i32(Tensor a, Tensor b) -> Tensor");
}
