// The emulator backend of the attention kernels: the primitives of csrc/attention/attention_cuda_backend.cuh, on the CPU.
//
// Each warp-wide primitive follows the PTX ISA description of its instruction:
//   ldmatrix .m8n8.x4 .b16: lane 8 m + r supplies the address of row r of matrix m (16 bytes,
//     16-byte aligned); lane 4 r + w receives, in register m, the elements (r, 2w) and (r, 2w + 1)
//     of matrix m, the lower column in the low half; with .trans the elements (2w, r) and (2w + 1, r).
//   mma.m16n8k16 .row.col f32.bf16.bf16.f32, groupID g = lane >> 2, t = lane & 3:
//     A regs a0..a3 hold (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..);
//     B regs b0, b1 hold (k = 2t..2t+1, n = g), (k = 2t+8..2t+9, n = g);
//     C/D d0..d3 hold (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
//   cp.async: the copy happens at issue or at the wait that retires its group (emu_runtime.h,
//     copy_mode); late copies leave the 0xFF poison for a read that misses its wait; src_bytes 0
//     writes 16 zero bytes.
// Shared addresses are byte offsets into the block's shared memory.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>

#include "emu_runtime.h"

#define TSCALE_ATTENTION_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __syncthreads() ::emu::syncthreads()
#define threadIdx (::emu::rt().current->tid)
#define blockIdx (::emu::rt().block_idx)
#define blockDim (::emu::rt().block)
#define gridDim (::emu::rt().grid)
#define TSCALE_ATTN_DYNAMIC_SMEM(name) unsigned char* name = ::emu::rt().smem

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace tscale::attn {
namespace {

inline unsigned char* shared_at(uint32_t addr, size_t bytes, size_t align) {
  emu::Runtime& r = emu::rt();
  if (addr % align != 0) emu::fail("shared address " + std::to_string(addr) + " is not " + std::to_string(align) + "-byte aligned");
  if (addr + bytes > r.smem_bytes) emu::fail("shared address " + std::to_string(addr) + " is out of bounds");
  return r.smem + addr;
}

inline uint32_t smem_addr(const void* p) {
  const auto* c = static_cast<const unsigned char*>(p);
  emu::Runtime& r = emu::rt();
  if (c < r.smem || c > r.smem + r.smem_bytes) emu::fail("smem_addr of a pointer outside shared memory");
  return static_cast<uint32_t>(c - r.smem);
}

inline uint16_t load_u16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float bf16_to_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as __float2bfloat16_rn
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

inline void ldsm_impl(uint32_t (&r)[4], uint32_t addr, bool trans) {
  shared_at(addr, 16, 16);  // checks this lane's row address
  emu::collective(trans ? 2 : 1, &addr, &r, [trans](emu::Fiber** lanes) {
    auto row_ptr = [&](int lane) { return emu::rt().smem + *static_cast<const uint32_t*>(lanes[lane]->in); };
    for (int L = 0; L < 32; ++L) {
      uint32_t* out = static_cast<uint32_t*>(lanes[L]->out);
      const int row = L >> 2, w = L & 3;
      for (int m = 0; m < 4; ++m) {
        uint16_t lo, hi;
        if (!trans) {
          const unsigned char* rp = row_ptr(8 * m + row);
          lo = load_u16(rp + 2 * (2 * w));
          hi = load_u16(rp + 2 * (2 * w + 1));
        } else {
          lo = load_u16(row_ptr(8 * m + 2 * w) + 2 * row);
          hi = load_u16(row_ptr(8 * m + 2 * w + 1) + 2 * row);
        }
        out[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
    }
  });
}

inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) { ldsm_impl(r, addr, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) { ldsm_impl(r, addr, true); }

struct MmaOperands {
  const uint32_t* a;
  uint32_t b0, b1;
  float* d;
};

inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const MmaOperands ops{a, b0, b1, d};
  emu::collective(3, &ops, nullptr, [](emu::Fiber** lanes) {
    float A[16][16], B[16][8], C[16][8];
    auto lo = [](uint32_t x) { return bf16_to_float(static_cast<uint16_t>(x & 0xFFFFu)); };
    auto hi = [](uint32_t x) { return bf16_to_float(static_cast<uint16_t>(x >> 16)); };
    for (int L = 0; L < 32; ++L) {
      const auto* x = static_cast<const MmaOperands*>(lanes[L]->in);
      const int g = L >> 2, t = L & 3;
      A[g][2 * t] = lo(x->a[0]);
      A[g][2 * t + 1] = hi(x->a[0]);
      A[g + 8][2 * t] = lo(x->a[1]);
      A[g + 8][2 * t + 1] = hi(x->a[1]);
      A[g][2 * t + 8] = lo(x->a[2]);
      A[g][2 * t + 9] = hi(x->a[2]);
      A[g + 8][2 * t + 8] = lo(x->a[3]);
      A[g + 8][2 * t + 9] = hi(x->a[3]);
      B[2 * t][g] = lo(x->b0);
      B[2 * t + 1][g] = hi(x->b0);
      B[2 * t + 8][g] = lo(x->b1);
      B[2 * t + 9][g] = hi(x->b1);
      C[g][2 * t] = x->d[0];
      C[g][2 * t + 1] = x->d[1];
      C[g + 8][2 * t] = x->d[2];
      C[g + 8][2 * t + 1] = x->d[3];
    }
    float Dm[16][8];
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double acc = C[i][j];
        for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[i][k]) * B[k][j];
        Dm[i][j] = static_cast<float>(acc);
      }
    for (int L = 0; L < 32; ++L) {
      float* dd = static_cast<const MmaOperands*>(lanes[L]->in)->d;
      const int g = L >> 2, t = L & 3;
      dd[0] = Dm[g][2 * t];
      dd[1] = Dm[g][2 * t + 1];
      dd[2] = Dm[g + 8][2 * t];
      dd[3] = Dm[g + 8][2 * t + 1];
    }
  });
}

inline void cp_async_16(uint32_t addr, const void* gmem, int src_bytes) {
  unsigned char* dst = shared_at(addr, 16, 16);
  if (src_bytes != 0 && src_bytes != 16) emu::fail("cp_async_16: src_bytes must be 0 or 16");
  if (src_bytes != 0 && reinterpret_cast<uintptr_t>(gmem) % 16 != 0) emu::fail("cp_async_16: unaligned global source");
  const auto* src = static_cast<const unsigned char*>(gmem);
  auto copy = [dst, src, src_bytes] {
    if (src_bytes) std::memcpy(dst, src, 16);
    else std::memset(dst, 0, 16);
  };
  emu::Runtime& r = emu::rt();
  const bool early = r.copy_mode == 1 || (r.copy_mode == 0 && (r.rng() & 1));
  if (early) {
    copy();
    r.current->open_copies.push_back([] {});  // still counts in its group
  } else {
    r.current->open_copies.push_back(copy);
  }
}

inline void cp_async_commit() {
  emu::Fiber* f = emu::rt().current;
  f->groups.push_back(std::move(f->open_copies));
  f->open_copies.clear();
}

template <int N>
inline void cp_async_wait() {
  emu::Fiber* f = emu::rt().current;
  while (f->groups.size() > static_cast<size_t>(N)) {
    for (auto& copy : f->groups.front()) copy();
    f->groups.erase(f->groups.begin());
  }
}

template <typename V>
struct ShuffleOperand {
  V v;
  int mask;
};

template <typename V>
inline V warp_xor_any(V v, int mask, int collective_id) {
  const ShuffleOperand<V> op{v, mask};
  V result{};
  emu::collective(collective_id, &op, &result, [](emu::Fiber** lanes) {
    const int mask = static_cast<const ShuffleOperand<V>*>(lanes[0]->in)->mask;
    for (int L = 0; L < 32; ++L) {
      if (static_cast<const ShuffleOperand<V>*>(lanes[L]->in)->mask != mask) emu::fail("warp_xor: lanes differ in mask");
      *static_cast<V*>(lanes[L]->out) = static_cast<const ShuffleOperand<V>*>(lanes[L ^ mask]->in)->v;
    }
  });
  return result;
}

inline float warp_xor(float v, int mask) { return warp_xor_any(v, mask, 4); }
inline int warp_xor_i32(int v, int mask) { return warp_xor_any(v, mask, 5); }

// Fibers never run at once, so read-modify-write is atomic here.
inline void atomic_add_f32(float* p, float v) { *p += v; }
inline void store_zero_16(float* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("store_zero_16 at an address that is not 16-byte aligned");
  std::memset(p, 0, 16);
}
inline void st_shared_u32(uint32_t addr, uint32_t v) { std::memcpy(shared_at(addr, 4, 4), &v, 4); }
inline void copy_shared_to_global_16(void* gmem, uint32_t addr) {
  if (reinterpret_cast<uintptr_t>(gmem) % 16 != 0)
    emu::fail("copy_shared_to_global_16 to an address that is not 16-byte aligned");
  std::memcpy(gmem, shared_at(addr, 16, 16), 16);
}
inline void warp_sync() {
  emu::collective(6, nullptr, nullptr, [](emu::Fiber**) {});
}
inline void atomic_min_shared(int* p, int v) { *p = std::min(*p, v); }
inline void atomic_max_shared(int* p, int v) { *p = std::max(*p, v); }

// ---- host side ----

inline void check_device(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, " (emulated): ", name, " must be CPU tensors");
}

struct DeviceScope {
  explicit DeviceScope(const at::Tensor&) {}
};

constexpr size_t kMaxSharedBytes = 99 * 1024;  // the opt-in limit of sm_86 / sm_89, the smallest of the targets

template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  TORCH_CHECK(smem <= kMaxSharedBytes, "emulated launch: ", smem, " bytes of shared memory exceed the sm_86 limit");
  TORCH_CHECK(grid.y <= 65535 && grid.z <= 65535, "emulated launch: grid too large");
  std::tuple<std::decay_t<Args>...> held(std::forward<Args>(args)...);
  emu::launch(emu::Dim3{grid.x, grid.y, grid.z}, emu::Dim3{block.x, block.y, block.z}, smem,
              [&] { std::apply(kernel, held); });
}

}  // namespace
}  // namespace tscale::attn
