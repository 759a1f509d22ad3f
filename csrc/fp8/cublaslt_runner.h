// cuBLASLt runner for the fp8 / int8 products: one "TN" matmul, its algorithm autotuned once per problem.
//
// Layout convention. cuBLASLt is column-major; a row-major torch tensor (R, C) is the same bytes as a
// column-major (C, R) matrix with leading dimension C. The runner always computes, in cuBLASLt terms,
//   D (m x n, ld m) = A^T (m x k) * B (k x n),   A stored k x m (ld k), B stored k x n (ld k),
// which is the "TN" form that cuBLASLt's fp8 and int8 (IMMA) kernels require. For out = a @ b in row-major
// torch terms (a (M, K) row-major, b (K, N) = the transpose of a row-major (N, K) weight):
//   cuBLASLt A = the weight bytes (N, K) row-major = k x m column-major with m = N
//   cuBLASLt B = a's bytes        (M, K) row-major = k x n column-major with n = M
//   cuBLASLt D = out's bytes      (M, N) row-major = m x n column-major
// so cuBLASLt's "A scale" is the per-output-channel scale (scale_b, N values) and its "B scale" the
// per-token scale (scale_a, M values).
#pragma once

#ifdef TSCALE_WITH_CUBLASLT

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tscale::lt {

enum class ScaleMode : int {
  kNone = 0,       // no scale pointers: D = A^T B
  kScalar = 1,     // A_SCALE_POINTER / B_SCALE_POINTER each point to one float32 on the device
  kOuterVector = 2 // CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: A scale m floats, B scale n floats
};

// One product, in cuBLASLt's column-major terms (see above).
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  cudaDataType_t a_type{}, b_type{}, d_type{};
  cublasComputeType_t compute{};
  cudaDataType_t scale_type{};  // the type of alpha and beta
  ScaleMode scale_mode = ScaleMode::kNone;
  bool fast_accum = false;      // fp8 only
};

struct Operands {
  const void* a = nullptr;        // k x m, ld k
  const void* b = nullptr;        // k x n, ld k
  void* d = nullptr;              // m x n, ld m (also C, with beta = 0)
  const void* a_scale = nullptr;  // device float32 (kScalar: 1 value, kOuterVector: m values)
  const void* b_scale = nullptr;  // device float32 (kScalar: 1 value, kOuterVector: n values)
  const void* alpha = nullptr;    // host, of Problem::scale_type, usually 1
  const void* beta = nullptr;     // host, of Problem::scale_type, must be 0
};

// Runs the product on `stream` (device `device`, which must be current). On the first call for a
// problem (shape, types, scale mode, pointer alignments, device) it asks cuBLASLt's heuristic for up
// to 16 algorithms, times each with CUDA events and caches the fastest; later calls reuse it. While
// the stream is being captured into a CUDA graph it takes the heuristic's first choice untimed.
// Returns false, without running anything, when cuBLASLt has no algorithm for the problem (the
// heuristic proposes none, or every proposal refuses to run; that answer is cached too) and then
// says why in *why; any other cuBLASLt failure raises with the call, status and shape.
bool run(const Problem& p, const Operands& ops, cudaStream_t stream, int device, std::string* why = nullptr);

// {cached choices, autotuning runs, cache hits, heuristic-only picks}, for tests.
std::vector<int64_t> stats();

}  // namespace tscale::lt

#endif  // TSCALE_WITH_CUBLASLT
