"""The head's mean cross-entropy with its gradient made in the forward pass: one kernel pass over the logits.

A training step's loss reads the head's (N, V) logits (32,768 x 50,304 at the 124M presets, 3.3 GB in
bf16) only to reduce them to one number, and its backward reads them again to make their gradient.
`head_loss` makes the logits with one product, then `softcap_xent_grad` reads them once and writes
both the per-token losses and the gradient of the mean loss with respect to the logits (softmax minus
one-hot, times the soft-cap's derivative, over N); the logits are not kept. The backward turns that
gradient into those of the head's input and weight with two products and only then scales them by
the upstream gradient, a scalar, on the small (N, d) and (V, d) results. The arithmetic is that of
the models' logits path (`tscale.ops.fused_loss.head_loss_reference`; tests/test_fused_loss.py compares
them, backward included; tests/test_head_loss.py the kernel with its reference twin). Mean loss only:
per-token losses with their own upstream gradients take the logits path.

softcap_xent_grad(logits (N, V_padded), targets (N,) int64, vocab_size, softcap, scale)
    -> losses (N,) fp32, grad (N, V_padded) in the logits' dtype
    z = softcap * tanh(logits / softcap) (logits when softcap is 0) over the first vocab_size columns;
    losses = logsumexp(z) - z[target]; grad = scale * d losses / d logits, 0 in the padding columns.
The kernel (csrc/loss/softcap_xent_cuda.cu) serves bf16 CUDA rows whose width is a multiple of 8;
everything else takes the torch reference.
"""

import torch

from tscale.ops.backend import cuda_kernels_available

def softcap_xent_grad_reference(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, softcap: float,
                                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference twin of the kernel, in float32: (losses (N,), grad (N, V_padded) in the logits' dtype)."""
    x = logits[:, :vocab_size].float()  # (N, V)
    t = torch.tanh(x / softcap) if softcap else None
    z = softcap * t if softcap else x  # (N, V) soft-capped logits
    lse = torch.logsumexp(z, dim=-1)  # (N,)
    losses = lse - z.gather(1, targets[:, None]).squeeze(1)  # (N,)
    g = torch.exp(z - lse[:, None])  # (N, V) softmax
    g.scatter_add_(1, targets[:, None], g.new_full((targets.numel(), 1), -1.0))
    if softcap:
        g.mul_(1.0 - t * t)
    grad = torch.zeros_like(logits)  # (N, V_padded): the padding columns get no gradient
    grad[:, :vocab_size] = (g * scale).to(logits.dtype)
    return losses, grad


def _kernel_serves(logits: torch.Tensor) -> bool:
    return (logits.is_cuda and logits.dtype == torch.bfloat16 and logits.dim() == 2 and logits.is_contiguous()
            and logits.shape[1] % 8 == 0 and cuda_kernels_available())


def softcap_xent_grad(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, softcap: float,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses and scale * their gradient w.r.t. the logits, in one pass where the kernel serves."""
    if _kernel_serves(logits):
        return torch.ops.tscale.softcap_xent_grad(logits, targets, vocab_size, softcap, scale)
    return softcap_xent_grad_reference(logits, targets, vocab_size, softcap, scale)


def _register_fake() -> None:
    """Shapes of the kernel's results for torch.compile's tracing (the op exists only with tscale._C)."""
    if not hasattr(torch.ops.tscale, "softcap_xent_grad"):
        return

    @torch.library.register_fake("tscale::softcap_xent_grad")
    def _fake(logits, targets, vocab_size, softcap, scale):
        return logits.new_empty(logits.shape[0], dtype=torch.float32), torch.empty_like(logits)


if cuda_kernels_available():
    _register_fake()


class _HeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_size: int, softcap: float):
        device = hidden.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        h, w = hidden.to(compute), weight.to(compute)  # (N, d), (V_padded, d)
        with torch.autocast(device, enabled=False):
            logits = h @ w.t()  # (N, V_padded)
            losses, grad = softcap_xent_grad(logits, targets, vocab_size, softcap, 1.0 / max(1, hidden.shape[0]))
        ctx.save_for_backward(h, w, grad)
        ctx.dtypes = hidden.dtype, weight.dtype
        return losses.mean()

    @staticmethod
    def backward(ctx, grad_loss):
        h, w, grad = ctx.saved_tensors  # grad: (N, V_padded), of the mean loss
        hidden_dtype, weight_dtype = ctx.dtypes
        with torch.autocast(h.device.type, enabled=False):
            grad_hidden = (grad @ w).to(hidden_dtype) * grad_loss.to(hidden_dtype)  # (N, d)
            grad_weight = (grad.t() @ h).to(weight_dtype) * grad_loss.to(weight_dtype)  # (V_padded, d)
        return grad_hidden, grad_weight, None, None, None


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int,
              softcap: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy of softcap(hidden @ weight^T)[:, :vocab_size] over hidden (N, d), targets (N,) -> scalar."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"head_loss: hidden (N, d) and targets (N,), got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if not 1 <= vocab_size <= weight.shape[0]:
        raise ValueError(f"head_loss: vocab_size {vocab_size} must be in [1, {weight.shape[0]}] (the head's rows)")
    return _HeadLoss.apply(hidden, weight, targets, vocab_size, float(softcap))


__all__ = ["head_loss", "softcap_xent_grad", "softcap_xent_grad_reference"]
