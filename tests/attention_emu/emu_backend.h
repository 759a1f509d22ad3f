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
//   wgmma .m64nNk16 .f32.bf16.bf16 (csrc/attention/wgmma_sm90.cuh; warpgroup w = threads 128 w..128 w + 127,
//     its warp i holding rows 16 i..16 i + 15 in mma.sync's fragment layouts): operands in shared memory are read
//     through their 64-bit descriptors, 128-byte swizzle only (bits 4-6 of a byte address XORed with bits 7-9);
//     K-major: element (row, k) at start + (row / 8) SBO + (row % 8) 128 + 2 k; MN-major (B transposed): element
//     (k, n) at start + (n / 64) LBO + (k / 8) SBO + (k % 8) 128 + 2 (n % 64), an MN-major A (m, k) likewise
//     with m for n. A product runs at issue or at the
//     wait that retires its group (copy_mode, as cp.async; in issue order), reading its registers and shared
//     memory then: a kernel that touches them in between sees the difference.
// Shared addresses are byte offsets into the block's shared memory.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "emu_runtime.h"

#define TSCALE_ATTENTION_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
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
    r.current->copies.open.push_back([] {});  // still counts in its group
  } else {
    r.current->copies.open.push_back(copy);
  }
}

inline void cp_async_commit() { emu::rt().current->copies.commit(); }

template <int N>
inline void cp_async_wait() {
  emu::rt().current->copies.retire(N);
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
inline bool warp_any(bool pred) {  // true for every lane when it is true for any
  bool result = false;
  emu::collective(20, &pred, &result, [](emu::Fiber** lanes) {
    bool any = false;
    for (int L = 0; L < 32; ++L) any = any || *static_cast<const bool*>(lanes[L]->in);
    for (int L = 0; L < 32; ++L) *static_cast<bool*>(lanes[L]->out) = any;
  });
  return result;
}

// Fibers never run at once, so read-modify-write is atomic here.
inline void atomic_add_f32(float* p, float v) { *p += v; }
inline int atomic_fetch_add_i32(int* p, int v) {  // (fibers take turns: no other thread runs in between)
  const int old = *p;
  *p += v;
  return old;
}
inline void atomic_add_f32x4(float* p, float a, float b, float c, float d) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("atomic_add_f32x4 at an address that is not 16-byte aligned");
  p[0] += a;
  p[1] += b;
  p[2] += c;
  p[3] += d;
}
inline void load_f32x4(float (&v)[4], const float* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("load_f32x4 at an address that is not 16-byte aligned");
  std::memcpy(v, p, 16);
}
inline void load_u32x4(uint32_t (&v)[4], const uint16_t* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) emu::fail("load_u32x4 at an address that is not 16-byte aligned");
  std::memcpy(v, p, 16);
}
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

// ---- Hopper warpgroup products (the names of csrc/attention/wgmma_sm90.cuh) ----

inline void wgmma_fence() {}
inline void fence_proxy_async() {}
template <int N>
inline void fence_registers(float (&)[N]) {}
template <int N>
inline void fence_registers(uint32_t (&)[N][4]) {}

// The bf16 value at a byte offset in shared memory, after the 128-byte swizzle.
inline float smem_bf16_sw128(uint32_t addr) {
  addr ^= ((addr >> 7) & 7u) << 4;
  return bf16_to_float(load_u16(shared_at(addr, 2, 2)));
}

struct WgmmaDesc {
  uint32_t start, lbo, sbo;
};

inline WgmmaDesc decode_desc(uint64_t d) {
  if ((d >> 62) != 1) emu::fail("wgmma: only 128-byte swizzled operands are emulated");
  if (((d >> 49) & 7u) != 0) emu::fail("wgmma: a descriptor base offset other than 0");
  return WgmmaDesc{static_cast<uint32_t>(d & 0x3FFFu) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFFu) << 4,
                   static_cast<uint32_t>((d >> 32) & 0x3FFFu) << 4};
}

// K-major operand element (row, k), row over M or N, k < 16.
inline float k_major(const WgmmaDesc& d, int row, int k) {
  return smem_bf16_sw128(d.start + (row / 8) * d.sbo + (row % 8) * 128 + 2 * k);
}

