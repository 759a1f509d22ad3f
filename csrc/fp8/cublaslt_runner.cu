// cuBLASLt runner: handles, matmul descriptors, and the per-problem autotuner with its cache
// (interface and layout convention in cublaslt_runner.h).
//
// Why autotune: cuBLASLt's heuristic orders its algorithms by an estimate; its first choice is what
// torch._int_mm takes (with no workspace at all), and at the model's shapes it is often not the
// fastest. Here the heuristic proposes up to kMaxAlgos algorithms that fit a 32 MiB workspace (the
// size cuBLAS recommends on Hopper), each runs once to warm up and kTimedRuns times between two CUDA
// events, and the fastest is kept for the problem's key. TSCALE_GEMM_AUTOTUNE=0 keeps the
// heuristic's first choice instead (no timing). The workspace comes from the torch caching
// allocator on every call, so it follows the stream and CUDA-graph rules of any other tensor.
#ifdef TSCALE_WITH_CUBLASLT

#include "cublaslt_runner.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

namespace tscale::lt {
namespace {

constexpr int kMaxAlgos = 16;
constexpr int kTimedRuns = 5;
constexpr uint64_t kWorkspaceBytes = 32ull << 20;

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    case CUDA_R_8I: return "int8";
    case CUDA_R_32I: return "int32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "fp16";
    case CUDA_R_32F: return "fp32";
    default: return "?";
  }
}

const char* mode_name(ScaleMode m) {
  switch (m) {
    case ScaleMode::kNone: return "none";
    case ScaleMode::kScalar: return "scalar";
    case ScaleMode::kOuterVector: return "outer-vector";
  }
  return "?";
}

// The problem in the caller's row-major terms too (M = n, N = m), so an error names the torch shapes.
std::string describe(const Problem& p) {
  std::ostringstream s;
  s << "cuBLASLt m=" << p.m << " n=" << p.n << " k=" << p.k << " (torch out (M=" << p.n << ", N=" << p.m
    << "), K=" << p.k << "), A=" << type_name(p.a_type) << " B=" << type_name(p.b_type)
    << " D=" << type_name(p.d_type) << ", scales " << mode_name(p.scale_mode)
    << (p.fast_accum ? ", fast accumulation" : "");
  return s.str();
}

void check(cublasStatus_t status, const char* call, const Problem& p) {
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "tscale cuBLASLt: ", call, " returned ", cublasLtGetStatusName(status),
              " (", cublasLtGetStatusString(status), ") for ", describe(p));
}

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
uint32_t alignment_of(const void* ptr) {
  const auto v = reinterpret_cast<uintptr_t>(ptr);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

// One handle per (thread, device), created on first use with the device current and kept for the
// life of the process (a cuBLASLt handle holds the device's properties, nothing per stream).
cublasLtHandle_t handle_for(int device, const Problem& p) {
  thread_local std::map<int, cublasLtHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  check(cublasLtCreate(&h), "cublasLtCreate", p);
  handles.emplace(device, h);
  return h;
}

struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value, const char* name,
              const Problem& p) {
  const cublasStatus_t s = cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
  TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, "tscale cuBLASLt: cublasLtMatmulDescSetAttribute(", name, ") returned ",
              cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ") for ", describe(p));
}

