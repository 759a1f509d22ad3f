"""Shared pieces of the attention kernel's GPU and emulator tests: random cases, the float32 reference's gradients,
the tolerance check, the kernels' forms set through their environment settings, and the ops' schema checks."""

import pytest
import torch
from helpers_attention import doc_ids

from tscale.ops.attention import attention_reference

TOL = 2.5e-2


def set_forward_config(fwd: str, monkeypatch, D: int = 128) -> None:
    """The forward's kernel and configuration: "ROWS-BLOCKS[-v]" for the sm_80 kernel (rows per warp: 64- or
    128-query tiles; blocks per multiprocessor its registers leave room for; "-v": V tiles in Q's buffer), "sm90-BN-WGS" for the pipelined
    Hopper kernel with BN-key tiles and WGS warpgroups a block, "ws-BN-STAGES[-PINGPONG[-PERSISTENT]]" for the
    specialised-warp one with BN-key tiles, STAGES buffers, turns between its consumers or not, and its persistent
    form (two blocks) or not (both skip where they cannot run: head dim 64, or not an sm_90 GPU), or "auto" for the
    op's own choice."""
    if fwd.startswith(("sm90", "ws")):
        if D != 128 or not hopper():
            pytest.skip("the Hopper forward needs head dim 128 on an sm_90 GPU")
        form, bn, third, *turns = fwd.split("-")
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_KERNEL", "sm90")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_PINGPONG", turns[0] if turns else "auto")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_PERSISTENT", turns[1] if len(turns) > 1 else "auto")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_BLOCKS", "2")  # a persistent form's blocks walk several query tiles
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_FWD", "ws" if form == "ws" else "pipelined")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_BN", bn)
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_STAGES" if form == "ws" else "TSCALE_ATTENTION_SM90_WGS", third)
    elif fwd != "auto":
        rows, blocks, *v_in_q = fwd.split("-")
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_KERNEL", "mma")
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_ROWS", rows)
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_BLOCKS", blocks)
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_V_IN_Q", "1" if v_in_q else "0")


# The Hopper backward's forms, "WGS-TMA-EARLY_DV[-DQ_FIRST[-DQ_V4]]": warpgroups a block, Q and dO by cp.async (TMA
# 0), by TMA (1) or by TMA with the rows' lse, Delta and document ids (2), dV issued as soon as P^T is formed or with
# dK, dK issued before dQ's first half or queued behind it (DQ_FIRST; auto when left out: 1 with dV early, else 0),
# and dQ's atomics four floats a lane at once (DQ_V4; auto when left out: 0). A prefix in SPLIT_PREFIXES makes it the
# split backward, with the dQ kernel that prefix sets.
HOPPER_BACKWARD_FORMS = ["1-0-0", "2-0-0", "1-1-0", "2-1-0", "1-1-1", "2-1-1", "1-0-1", "1-2-1", "2-2-1", "1-2-0",
                         "1-2-1-0", "2-2-1-0", "1-1-1-0", "1-2-1-1-1", "2-1-0-0-1", "s-1-1", "s-1-2", "s0-1-2",
                         "s1-1-2"]
BACKWARD_SETTINGS = ("WGS", "TMA", "EARLY_DV", "DQ_FIRST", "DQ_V4")
# The split backward's dQ kernel: TSCALE_ATTENTION_SM90_BWD_QUERY_{WGMMA, OVERLAP}. "s-": the defaults (the Hopper
# one, each step's dQ product waited for in the next step), "s1-": the Hopper one waiting at once, "s0-": the sm_80 one.
SPLIT_PREFIXES = {"s-": ("auto", "auto"), "s1-": ("1", "0"), "s0-": ("0", "auto")}


def _split_form(form: str) -> tuple[tuple[str, str] | None, list[str]]:
    """(the dQ kernel's settings, or None for the atomics), the main kernel's settings."""
    for prefix, query in SPLIT_PREFIXES.items():
        if form.startswith(prefix):
            return query, form.removeprefix(prefix).split("-")
    return None, form.split("-")


def backward_form_tma(form: str) -> str:
    """The TMA setting of a HOPPER_BACKWARD_FORMS entry."""
    return _split_form(form)[1][1]


def set_backward_form(form: str, monkeypatch) -> None:
    """The Hopper backward main kernel's form (HOPPER_BACKWARD_FORMS), through its environment settings; a form
    with a split prefix is the split backward (TSCALE_ATTENTION_BWD_DQ=split: a query-major dQ kernel, then the
    main kernel without dQ), the others add dQ with atomics."""
    query, values = _split_form(form)
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_DQ", "atomic" if query is None else "split")
    for name, value in zip(("WGMMA", "OVERLAP"), query or ("auto", "auto")):
        monkeypatch.setenv(f"TSCALE_ATTENTION_SM90_BWD_QUERY_{name}", value)
    for name, value in zip(BACKWARD_SETTINGS, values + ["auto"] * (len(BACKWARD_SETTINGS) - len(values))):
        monkeypatch.setenv(f"TSCALE_ATTENTION_SM90_BWD_{name}", value)


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def make_case(B, H, T, D, layout, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, T, D, generator=g).to(torch.bfloat16) for _ in range(4))
    docs = doc_ids(B, T, layout, g)
    move = (lambda t: t.to(device)) if device != "cpu" else (lambda t: t)
    return move(q), move(k), move(v), move(do), (move(docs) if docs is not None else None)


def reference_grads(q, k, v, do, **kw):
    """attention_reference in float32 from the same bf16 values: output and dq, dk, dv."""
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out = attention_reference(*leaves, **kw)
    return (out.detach(), *torch.autograd.grad(out, leaves, do.float()))


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    got = got.float()
    assert torch.isfinite(got).all(), f"{name}: not finite"
    err = (got - want).abs().max().item()
    bound = tol * want.abs().max().item() + 1e-3
    assert err <= bound, f"{name}: max error {err:.4g} > {bound:.4g}"


def opcheck_kernel_ops(q, k, v, do, docs, window: int, scale: float) -> None:
    """The extension's forward and backward ops against their schemas and fake kernels (torch.compile's view)."""
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.tscale.attention_fwd_cuda.default, (q, k, v, docs, window, True, scale),
                          test_utils=utils)
    out, lse = torch.ops.tscale.attention_fwd_cuda(q, k, v, docs, window, True, scale)
    torch.library.opcheck(torch.ops.tscale.attention_bwd_cuda.default,
                          (do, q, k, v, out, lse, docs, window, True, scale), test_utils=utils)
