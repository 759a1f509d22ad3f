"""Attention over a training batch's document runs: which op serves each train.attention choice besides "auto".

train.attention = "<backend>" runs every layer through the backend's op over the batch's DocRuns,
"<backend>_global" only the global layers (the windowed ones keep tscale.ops.attention):
  fa2    torch's FlashAttention-2 (tscale/ops/attention_fa2.py)
  cudnn  cuDNN's attention, Hopper and newer (tscale/ops/attention_cudnn.py)
"""

import torch

from tscale.ops.attention_cudnn import attention_cudnn, cudnn_unusable_reason
from tscale.ops.attention_fa2 import attention_fa2, fa2_unusable_reason
from tscale.ops.doc_runs import DocRuns

DESCRIBED = {"fa2": "torch's FlashAttention-2", "cudnn": "cuDNN's attention"}  # backend -> what it runs
_OPS = {"fa2": attention_fa2, "cudnn": attention_cudnn}
UNUSABLE = {"fa2": fa2_unusable_reason, "cudnn": cudnn_unusable_reason}  # backend -> why it cannot run, or None


def parse_choice(attention: str) -> tuple[str, bool]:
    """A train.attention choice other than "auto" -> (backend, whether the windowed layers take it too)."""
    return attention.removesuffix("_global"), not attention.endswith("_global")


def unusable_reason(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why `backend` cannot run attention here, or None."""
    return UNUSABLE[backend](device, dtype, head_dim)


def attention_over_runs(q, k, v, runs: DocRuns, *, window: int, sink: bool, scale: float) -> torch.Tensor:
    """q, k, v (B, T, H, D) through runs.backend's op within the runs, window and sink -> (B, T, H, D)."""
    return _OPS[runs.backend](q, k, v, runs, window=window, sink=sink, scale=scale)


__all__ = ["DESCRIBED", "UNUSABLE", "attention_over_runs", "parse_choice", "unusable_reason"]