// Fills the descriptors of D = A^T B. Returns false when this cuBLASLt rejects the outer-vector scale
// mode itself (a library older than 12.9): the caller treats that like "no algorithm".
bool build(const Problem& p, const Operands& o, Descriptors& d) {
  check(cublasLtMatmulDescCreate(&d.op, p.compute, p.scale_type), "cublasLtMatmulDescCreate", p);
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;  // the "TN" form, see the header
  set_attr(d.op, CUBLASLT_MATMUL_DESC_TRANSA, trans_a, "TRANSA", p);
  set_attr(d.op, CUBLASLT_MATMUL_DESC_TRANSB, trans_b, "TRANSB", p);
  if (is_fp8(p.a_type) || is_fp8(p.b_type)) {
    const int8_t fast = p.fast_accum ? 1 : 0;
    set_attr(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "FAST_ACCUM", p);
  }
  if (p.scale_mode == ScaleMode::kOuterVector) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)) !=
            CUBLAS_STATUS_SUCCESS) {
      return false;
    }
  }
  if (p.scale_mode != ScaleMode::kNone) {
    TORCH_CHECK(o.a_scale != nullptr && o.b_scale != nullptr, "tscale cuBLASLt: scale pointers missing for ",
                describe(p));
    set_attr(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, o.a_scale, "A_SCALE_POINTER", p);
    set_attr(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, o.b_scale, "B_SCALE_POINTER", p);
  }
  check(cublasLtMatrixLayoutCreate(&d.a, p.a_type, p.k, p.m, p.k), "cublasLtMatrixLayoutCreate(A)", p);
  check(cublasLtMatrixLayoutCreate(&d.b, p.b_type, p.k, p.n, p.k), "cublasLtMatrixLayoutCreate(B)", p);
  check(cublasLtMatrixLayoutCreate(&d.d, p.d_type, p.m, p.n, p.m), "cublasLtMatrixLayoutCreate(D)", p);
  return true;
}

cublasStatus_t matmul(cublasLtHandle_t h, const Descriptors& d, const Operands& o, const cublasLtMatmulAlgo_t& algo,
                      void* workspace, cudaStream_t stream) {
  // C = D with beta = 0: C is never read.
  return cublasLtMatmul(h, d.op, o.alpha, o.a, d.a, o.b, d.b, o.beta, o.d, d.d, o.d, d.d, &algo, workspace,
                        kWorkspaceBytes, stream);
}

struct Choice {
  bool supported = false;
  cublasLtMatmulAlgo_t algo{};
  std::string why;  // when not supported: what the heuristic or the candidates answered
};

using Key = std::array<int64_t, 14>;

Key key_of(const Problem& p, const Operands& o, int device) {
  return {device, p.m, p.n, p.k, static_cast<int64_t>(p.a_type), static_cast<int64_t>(p.b_type),
          static_cast<int64_t>(p.d_type), static_cast<int64_t>(p.compute), static_cast<int64_t>(p.scale_type),
          static_cast<int64_t>(p.scale_mode), p.fast_accum ? 1 : 0, alignment_of(o.a), alignment_of(o.b),
          alignment_of(o.d)};
}

std::mutex g_mutex;
std::map<Key, Choice> g_cache;  // guarded by g_mutex
std::atomic<int64_t> g_tunings{0}, g_hits{0}, g_untimed{0};

bool autotune_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("TSCALE_GEMM_AUTOTUNE");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
  }
};

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

template <typename T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value,
              const char* name, const Problem& p) {
  const cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, "tscale cuBLASLt: cublasLtMatmulPreferenceSetAttribute(", name,
              ") returned ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ") for ", describe(p));
}