// MN-major operand element (k, n): B read transposed.
inline float mn_major(const WgmmaDesc& d, int k, int n) {
  return smem_bf16_sw128(d.start + (n / 64) * d.lbo + (k / 8) * d.sbo + (k % 8) * 128 + 2 * (n % 64));
}

struct WgmmaOperands {
  float* d;            // this thread's accumulator fragment
  const uint32_t* a;   // this thread's A fragment (register form), or nullptr
  uint64_t a_desc, b_desc;
  int accumulate;
};

// D (64 x N) = A (64 x 16) B (16 x N) (+ D), queued on the warpgroup; A from shared memory, K-major or
// (a_mn_major) MN-major, or from registers; B from shared memory, K-major or (b_mn_major) MN-major.
template <int N>
inline void wgmma_issue(const WgmmaOperands& ops, bool a_mn_major, bool b_mn_major) {
  emu::warpgroup_collective(7, &ops, nullptr, [a_mn_major, b_mn_major](emu::Fiber** lanes, int wg) {
    // The operands by value (the structs live in the issuing frames); the fragments they point to are the
    // kernel's, which it must leave alone until the wait.
    std::vector<WgmmaOperands> each(128);
    for (int L = 0; L < 128; ++L) {
      each[L] = *static_cast<const WgmmaOperands*>(lanes[L]->in);
      if (each[L].a_desc != each[0].a_desc || each[L].b_desc != each[0].b_desc ||
          each[L].accumulate != each[0].accumulate || (each[L].a == nullptr) != (each[0].a == nullptr))
        emu::fail("wgmma: threads of one warpgroup issued different operands");
    }
    auto run = [each, a_mn_major, b_mn_major] {
      const WgmmaOperands& o = each[0];
      float A[64][16], B[16][N];
      auto lo = [](uint32_t x) { return bf16_to_float(static_cast<uint16_t>(x & 0xFFFFu)); };
      auto hi = [](uint32_t x) { return bf16_to_float(static_cast<uint16_t>(x >> 16)); };
      if (o.a == nullptr) {
        const WgmmaDesc ad = decode_desc(o.a_desc);
        for (int m = 0; m < 64; ++m)
          for (int k = 0; k < 16; ++k) A[m][k] = a_mn_major ? mn_major(ad, k, m) : k_major(ad, m, k);
      } else {
        for (int L = 0; L < 128; ++L) {
          const uint32_t* a = each[L].a;
          const int r = 16 * (L / 32) + ((L % 32) >> 2), c = 2 * (L & 3);
          A[r][c] = lo(a[0]), A[r][c + 1] = hi(a[0]);
          A[r + 8][c] = lo(a[1]), A[r + 8][c + 1] = hi(a[1]);
          A[r][c + 8] = lo(a[2]), A[r][c + 9] = hi(a[2]);
          A[r + 8][c + 8] = lo(a[3]), A[r + 8][c + 9] = hi(a[3]);
        }
      }
      const WgmmaDesc bd = decode_desc(o.b_desc);
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < N; ++n) B[k][n] = b_mn_major ? mn_major(bd, k, n) : k_major(bd, n, k);
      for (int L = 0; L < 128; ++L) {
        float* d = each[L].d;
        const int r0 = 16 * (L / 32) + ((L % 32) >> 2), c0 = 2 * (L & 3);
        for (int j = 0; j < N / 8; ++j)
          for (int e = 0; e < 4; ++e) {
            const int r = r0 + 8 * (e >> 1), c = 8 * j + c0 + (e & 1);
            double acc = o.accumulate ? d[4 * j + e] : 0.0;
            for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[r][k]) * B[k][c];
            d[4 * j + e] = static_cast<float>(acc);
          }
      }
    };
    emu::Runtime& r = emu::rt();
    emu::WarpgroupQueue& q = r.wgmma[wg];
    const bool early = q.deferred == 0 && (r.copy_mode == 1 || (r.copy_mode == 0 && (r.rng() & 1)));
    if (early) {
      run();
      q.open.push_back([] {});  // still counts in its group
    } else {
      ++q.deferred;
      q.open.push_back([run, &q] {
        run();
        --q.deferred;
      });
    }
  });
}

