// Argument checks shared by the CPU and CUDA sign-packing kernels (one message per mistake).
#pragma once

#include <ATen/ATen.h>

namespace tscale {

inline void check_pack_args(const at::Tensor& x, int64_t chunk) {
  TORCH_CHECK(x.dim() == 1, "pack_signs: x must be 1-D, got ", x.dim(), "-D");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "pack_signs: x must be float32");
  TORCH_CHECK(chunk > 0 && chunk % 8 == 0, "pack_signs: chunk must be a positive multiple of 8, got ", chunk);
}

inline void check_unpack_args(const at::Tensor& bits, const at::Tensor& scales, int64_t n, int64_t chunk) {
  TORCH_CHECK(bits.dim() == 1 && bits.scalar_type() == at::kByte, "unpack_signs: bits must be 1-D uint8");
  TORCH_CHECK(scales.dim() == 1 && scales.scalar_type() == at::kFloat, "unpack_signs: scales must be 1-D float32");
  TORCH_CHECK(chunk > 0 && chunk % 8 == 0, "unpack_signs: chunk must be a positive multiple of 8, got ", chunk);
  TORCH_CHECK(bits.numel() == (n + 7) / 8, "unpack_signs: ", bits.numel(), " bytes cannot hold ", n, " signs");
  TORCH_CHECK(scales.numel() == (n + chunk - 1) / chunk, "unpack_signs: expected ", (n + chunk - 1) / chunk,
              " scales, got ", scales.numel());
  TORCH_CHECK(bits.device() == scales.device(), "unpack_signs: bits and scales must be on one device");
}

inline void check_accumulate_out(const at::Tensor& out, const at::Tensor& bits, const char* op) {
  TORCH_CHECK(out.dim() == 1 && out.is_contiguous() && out.scalar_type() == at::kFloat, op,
              ": out must be contiguous 1-D float32");
  TORCH_CHECK(out.device() == bits.device(), op, ": out and bits must be on one device");
}

}  // namespace tscale
