"""The head's mean cross-entropy computed in chunks of tokens: logits (with the optional soft-cap) never held whole.

A training step's head makes (N, V) logits for N tokens (32,768 x 50,304 at the 124M presets:
3.3 GB in bf16, 6.6 GB as the fp32 soft-capped logits the loss reads) only to reduce them to one
number. `chunked_head_loss` walks the tokens in chunks instead: for each chunk it makes the
chunk's logits, soft-caps them, takes the loss and, since the loss is the step's last operation,
its gradient at once (softmax - one-hot, times the soft-cap's derivative), and turns that into
the chunk's gradients of the hidden states and of the head weight. The backward only scales the
saved gradients by the upstream gradient, a scalar (hence a mean loss only: per-token losses
with their own upstream gradients take the plain path). The arithmetic is that of
`head_loss_reference` (tests/test_fused_loss.py compares them, backward included).

Shapes: hidden (N, d), weight (V_padded, d), targets (N,) in [0, vocab_size); logits past
vocab_size (the padding rows of the head) are left out, as the plain path slices them off.
"""

import torch
import torch.nn.functional as F

DEFAULT_CHUNK = 2048  # tokens of logits at a time on a GPU (2048 x 50,257 fp32: 0.4 GB a buffer)
# On a CPU a chunk's fp32 logits stay under 24 MiB: glibc maps every buffer above its mmap threshold afresh
# (32 MiB at most, where CPU training sets it: tscale/train/cpu_allocator.py) and the kernel zeroes each page of
# it again, which made 2,048-token chunks at 50,257 tokens of vocabulary 1.4x slower than 128-token ones on a
# 2-core machine (docs/BENCHMARKS.md).
CPU_CHUNK_ELEMENTS = 6 << 20


def default_chunk(device: torch.device, vocab_size: int) -> int:
    """Tokens of logits per chunk: DEFAULT_CHUNK on a GPU, CPU_CHUNK_ELEMENTS / vocab_size (at least 1) elsewhere."""
    return DEFAULT_CHUNK if device.type == "cuda" else max(1, CPU_CHUNK_ELEMENTS // vocab_size)


def head_loss_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                        softcap: float) -> torch.Tensor:
    """Mean cross-entropy of softcap(hidden @ weight^T)[:, :vocab_size], as the models' plain path computes it."""
    logits = F.linear(hidden, weight)  # (N, V_padded)
    if softcap:
        logits = softcap * torch.tanh(logits.float() / softcap)
    return F.cross_entropy(logits[:, :vocab_size].float(), targets)


class _ChunkedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_size: int, softcap: float, chunk: int):
        N = hidden.shape[0]
        compute = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
            else hidden.dtype
        w = weight.to(compute)  # (V_padded, d), cast once for every chunk
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = torch.empty_like(hidden)  # (N, d)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # (V_padded, d)
        with torch.autocast(hidden.device.type, enabled=False):
            for lo in range(0, N, chunk):
                h = hidden[lo:lo + chunk].to(compute)  # (n, d)
                y = targets[lo:lo + chunk]  # (n,)
                s = (h @ w.t())[:, :vocab_size].float()  # (n, V) logits
                if softcap:
                    t = s.div_(softcap).tanh_()  # (n, V), in place: the logits are not needed again
                    s = t * softcap  # soft-capped logits
                lse = torch.logsumexp(s, dim=-1)  # (n,)
                total += (lse - s.gather(1, y[:, None]).squeeze(1)).sum()
                ds = s.sub_(lse[:, None]).exp_()  # (n, V) softmax, in place of s; then minus the one-hot
                ds.scatter_add_(1, y[:, None], ds.new_full((y.numel(), 1), -1.0))
                if softcap:
                    ds.mul_(t.mul_(t).neg_().add_(1.0))  # d softcap(z) / dz = 1 - tanh^2
                ds = (ds / N).to(compute)  # (n, V)
                grad_hidden[lo:lo + chunk] = (ds @ w[:vocab_size]).to(hidden.dtype)
                grad_weight[:vocab_size] += (ds.t() @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total / N

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss.to(grad_weight.dtype), \
            None, None, None, None


def chunked_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                      softcap: float = 0.0, chunk: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of the head over hidden (N, d), `chunk` tokens of logits at a time -> scalar
    (chunk None: default_chunk for hidden's device)."""
    chunk = default_chunk(hidden.device, vocab_size) if chunk is None else chunk
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"chunked_head_loss: hidden (N, d) and targets (N,), got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if chunk < 1:
        raise ValueError(f"chunked_head_loss: chunk must be at least 1, got {chunk}")
    return _ChunkedHeadLoss.apply(hidden, weight, targets, vocab_size, float(softcap), chunk)


__all__ = ["chunked_head_loss", "default_chunk", "head_loss_reference"]