template <int N, int TRANS_A = 0, int TRANS_B = 0>
inline void wgmma_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  wgmma_issue<N>(WgmmaOperands{d, nullptr, a_desc, b_desc, accumulate}, TRANS_A != 0, TRANS_B != 0);
}

inline void wgmma_rs_n128_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
  wgmma_issue<128>(WgmmaOperands{d, a, 0, b_desc, 1}, false, true);
}

inline void wgmma_commit() {
  emu::warpgroup_collective(8, nullptr, nullptr, [](emu::Fiber**, int wg) {
    emu::rt().wgmma[wg].commit();
  });
}

template <int N>
inline void wgmma_wait() {
  emu::warpgroup_collective(9 + N, nullptr, nullptr, [](emu::Fiber**, int wg) {
    emu::rt().wgmma[wg].retire(N);
  });
}

// ---- Hopper data movement (the names of csrc/attention/tma_sm90.cuh) ----

// A bf16 (B, H, T, 128) tensor as tma_load_half reads it: element strides (t, h, b), boxes of box_rows rows.
struct TileMap {
  const uint16_t* base;
  int64_t st, sh, sb;
  int B, H, T, box_rows;
};

inline void mbar_init(uint32_t bar, int count) {
  shared_at(bar, 8, 8);
  if (count < 1) emu::fail("mbarrier.init with a count below 1");
  emu::Mbarrier m;
  m.count = m.pending = count;
  emu::rt().mbarriers[bar] = m;
}
inline void fence_mbarrier_init() {}

inline void mbar_arrive(uint32_t bar) {
  emu::Mbarrier& m = emu::mbarrier_at(bar);
  if (--m.pending < 0) emu::fail("more arrivals on an mbarrier than its count");
  emu::mbarrier_progress(bar, m);
}

inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  emu::mbarrier_at(bar).tx += bytes;
  mbar_arrive(bar);
}

inline void mbar_wait(uint32_t bar, uint32_t parity) { emu::mbarrier_wait(bar, static_cast<int>(parity & 1)); }

// A TMA load's landing, `land` (which copies its bytes), run when copy_mode says: at issue, or at the first wait on
// bar; the bytes then count on bar.
template <typename Land>
inline void tma_schedule(uint32_t bar, int64_t bytes, Land land) {
  emu::mbarrier_at(bar);
  auto landing = [bar, bytes, land] {
    land();
    emu::Mbarrier& m = emu::mbarrier_at(bar);
    m.tx -= bytes;
    emu::mbarrier_progress(bar, m);
  };
  emu::Runtime& r = emu::rt();
  const bool early = r.copy_mode == 1 || (r.copy_mode == 0 && (r.rng() & 1));
  if (early) {
    landing();
    return;
  }
  emu::mbarrier_at(bar).late_loads.push_back(landing);
  for (auto& f : r.fibers)  // a thread already asleep on bar wakes to land it, as the first wait after the issue
    if (f->state == emu::State::kMbarrier && f->mbarrier == bar) f->state = emu::State::kReady;
}

// The box (box_rows x 64 head dims from d0) lands in the swizzled half at dst (tma_schedule).
inline void tma_load_half(uint32_t dst, const TileMap& map, uint32_t bar, int d0, int row, int h, int b) {
  if (dst % 1024 != 0) emu::fail("tma_load_half: a 128-byte swizzled destination must be 1024-byte aligned");
  if (d0 % 64 != 0 || d0 < 0 || d0 >= 128) emu::fail("tma_load_half: d0 must be 0 or 64");
  if (h < 0 || h >= map.H || b < 0 || b >= map.B) emu::fail("tma_load_half: (b, h) outside the tensor");
  shared_at(dst, static_cast<size_t>(map.box_rows) * 128, 1024);
  tma_schedule(bar, static_cast<int64_t>(map.box_rows) * 128, [dst, map, d0, row, h, b] {
    for (int r = 0; r < map.box_rows; ++r) {
      const int t = row + r;
      for (int c = 0; c < 8; ++c) {
        uint32_t a = dst + r * 128 + c * 16;
        a ^= ((a >> 7) & 7u) << 4;
        unsigned char* out = emu::rt().smem + a;
        if (t >= 0 && t < map.T) std::memcpy(out, map.base + b * map.sb + h * map.sh + t * map.st + d0 + c * 8, 16);
        else std::memset(out, 0, 16);
      }
    }
  });
}

