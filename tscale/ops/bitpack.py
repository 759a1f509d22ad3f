"""Sign bit-packing (1-bit compression): torch references and the dispatch to tscale._C.

pack_signs(x (N,) float32, chunk) -> bits (ceil(N/8),) uint8, scales (ceil(N/chunk),) float32
    bit j of byte i is 1 iff x[8i + j] >= 0; scales[c] = mean |x| over chunk c
unpack_signs(bits, scales, N, chunk) -> (N,) float32, scales[i // chunk] * (+1 or -1)
unpack_signs_accumulate_(out, bits, scales, chunk): out += unpack_signs(bits, scales, N, chunk)
pack_signs_feedback_(x, chunk) -> pack_signs(x, chunk), and x -= unpack_signs(bits, scales, N, chunk) in place
    (error feedback: x keeps what the signs failed to carry; one pass on CPU, two kernels elsewhere)
pack_signs_feedback_add_(x, add, chunk): x[:len(add)] += add, then pack_signs_feedback_(x, chunk)
    (one pass on CPU)
unpack_signs_into_(out, bits, scales, chunk): out = unpack_signs(bits, scales, N, chunk), in place
    (written without reading out on CPU)

mean |x| is the scale that minimises ||x - s * sign(x)||^2, so a chunk keeps its L1 mass.
`chunk` must be a multiple of 8 so that chunks start on byte boundaries.
"""

import torch

from tscale.ops.backend import kernels_usable_on

_BIT_WEIGHTS = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8)


def _check_chunk(chunk: int) -> None:
    if chunk <= 0 or chunk % 8:
        raise ValueError(f"chunk must be a positive multiple of 8, got {chunk}")


def pack_signs_reference(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check_chunk(chunk)
    n = x.numel()
    n_chunks = -(-n // chunk)
    absx = torch.zeros(n_chunks * chunk, dtype=torch.float64, device=x.device)
    absx[:n] = x.abs().double()
    counts = torch.full((n_chunks,), float(chunk), dtype=torch.float64, device=x.device)
    counts[-1] = n - (n_chunks - 1) * chunk
    scales = (absx.view(n_chunks, chunk).sum(1) / counts).float()  # (n_chunks,)
    signs = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=x.device)
    signs[:n] = (x >= 0).to(torch.uint8)
    bits = (signs.view(-1, 8) * _BIT_WEIGHTS.to(x.device)).sum(1, dtype=torch.uint8)  # (ceil(N/8),)
    return bits, scales


def unpack_signs_reference(bits: torch.Tensor, scales: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
    _check_chunk(chunk)
    signs = (bits.view(-1, 1) & _BIT_WEIGHTS.to(bits.device)).ne(0).view(-1)[:numel]  # (N,)
    per_elem = scales.repeat_interleave(chunk)[:numel]  # (N,)
    return torch.where(signs, per_elem, -per_elem)


def _use_kernel(t: torch.Tensor) -> bool:
    return kernels_usable_on(t.device.type)


def pack_signs(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_kernel(x):
        return torch.ops.tscale.pack_signs(x.reshape(-1).float(), chunk)
    return pack_signs_reference(x.reshape(-1).float(), chunk)


def unpack_signs(bits: torch.Tensor, scales: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
    if _use_kernel(bits):
        return torch.ops.tscale.unpack_signs(bits, scales, numel, chunk)
    return unpack_signs_reference(bits, scales, numel, chunk)


def unpack_signs_accumulate_(out: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor, chunk: int) -> None:
    if _use_kernel(out):
        torch.ops.tscale.unpack_signs_accumulate_(out, bits, scales, chunk)
    else:
        out += unpack_signs_reference(bits, scales, out.numel(), chunk)


def pack_signs_feedback_reference(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    bits, scales = pack_signs_reference(x, chunk)
    x -= unpack_signs_reference(bits, scales, x.numel(), chunk)
    return bits, scales


def pack_signs_feedback_(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N,) float32 contiguous: its packed signs and scales; x becomes the residual x - unpack(...)."""
    if x.device.type == "cpu" and _use_kernel(x):
        return torch.ops.tscale.pack_signs_feedback_(x, chunk)
    if _use_kernel(x):
        bits, scales = torch.ops.tscale.pack_signs(x, chunk)
        torch.ops.tscale.unpack_signs_accumulate_(x, bits, -scales, chunk)
        return bits, scales
    return pack_signs_feedback_reference(x, chunk)


def pack_signs_feedback_add_(x: torch.Tensor, add: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N,) float32 contiguous, add (n <= N,): x[:n] += add, then pack_signs_feedback_(x, chunk)."""
    if x.device.type == "cpu" and add.dtype == torch.float32 and _use_kernel(x):
        return torch.ops.tscale.pack_signs_feedback_add_(x, add.reshape(-1), chunk)
    x[: add.numel()] += add.reshape(-1)
    return pack_signs_feedback_(x, chunk)


def unpack_signs_into_(out: torch.Tensor, bits: torch.Tensor, scales: torch.Tensor, chunk: int) -> None:
    """out (N,) float32 contiguous <- unpack_signs(bits, scales, N, chunk)."""
    if out.device.type == "cpu" and _use_kernel(out):
        torch.ops.tscale.unpack_signs_into_(out, bits, scales, chunk)
    else:
        unpack_signs_accumulate_(out.zero_(), bits, scales, chunk)
