// Host-side checks and preparation shared by the attention forward and backward entries.
//
// Included after a backend (attention_cuda_backend.cuh, or the CPU emulator's), which provides
// check_device, DeviceScope and launch_kernel.
#pragma once

#include <ATen/ATen.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>

#include "attention_common.cuh"

namespace tscale::attn {
namespace {

// q, k, v: bf16 (B, H, T, D) of one shape, D 64 or 128, on one device.
inline void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op) {
  TORCH_CHECK(q.dim() == 4, op, ": q must be (B, H, T, D), got ", q.dim(), "-D");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), op,
              ": q, k and v must have one shape (B, H, T, D) (the kernel serves Tq == Tk), got q ", q.sizes(),
              ", k ", k.sizes(), ", v ", v.sizes());
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16, op, ": q, k and v must be bfloat16, got ", t->scalar_type());
    check_device(*t, op, "q, k and v");
    TORCH_CHECK(t->device() == q.device(), op, ": q, k and v must be on one device");
  }
  const int64_t D = q.size(3);
  TORCH_CHECK(D == 64 || D == 128, op, ": head dim must be 64 or 128, got ", D);
  TORCH_CHECK(q.size(2) < (int64_t{1} << 30), op, ": sequence length ", q.size(2), " is too long");
  TORCH_CHECK(q.size(1) <= 65535 && q.size(0) <= 65535, op, ": B and H must be at most 65535");
}

// The same tensor when its last dimension is contiguous and every row starts 16-byte aligned
// (what the 16-byte cp.async loads need), else a contiguous copy.
inline at::Tensor kernel_layout(const at::Tensor& t) {
  const bool ok = t.stride(3) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  at::Tensor r = ok ? t : t.clone(at::MemoryFormat::Contiguous);
  TORCH_CHECK(r.stride(3) == 1 && r.stride(2) % 8 == 0 && reinterpret_cast<uintptr_t>(r.data_ptr()) % 16 == 0,
              "attention: internal error, tensor layout unusable by the kernel");
  return r;
}

inline Strides strides_of(const at::Tensor& t) { return Strides{t.stride(0), t.stride(1), t.stride(2)}; }

// A new bf16 (B, H, T, D) tensor whose storage is (B, T, H, D): the layout of the model's q, k and v
// (its qkv projection's output, one head after another within a token), so the attention output goes
// on to the output projection, and the gradients back to the projection, without a transposing copy.
inline at::Tensor token_major(int64_t B, int64_t H, int64_t T, int64_t D, const at::Tensor& like) {
  return at::empty({B, T, H, D}, like.options()).transpose(1, 2);
}

// The window as the kernels take it: 0 (no limit) for window <= 0 or window >= T, where it hides nothing.
inline int normalised_window(int64_t window, int64_t T) { return (window <= 0 || window >= T) ? 0 : static_cast<int>(window); }

// doc_ids (B, T) int32 -> contiguous; nullopt or undefined -> undefined tensor.
inline at::Tensor prepare_docs(const std::optional<at::Tensor>& doc_ids, const at::Tensor& q, const char* op) {
  if (!doc_ids.has_value() || !doc_ids->defined()) return at::Tensor();
  const at::Tensor& d = *doc_ids;
  TORCH_CHECK(d.dim() == 2 && d.size(0) == q.size(0) && d.size(1) == q.size(2), op, ": doc_ids must be (B, T) = (",
              q.size(0), ", ", q.size(2), "), got ", d.sizes());
  TORCH_CHECK(d.scalar_type() == at::kInt, op, ": doc_ids must be int32, got ", d.scalar_type());
  TORCH_CHECK(d.device() == q.device(), op, ": doc_ids must be on the device of q");
  return d.contiguous();
}

// Per-32-position min / max document ids, (B, n_stat) each, for the tile-skipping tests.
struct DocStats {
  at::Tensor dmin, dmax;
};

inline DocStats doc_stats(const at::Tensor& docs, int B, int T, int n_stat) {
  DocStats s{at::empty({B, n_stat}, docs.options()), at::empty({B, n_stat}, docs.options())};
  const int64_t warps = static_cast<int64_t>(B) * n_stat;  // one per range
  launch_kernel(doc_stats_kernel, dim3(static_cast<unsigned>((warps + kWarps - 1) / kWarps)), dim3(kThreads), 0,
                docs.data_ptr<int32_t>(), s.dmin.data_ptr<int32_t>(), s.dmax.data_ptr<int32_t>(), B, T, n_stat);
  return s;
}

// A kernel setting from the environment variable `name`: unset or "auto" gives `fallback` (the measured choice for
// the call), else it must be one of `allowed`, written as a plain integer.
inline int sm90_env_choice(const char* name, std::initializer_list<int> allowed, int fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || std::strcmp(env, "auto") == 0) return fallback;
  std::string choices = "auto";
  for (const int a : allowed) {
    if (std::to_string(a) == env) return a;
    choices += ", " + std::to_string(a);
  }
  TORCH_CHECK(false, name, " must be one of ", choices, "; got '", env, "'");
  return fallback;
}

// The launch grid of block_tile: `tiles` tile ranks of H heads and B batch rows, as (H, tiles, B). Blocks start
// roughly in the order of their linear index, x fastest: every head's longest tile of a batch row, then every head's
// next one, then the next batch row. Against (tiles, H, B) (one head's tiles, then the next head's) this cut causal
// calls by 5.5% at T 4096 and 1% at T 1024, windowed ones unchanged; (H, B, tiles), every head's and batch row's
// longest tile first, doubled the T 1024 backward (docs/BENCHMARKS.md, "Block order").
inline dim3 tile_grid(int tiles, int H, int B) {
  TORCH_CHECK(tiles <= 65535 && B <= 65535, "attention: at most 65535 query or key tiles and 65535 sequences a call, got ",
              tiles, " tiles and ", B, " sequences");
  return dim3(H, tiles, B);
}

// Blocks of a persistent kernel: TSCALE_ATTENTION_SM90_BLOCKS when set (a positive count), else one a multiprocessor
// of the current device (multiprocessor_count, from the backend).
inline int persistent_blocks() {
  const char* env = std::getenv("TSCALE_ATTENTION_SM90_BLOCKS");
  if (env == nullptr || std::strcmp(env, "auto") == 0) return multiprocessor_count();
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  TORCH_CHECK(end != env && *end == '\0' && n > 0 && n <= 65535,
              "TSCALE_ATTENTION_SM90_BLOCKS must be auto or a count from 1 to 65535; got '", env, "'");
  return static_cast<int>(n);
}

}  // namespace
}  // namespace tscale::attn
