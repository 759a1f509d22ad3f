// Sign bit-packing for 1-bit gradient compression: CUDA kernels for the ops of bitpack.cpp.
//
// pack_signs: one block per chunk. Each thread packs whole bytes (8 values: bit j of byte i is
//   1 iff x[8i+j] >= 0) and sums |x| as it goes; a block reduction gives the chunk's mean |x|.
// unpack_signs / unpack_signs_accumulate_: one thread per byte writes its 8 values,
//   scale[c] * (bit ? +1 : -1), or adds them to `out`.
// Same semantics as the CPU kernels and the references in tscale/ops/bitpack.py.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "bitpack_checks.h"

namespace tscale {
namespace {

constexpr int kMaxThreads = 256;

template <int kThreads>
__global__ void pack_kernel(const float* __restrict__ x, uint8_t* __restrict__ bits, float* __restrict__ scales,
                            int64_t n, int64_t chunk) {
  const int64_t c = blockIdx.x;
  const int64_t lo = c * chunk;
  const int64_t hi = lo + chunk < n ? lo + chunk : n;
  const int64_t first_byte = lo / 8, last_byte = (hi + 7) / 8;
  double abs_sum = 0.0;  // per byte in float, across bytes in double (as precise as the CPU kernel)
  for (int64_t b = first_byte + threadIdx.x; b < last_byte; b += kThreads) {
    const int64_t i = b * 8;
    uint8_t byte = 0;
    float byte_sum = 0.f;
    if (i + 8 <= hi) {
      const float4* p = reinterpret_cast<const float4*>(x + i);  // x is 16-byte aligned; i % 8 == 0
      const float4 a = p[0], d = p[1];
      const float v[8] = {a.x, a.y, a.z, a.w, d.x, d.y, d.z, d.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        byte_sum += fabsf(v[j]);
        byte |= static_cast<uint8_t>(v[j] >= 0.f) << j;
      }
    } else {
      for (int64_t j = i; j < hi; ++j) {
        byte_sum += fabsf(x[j]);
        byte |= static_cast<uint8_t>(x[j] >= 0.f) << (j - i);
      }
    }
    abs_sum += byte_sum;
    bits[b] = byte;
  }
  __shared__ double partial[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) abs_sum += __shfl_down_sync(0xffffffff, abs_sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = abs_sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    double s = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_down_sync(0xffffffff, s, offset);
    if (threadIdx.x == 0) scales[c] = static_cast<float>(s / static_cast<double>(hi - lo));
  }
}

__global__ void unpack_kernel(const uint8_t* __restrict__ bits, const float* __restrict__ scales,
                              float* __restrict__ out, int64_t n, int64_t chunk, bool accumulate) {
  const int64_t n_bytes = (n + 7) / 8;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < n_bytes;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = b * 8;
    const float s = scales[i / chunk];  // chunk % 8 == 0: a byte never straddles two chunks
    const uint8_t byte = bits[b];
    if (i + 8 <= n) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = ((byte >> j) & 1) ? s : -s;
      float4* p = reinterpret_cast<float4*>(out + i);
      float4 a = make_float4(v[0], v[1], v[2], v[3]), d = make_float4(v[4], v[5], v[6], v[7]);
      if (accumulate) {
        const float4 oa = p[0], od = p[1];
        a.x += oa.x; a.y += oa.y; a.z += oa.z; a.w += oa.w;
        d.x += od.x; d.y += od.y; d.z += od.z; d.w += od.w;
      }
      p[0] = a;
      p[1] = d;
    } else {
      for (int64_t j = i; j < n; ++j) {
        const float v = ((byte >> (j - i)) & 1) ? s : -s;
        out[j] = accumulate ? out[j] + v : v;
      }
    }
  }
}

void check_aligned(const at::Tensor& t, const char* what) {
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, what, ": the CUDA kernel needs 16-byte aligned data");
}

std::tuple<at::Tensor, at::Tensor> pack_signs_cuda(const at::Tensor& x_in, int64_t chunk) {
  check_pack_args(x_in, chunk);
  const c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous();
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) x = x.clone();
  const int64_t n = x.numel();
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  at::Tensor bits = at::empty({(n + 7) / 8}, x.options().dtype(at::kByte));
  at::Tensor scales = at::empty({n_chunks}, x.options());
  if (n == 0) return {bits, scales};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t bytes_per_chunk = chunk / 8;
  if (bytes_per_chunk <= 32) {
    pack_kernel<32><<<n_chunks, 32, 0, stream>>>(x.data_ptr<float>(), bits.data_ptr<uint8_t>(),
                                                   scales.data_ptr<float>(), n, chunk);
  } else if (bytes_per_chunk <= 128) {
    pack_kernel<128><<<n_chunks, 128, 0, stream>>>(x.data_ptr<float>(), bits.data_ptr<uint8_t>(),
                                                     scales.data_ptr<float>(), n, chunk);
  } else {
    pack_kernel<kMaxThreads><<<n_chunks, kMaxThreads, 0, stream>>>(x.data_ptr<float>(), bits.data_ptr<uint8_t>(),
                                                                   scales.data_ptr<float>(), n, chunk);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {bits, scales};
}

void launch_unpack(const at::Tensor& bits_in, const at::Tensor& scales_in, at::Tensor& out, int64_t chunk,
                   bool accumulate) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const at::Tensor bits = bits_in.contiguous();
  const at::Tensor scales = scales_in.contiguous();
  check_aligned(out, "unpack_signs");
  const int64_t n_bytes = (n + 7) / 8;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n_bytes + threads - 1) / threads, 65535LL * 32);
  unpack_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      bits.data_ptr<uint8_t>(), scales.data_ptr<float>(), out.data_ptr<float>(), n, chunk, accumulate);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor unpack_signs_cuda(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t chunk) {
  check_unpack_args(bits, scales, n, chunk);
  const c10::cuda::CUDAGuard guard(bits.device());
  at::Tensor out = at::empty({n}, scales.options());
  launch_unpack(bits, scales, out, chunk, false);
  return out;
}

void unpack_signs_accumulate_cuda(at::Tensor& out, const at::Tensor& bits, const at::Tensor& scales, int64_t chunk) {
  check_accumulate_out(out, bits, "unpack_signs_accumulate_");
  check_unpack_args(bits, scales, out.numel(), chunk);
  const c10::cuda::CUDAGuard guard(out.device());
  if (reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 != 0) {
    at::Tensor aligned = out.clone();
    launch_unpack(bits, scales, aligned, chunk, true);
    out.copy_(aligned);
    return;
  }
  launch_unpack(bits, scales, out, chunk, true);
}

}  // namespace

TORCH_LIBRARY_IMPL(tscale, CUDA, m) {
  m.impl("pack_signs", &pack_signs_cuda);
  m.impl("unpack_signs", &unpack_signs_cuda);
  m.impl("unpack_signs_accumulate_", &unpack_signs_accumulate_cuda);
}

}  // namespace tscale
