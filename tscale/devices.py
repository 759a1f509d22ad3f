"""Device and precision choice, and the dense bf16 peak rates used for MFU."""

import torch

from tscale.errors import UserError

# Dense bf16 tensor-core peak FLOP/s by GPU name (datasheet figures, without sparsity).
BF16_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "L40S": 362e12,
    "A10G": 70e12,
}


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """"auto", "cpu", "cuda" or "cuda:N" as a torch.device; `option` names the setting in errors."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"{option} = {name!r}: not a device (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{option} = {name!r}: no CUDA GPU is visible; use cpu or auto")
    return device


def resolve_autocast_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for plain float32."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return torch.bfloat16 if name == "bfloat16" else None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    gpu = torch.cuda.get_device_name(device)
    for key, flops in BF16_PEAK_FLOPS.items():
        if key in gpu:
            return flops
    return None
