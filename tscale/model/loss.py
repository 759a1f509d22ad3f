"""Next-token cross-entropy: on logits, computed in float32, or straight from the head's input in chunks."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from tscale.ops.fused_loss import chunked_head_loss


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss in nats: logits (B, T, V), targets (B, T) -> (B, T)."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)


def mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T))


def chunked_mean_loss(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                      softcap: float = 0.0, index_adapter: nn.Module | None = None) -> torch.Tensor:
    """Mean loss of the head (a plain nn.Linear) over hidden (B, T, C) and targets (B, T), logits made a chunk of
    tokens at a time and never kept (tscale.ops.fused_loss) -> scalar. Not for models with the token index,
    whose loss is the mixture's (index_adapter: the model's, None without the index)."""
    if index_adapter is not None:
        raise ValueError("the chunked head loss is for models without the token index (their loss is the mixture's)")
    if type(head) is not nn.Linear or head.bias is not None:
        raise ValueError(f"the chunked head loss needs the head as a plain nn.Linear without bias, not "
                         f"{type(head).__name__} (keep the head out of precision's converted layers)")
    return chunked_head_loss(hidden.flatten(0, 1), head.weight, targets.flatten(), vocab_size, softcap)
