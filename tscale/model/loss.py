"""Next-token cross-entropy on logits, computed in float32."""

import torch
import torch.nn.functional as F


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss in nats: logits (B, T, V), targets (B, T) -> (B, T)."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)


def mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T))