// A 1D array of 4-byte elements as tma_load_vec reads it: n elements, boxes of `box`.
struct VecMap {
  const unsigned char* base;
  int64_t n;
  int box;
};

// Elements [start, start + box) land at dst (128-byte aligned), zeros past the array's end (tma_schedule). The box
// must start on a 16-byte boundary of global memory: the GPU faults (illegal instruction) where it does not.
inline void tma_load_vec(uint32_t dst, const VecMap& map, uint32_t bar, int start) {
  if (dst % 128 != 0) emu::fail("tma_load_vec: the destination must be 128-byte aligned");
  if ((reinterpret_cast<uintptr_t>(map.base) + static_cast<int64_t>(start) * 4) % 16 != 0)
    emu::fail("tma_load_vec: the box must start on a 16-byte boundary of global memory");
  shared_at(dst, static_cast<size_t>(map.box) * 4, 128);
  tma_schedule(bar, static_cast<int64_t>(map.box) * 4, [dst, map, start] {
    for (int i = 0; i < map.box; ++i) {
      const int64_t e = static_cast<int64_t>(start) + i;
      unsigned char* out = emu::rt().smem + dst + i * 4;
      if (e >= 0 && e < map.n) std::memcpy(out, map.base + e * 4, 4);
      else std::memset(out, 0, 4);
    }
  });
}

inline VecMap make_vec_map(const void* base, int64_t n, int box) {
  return VecMap{static_cast<const unsigned char*>(base), n, box};
}

inline void named_barrier_sync(int id, int count) { emu::named_barrier(id, count, true); }
inline void named_barrier_arrive(int id, int count) { emu::named_barrier(id, count, false); }

template <int N>
inline void setmaxnreg_dec() {}
template <int N>
inline void setmaxnreg_inc() {}

// StridesT: attention_common.cuh's Strides, defined after this header.
template <typename StridesT>
inline TileMap make_tile_map(const uint16_t* base, const StridesT& s, int B, int H, int T, int box_rows) {
  return TileMap{base, s.t, s.h, s.b, B, H, T, box_rows};
}

// ---- host side ----

inline void check_device(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, " (emulated): ", name, " must be CPU tensors");
}

struct DeviceScope {
  explicit DeviceScope(const at::Tensor&) {}
};

// The emulated device's multiprocessors: few, so that a persistent kernel's blocks each walk several work tiles.
inline int multiprocessor_count() { return 3; }

inline at::Tensor zeroed_i32(int64_t n) { return at::zeros({n}, at::kInt); }

// The emulated multiprocessor's shared memory: a launch's limit (by default sm_86 / sm_89's 99 KB) and the
// kBlockReservedSmem each resident block also holds (100 KB there).
constexpr int kBlockReservedSmem = 1024;
inline int smem_per_multiprocessor() { return static_cast<int>(emu::rt().smem_limit) + kBlockReservedSmem; }

// Launches with at most emu::rt().smem_limit bytes of dynamic shared memory: the opt-in limit of sm_86 / sm_89,
// the smallest of the targets, unless an entry for Hopper kernels raised it to sm_90's.
template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  TORCH_CHECK(smem <= emu::rt().smem_limit, "emulated launch: ", smem, " bytes of shared memory exceed the limit of ",
              emu::rt().smem_limit);
  TORCH_CHECK(grid.y <= 65535 && grid.z <= 65535, "emulated launch: grid too large");
  std::tuple<std::decay_t<Args>...> held(std::forward<Args>(args)...);
  emu::launch(emu::Dim3{grid.x, grid.y, grid.z}, emu::Dim3{block.x, block.y, block.z}, smem,
              [&] { std::apply(kernel, held); });
}

}  // namespace
}  // namespace tscale::attn
