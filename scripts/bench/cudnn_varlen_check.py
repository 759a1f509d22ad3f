"""Whether torch's cuDNN attention can serve tscale's global layers: documents as a varlen batch, causal, exact sink.

aten::_cudnn_attention_forward / _backward take a variable-length batch (cum_seq_q, cum_seq_k:
one sequence per document, as tscale/ops/attention_fa2.py builds them) and would run cuDNN's
Hopper kernel (2.6x faster than the fused kernel on a causal mask, docs/BENCHMARKS.md) on the
global layers. The sink would go on top as for FlashAttention-2: y = o * sigmoid(lse) forward,
and the backward run with the gradient sigmoid(lse) * dy and the output y.

This checks, against a float64 reference on random data with random document lengths:
  forward  o (no sink) and y (sink) through _cudnn_attention_forward;
  backward dq, dk, dv of plain causal-within-documents attention, through torch's own autograd
           of _cudnn_attention_forward and through _cudnn_attention_backward called directly,
           and of the sink form (direct call).
It prints each relative error and exits 1 if any exceeds 3% (bf16 inputs), so it says at once
whether a torch upgrade has opened this route. torch 2.11.0+cu130 on an H200: forward and the
sink exact (relative errors 0.002, 0.004), dv right (0.003), dq and dk wrong either way (dq 0.7-0.8
or NaN from run to run, dk 0.05-0.08): its varlen backward sizes dQ's accumulator by the head
dimension instead of the longest sequence (the fix is pytorch/pytorch#186142).

Run: python scripts/bench/cudnn_varlen_check.py
"""

import sys

import torch

from tscale.ops.attention import attention_reference

B, T, H, D = 4, 256, 2, 128
TOL = 0.03


def reference(q, k, v, docs, sink: bool, scale: float) -> torch.Tensor:
    """tscale's attention_reference in float64, causal within documents: q, k, v (B, T, H, D) -> (B, T, H, D)."""
    qh, kh, vh = (t.transpose(1, 2).double() for t in (q, k, v))  # (B, H, T, D)
    return attention_reference(qh, kh, vh, window=0, doc_ids=docs, sink=sink, scale=scale).transpose(1, 2)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.reshape(want.shape).double() - want).abs().max() / want.abs().max()).item()


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("cudnn_varlen_check: needs a CUDA GPU")
    torch.manual_seed(0)
    dev, scale = "cuda", D ** -0.5
    starts = torch.rand(B, T) < 1 / 60
    starts[:, 0] = True
    docs = starts.long().cumsum(1).to(dev)  # (B, T)
    cu = torch.cat([starts.flatten().nonzero().flatten(), torch.tensor([B * T])]).to(dev, torch.int32)  # (N + 1,)
    q, k, v, dy = (torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    q2, k2, v2, dy2 = (t.reshape(B * T, H, D) for t in (q, k, v, dy))  # (tokens, H, D)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {cu.numel() - 1} documents in {B} rows of {T}")

    errors: dict[str, float] = {}
    fwd = torch.ops.aten._cudnn_attention_forward(q2, k2, v2, None, cu, cu, T, T, True, 0.0, True, False, scale=scale)
    out, lse = fwd[0], fwd[1].reshape(B * T, H)  # (tokens, H, D), (tokens, H)
    gate = torch.sigmoid(lse.float()).unsqueeze(-1)  # (tokens, H, 1)
    y = (out.float() * gate).to(out.dtype)
    errors["forward"] = rel_err(out, reference(q, k, v, docs, False, scale))
    errors["forward, sink"] = rel_err(y, reference(q, k, v, docs, True, scale))

    for sink in (False, True):
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(reference(*leaves, docs, sink, scale), leaves, dy.double())
        g, o = ((dy2.float() * gate).to(dy2.dtype), y) if sink else (dy2, out)
        try:
            got = torch.ops.aten._cudnn_attention_backward(g.contiguous(), q2, k2, v2, o, fwd[1], fwd[6], fwd[7], None,
                                                           cu, cu, T, T, 0.0, True, scale=scale)
            for name, a, b in zip(("dq", "dk", "dv"), got, want):
                errors[f"backward{', sink' if sink else ''}, direct, {name}"] = rel_err(a, b)
        except RuntimeError as e:
            print(f"backward{', sink' if sink else ''}, direct: failed: {str(e).splitlines()[0]}")
            errors[f"backward{', sink' if sink else ''}, direct"] = float("inf")
        if not sink:
            qa, ka, va = (t.detach().clone().requires_grad_() for t in (q2, k2, v2))
            res = torch.ops.aten._cudnn_attention_forward(qa, ka, va, None, cu, cu, T, T, True, 0.0, True, False,
                                                          scale=scale)
            for name, a, b in zip(("dq", "dk", "dv"), torch.autograd.grad(res[0], (qa, ka, va), dy2), want):
                errors[f"backward, autograd, {name}"] = rel_err(a, b)

    bad = [name for name, e in errors.items() if not e <= TOL]  # NaN counts as bad
    for name, e in errors.items():
        print(f"{name:32s} {e:.4g}{'  WRONG' if name in bad else ''}")
    print("cuDNN varlen attention " + ("cannot" if bad else "can") + " serve the global layers with this torch")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
