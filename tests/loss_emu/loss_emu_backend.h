// The emulator backend of the head's cross-entropy kernel: the primitives of csrc/loss/softcap_xent_cuda_backend.cuh
// on the CPU, over the fiber runtime and warp collectives of tests/attention_emu (emu_backend.h, included first).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "emu_backend.h"

#define TSCALE_XENT_DYNAMIC_SMEM(name) unsigned char* name = ::emu::rt().smem

namespace tscale::xent {
namespace {

struct Vec8 {
  uint32_t w[4];  // 8 bf16, the lower address in the low half of w[0]
};

inline Vec8 load_cached(const Vec8* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("load_cached at an address that is not 16-byte aligned");
  return *p;
}

inline Vec8 load_streaming(const Vec8* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("load_streaming at an address that is not 16-byte aligned");
  return *p;
}

inline void store_cached(Vec8* p, Vec8 v) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("store_cached at an address that is not 16-byte aligned");
  *p = v;
}

inline void store_streaming(Vec8* p, Vec8 v) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("store_streaming at an address that is not 16-byte aligned");
  *p = v;
}

inline void unpack8(const Vec8& v, float (&x)[8]) {
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = attn::bf16_to_float(static_cast<uint16_t>(v.w[i] & 0xFFFFu));
    x[2 * i + 1] = attn::bf16_to_float(static_cast<uint16_t>(v.w[i] >> 16));
  }
}

inline Vec8 pack8(const float (&x)[8]) {
  Vec8 v;
  for (int i = 0; i < 4; ++i) v.w[i] = attn::pack_bf16(x[2 * i], x[2 * i + 1]);
  return v;
}

inline float fast_exp2(float x) { return std::exp2(x); }
inline float fast_log2(float x) { return std::log2(x); }
inline float fast_rcp(float x) { return 1.f / x; }
inline float warp_xor(float v, int mask) { return attn::warp_xor(v, mask); }

// ---- host side ----

inline void check_device(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "softcap_xent_grad (emulated): ", name, " must be a CPU tensor");
}

using attn::DeviceScope;
using attn::launch_kernel;

}  // namespace
}  // namespace tscale::xent