// The heuristic's candidates for the problem; `timed` picks the fastest of them by running each.
Choice choose(cublasLtHandle_t h, const Descriptors& d, const Problem& p, const Operands& o, void* workspace,
              cudaStream_t stream, bool timed) {
  Preference pref;
  check(cublasLtMatmulPreferenceCreate(&pref.pref), "cublasLtMatmulPreferenceCreate", p);
  const uint64_t max_workspace = kWorkspaceBytes;
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace, "MAX_WORKSPACE_BYTES", p);
  // The default assumes 256-byte aligned buffers; tell the heuristic the real alignments (views of
  // larger tensors can start anywhere 16-byte aligned) so it never picks an algorithm that needs more.
  const uint32_t align_a = alignment_of(o.a), align_b = alignment_of(o.b), align_d = alignment_of(o.d);
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a, "MIN_ALIGNMENT_A_BYTES", p);
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b, "MIN_ALIGNMENT_B_BYTES", p);
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d, "MIN_ALIGNMENT_C_BYTES", p);
  set_pref(pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d, "MIN_ALIGNMENT_D_BYTES", p);

  cublasLtMatmulHeuristicResult_t results[kMaxAlgos];
  std::memset(results, 0, sizeof(results));
  int count = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.d, d.d, pref.pref, kMaxAlgos, results, &count);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return Choice{false, {}, "the heuristic returned CUBLAS_STATUS_NOT_SUPPORTED"};
  check(s, "cublasLtMatmulAlgoGetHeuristic", p);
  int usable[kMaxAlgos];
  int n_usable = 0;
  for (int i = 0; i < count; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes) usable[n_usable++] = i;
  }
  if (n_usable == 0) return Choice{false, {}, "the heuristic proposed no algorithm"};
  if (!timed || n_usable == 1) return Choice{true, results[usable[0]].algo, {}};

  EventPair ev;
  C10_CUDA_CHECK(cudaEventCreate(&ev.start));
  C10_CUDA_CHECK(cudaEventCreate(&ev.stop));
  float best_ms = std::numeric_limits<float>::infinity();
  int best = -1;
  std::ostringstream failures;
  for (int u = 0; u < n_usable; ++u) {
    const cublasLtMatmulAlgo_t& algo = results[usable[u]].algo;
    cublasStatus_t st = matmul(h, d, o, algo, workspace, stream);  // warm-up, and weeds out refusals
    if (st == CUBLAS_STATUS_SUCCESS) {
      C10_CUDA_CHECK(cudaEventRecord(ev.start, stream));
      for (int r = 0; r < kTimedRuns && st == CUBLAS_STATUS_SUCCESS; ++r) st = matmul(h, d, o, algo, workspace, stream);
      C10_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
      C10_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      failures << " candidate " << u << ": " << cublasLtGetStatusName(st) << ";";
      continue;
    }
    float ms = 0.f;
    C10_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    if (ms < best_ms) {
      best_ms = ms;
      best = usable[u];
    }
  }
  if (best < 0) {  // every candidate refused at run time: no algorithm after all
    return Choice{false, {}, "none of the " + std::to_string(n_usable) + " proposed algorithms ran:" + failures.str()};
  }
  return Choice{true, results[best].algo, {}};
}

}  // namespace

bool run(const Problem& p, const Operands& o, cudaStream_t stream, int device, std::string* why) {
  TORCH_CHECK(p.m > 0 && p.n > 0 && p.k > 0, "tscale cuBLASLt: empty problem ", describe(p));
  TORCH_CHECK(o.a && o.b && o.d && o.alpha && o.beta, "tscale cuBLASLt: null operand pointer for ", describe(p));
  const Key key = key_of(p, o, device);
  Choice choice;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) {
      choice = it->second;
      cached = true;
    }
  }
  if (cached && !choice.supported) {
    ++g_hits;
    if (why) *why = choice.why;
    return false;
  }
  const cublasLtHandle_t h = handle_for(device, p);
  Descriptors d;
  if (!build(p, o, d)) {
    if (why) *why = "this cuBLASLt rejects the outer-vector scale mode";
    return false;
  }
  at::Tensor workspace = at::empty({static_cast<int64_t>(kWorkspaceBytes)},
                                   at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, device)));
  if (cached) {
    ++g_hits;
  } else {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    const bool capturing = capture != cudaStreamCaptureStatusNone;  // no timing or syncing inside a capture
    const bool timed = !capturing && autotune_enabled();
    choice = choose(h, d, p, o, workspace.data_ptr(), stream, timed);
    if (timed) {
      ++g_tunings;
    } else {
      ++g_untimed;
    }
    if (!capturing) {  // a later eager call tunes the problem properly
      std::lock_guard<std::mutex> lock(g_mutex);
      g_cache.emplace(key, choice);
    }
  }
  if (!choice.supported) {
    if (why) *why = choice.why;
    return false;
  }
  check(matmul(h, d, o, choice.algo, workspace.data_ptr(), stream), "cublasLtMatmul", p);
  return true;
}

std::vector<int64_t> stats() {
  int64_t entries = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    entries = static_cast<int64_t>(g_cache.size());
  }
  return {entries, g_tunings.load(), g_hits.load(), g_untimed.load()};
}

}  // namespace tscale::lt

#endif  // TSCALE_WITH_CUBLASLT
