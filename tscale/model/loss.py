"""Next-token cross-entropy: on logits in float32, or straight from the head's input (in chunks or by kernel)."""

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tscale.ops.fused_loss import chunked_head_loss, default_chunk
from tscale.ops.head_loss import head_loss


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token loss in nats: logits (B, T, V), targets (B, T) -> (B, T)."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T), reduction="none").view(B, T)


def token_losses_in_chunks(tail: Callable, hidden: torch.Tensor, feats: tuple | None, targets: torch.Tensor,
                           vocab_size: int) -> torch.Tensor:
    """Per-token losses (B, T) of a model's tail over hidden (B, T, C), a chunk of tokens at a time
    (tscale.ops.fused_loss.default_chunk), so that no buffer holds more than a chunk's logits: on a CPU the whole
    (B, T, V) buffers are mapped and zeroed anew at every call. tail(hidden (1, n, C), the index features of those
    n positions or None, targets (1, n)) -> losses (1, n): the head, its soft-cap and the index's mixture, each of
    which works position by position; gradients flow through it as through one call."""
    B, T, C = hidden.shape
    h, y = hidden.reshape(1, B * T, C), targets.reshape(1, B * T)
    f = type(feats)(*(t.reshape(1, B * T, *t.shape[2:]) for t in feats)) if feats is not None else None
    chunk = default_chunk(hidden.device, vocab_size)
    out = [tail(h[:, lo:lo + chunk], type(f)(*(t[:, lo:lo + chunk] for t in f)) if f is not None else None,
                y[:, lo:lo + chunk]) for lo in range(0, B * T, chunk)]  # each (1, n)
    return torch.cat(out, dim=1).view(B, T)


def run_tail(tail: Callable, hidden: torch.Tensor, feats: tuple | None, targets: torch.Tensor | None,
             vocab_size: int) -> torch.Tensor:
    """A model's tail(hidden, feats, targets) over the whole batch, except per-token losses on a CPU: those in
    chunks (token_losses_in_chunks); on a GPU the caching allocator reuses the whole logits' buffers."""
    if targets is not None and hidden.device.type == "cpu":
        return token_losses_in_chunks(tail, hidden, feats, targets, vocab_size)  # (B, T)
    return tail(hidden, feats, targets)


def mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T))


HEAD_LOSSES = ("kernel", "chunked")  # how a model's loss_targets path makes its mean loss


def head_mean_loss(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                   softcap: float = 0.0, index_adapter: nn.Module | None = None, how: str = "kernel") -> torch.Tensor:
    """Mean loss of the head (a plain nn.Linear) over hidden (B, T, C) and targets (B, T) -> scalar, the logits
    never kept: "kernel" makes them whole and reduces them with their gradient in one pass
    (tscale.ops.head_loss), "chunked" a chunk of tokens at a time (tscale.ops.fused_loss). Not for models with
    the token index, whose loss is the mixture's (index_adapter: the model's, None without the index)."""
    if index_adapter is not None:
        raise ValueError("the head's fused losses are for models without the token index (their loss is the mixture's)")
    if type(head) is not nn.Linear or head.bias is not None:
        raise ValueError(f"the head's fused losses need the head as a plain nn.Linear without bias, not "
                         f"{type(head).__name__} (keep the head out of precision's converted layers)")
    if how not in HEAD_LOSSES:
        raise ValueError(f"head loss {how!r}: choose one of {', '.join(HEAD_LOSSES)}")
    loss = head_loss if how == "kernel" else chunked_head_loss
    return loss(hidden.flatten(0, 1), head.weight, targets.flatten(), vocab_size, softcap)
