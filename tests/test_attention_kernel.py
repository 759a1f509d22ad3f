"""The fused attention kernel (csrc/attention) against attention_reference, on a GPU and through a CPU emulator.

* GPU tests (marked cuda; skipped without a GPU or without tscale._C's CUDA kernels) compare the
  forward output and dq/dk/dv with attention_reference on random bf16 data: head dims 64 and 128,
  windows 0/1/16/128/300, document layouts (none, one, random lengths, many of length 1, every
  token its own), sink on and off, T from 1 to 2048 (multiples of the 64-tile and not), strided
  inputs like the model's, and the path `attention` picks.
* Emulator tests build tests/attention_emu (the same kernel source run on CPU fibers, one per
  CUDA thread, with ldmatrix / mma / cp.async emulated as the PTX ISA describes them; about a
  minute of compiling, cached by torch) and check the kernels on small cases, including the
  custom op's autograd, fake tensors and torch.compile. TSCALE_SKIP_EMU=1 skips them.
* Plain CPU tests cover the path selection of tscale.ops.attention.
Tolerances: bf16 output and gradients within 2.5% of the largest reference value (+1e-3); the
kernel rounds P and dS to bf16 for the tensor cores, as FlashAttention does.
"""

import pytest
import torch
from helpers_attention import doc_ids
from helpers_emu import build_emulator

from tscale.ops.attention import (_attention_backward_op, _attention_op, attention, attention_kernel,
                                  attention_path, attention_reference, kernel_unusable_reason)
from tscale.ops.backend import cuda_kernels_available, kernels_available

TOL = 2.5e-2


def _set_forward_config(fwd: str, monkeypatch, D: int = 128) -> None:
    """The forward's kernel and configuration: "ROWS-BLOCKS" for the sm_80 kernel (rows per warp: 64- or
    128-query tiles; blocks per multiprocessor its registers leave room for), "sm90-BN-WGS" for the pipelined
    Hopper kernel with BN-key tiles and WGS warpgroups a block, "ws-BN-STAGES[-PINGPONG]" for the specialised-warp one
    with BN-key tiles, STAGES buffers and turns between its consumers or not (both skip where they cannot run: head dim 64, or not an sm_90 GPU), or "auto"
    for the op's own choice."""
    if fwd.startswith(("sm90", "ws")):
        if D != 128 or not _hopper():
            pytest.skip("the Hopper forward needs head dim 128 on an sm_90 GPU")
        form, bn, third, *pingpong = fwd.split("-")
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_KERNEL", "sm90")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_PINGPONG", pingpong[0] if pingpong else "auto")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_FWD", "ws" if form == "ws" else "pipelined")
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_BN", bn)
        monkeypatch.setenv("TSCALE_ATTENTION_SM90_STAGES" if form == "ws" else "TSCALE_ATTENTION_SM90_WGS", third)
    elif fwd != "auto":
        rows, blocks = fwd.split("-")
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_KERNEL", "mma")
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_ROWS", rows)
        monkeypatch.setenv("TSCALE_ATTENTION_FWD_BLOCKS", blocks)


# The Hopper backward's forms, "WGS-TMA-EARLY_DV": warpgroups a block, Q and dO by cp.async (TMA 0), by TMA (1) or by
# TMA with the rows' lse, Delta and document ids (2), dV issued as soon as P^T is formed or with dK.
HOPPER_BACKWARD_FORMS = ["1-0-0", "2-0-0", "1-1-0", "2-1-0", "1-1-1", "2-1-1", "1-0-1", "1-2-1", "2-2-1", "1-2-0"]


def _set_backward_form(form: str, monkeypatch) -> None:
    """The Hopper backward main kernel's form (HOPPER_BACKWARD_FORMS), through its environment settings."""
    for name, value in zip(("WGS", "TMA", "EARLY_DV"), form.split("-")):
        monkeypatch.setenv(f"TSCALE_ATTENTION_SM90_BWD_{name}", value)


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_kernel = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_kernels_available()),
                                  reason="needs a CUDA GPU and tscale._C built with its CUDA kernels")
needs_sm80 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0),
                                reason="the kernel needs sm_80 or newer")


def _case(B, H, T, D, layout, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, T, D, generator=g).to(torch.bfloat16) for _ in range(4))
    docs = doc_ids(B, T, layout, g)
    move = (lambda t: t.to(device)) if device != "cpu" else (lambda t: t)
    return move(q), move(k), move(v), move(do), (move(docs) if docs is not None else None)


def _reference(q, k, v, do, **kw):
    """attention_reference in float32 from the same bf16 values: output and dq, dk, dv."""
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out = attention_reference(*leaves, **kw)
    return (out.detach(), *torch.autograd.grad(out, leaves, do.float()))


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = TOL) -> None:
    got = got.float()
    assert torch.isfinite(got).all(), f"{name}: not finite"
    err = (got - want).abs().max().item()
    bound = tol * want.abs().max().item() + 1e-3
    assert err <= bound, f"{name}: max error {err:.4g} > {bound:.4g}"


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

def _check_kernel(q, k, v, do, docs, window, sink, scale=None):
    D = q.shape[-1]
    kw = dict(window=window, doc_ids=docs, sink=sink, scale=scale if scale is not None else D ** -0.5)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = attention_kernel(*leaves, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    grads = torch.autograd.grad(out, leaves, do)
    want = _reference(q, k, v, do, **kw)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
        _assert_close(name, a, b)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "one", "sparse", "short", "each"])
@pytest.mark.parametrize("window", [0, 1, 16, 128, 300])
@pytest.mark.parametrize("D", [64, 128])
def test_kernel_matches_reference(D, window, layout, sink):
    _check_kernel(*_case(2, 3, 333, D, layout, seed=window, device="cuda"), window=window, sink=sink)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("B,H,T", [(1, 1, 1), (1, 1, 64), (2, 3, 100), (1, 8, 257), (4, 2, 1000), (3, 4, 1024),
                                   (2, 4, 2048)])
@pytest.mark.parametrize("fwd", ["auto", "16-2", "32-2", "16-3", "sm90-64-1", "sm90-64-2", "ws-128-2", "ws-64-3"])
def test_kernel_shapes(B, H, T, D, fwd, monkeypatch):
    _set_forward_config(fwd, monkeypatch, D)
    case = _case(B, H, T, D, "sparse", seed=T, device="cuda")
    _check_kernel(*case, window=128, sink=True)
    _check_kernel(*case[:4], None, window=0, sink=False)


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "sparse", "each"])
@pytest.mark.parametrize("window", [0, 16, 128, 300])
@pytest.mark.parametrize("fwd", ["sm90-64-1", "sm90-128-1", "sm90-64-2", "sm90-128-2", "ws-128-2-1", "ws-64-2-1",
                                 "ws-128-3-1", "ws-128-2-0"])
def test_hopper_forward_matches_reference(fwd, window, layout, sink, monkeypatch):
    """The sm_90a forwards (wgmma) on every mask rule: the pipelined one at both key-tile sizes with one or two
    warpgroups a block, the specialised-warp one (TMA loads) at both tile sizes with two or three buffers, its
    consumers taking turns or not; the
    backward after it is the sm_80 kernel's, fed the Hopper forward's output and logsumexp."""
    _set_forward_config(fwd, monkeypatch)
    _check_kernel(*_case(2, 3, 333, 128, layout, seed=window + 1, device="cuda"), window=window, sink=sink)


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize("form", HOPPER_BACKWARD_FORMS)
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "sparse", "each"])
@pytest.mark.parametrize("window", [0, 16, 128, 300])
def test_hopper_backward_matches_reference(window, layout, sink, form, monkeypatch):
    """The sm_90a backward main kernel (TSCALE_ATTENTION_BWD_KERNEL=sm90) in each form, after the op's own
    forward."""
    if not _hopper():
        pytest.skip("the Hopper backward needs an sm_90 GPU")
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_KERNEL", "sm90")
    _set_backward_form(form, monkeypatch)
    T = 332 if form.split("-")[1] == "2" else 333  # form 2 needs T a multiple of 4 (else it runs form 1)
    _check_kernel(*_case(2, 3, T, 128, layout, seed=window + 2, device="cuda"), window=window, sink=sink)


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize("T", [333, 330])
def test_hopper_backward_rows_off_tma_boundaries(T, monkeypatch):
    """TMA 2 where a tile's lse, Delta and document ids would start off a 16-byte boundary (T not a multiple of 4;
    the GPU faults on such a load): the backward runs form 1 and matches the reference."""
    if not _hopper():
        pytest.skip("the Hopper backward needs an sm_90 GPU")
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_KERNEL", "sm90")
    _set_backward_form("1-2-1", monkeypatch)
    _check_kernel(*_case(2, 3, T, 128, "sparse", seed=T, device="cuda"), window=0, sink=True)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("fwd", ["auto", "ws-128-2"])  # the second: TMA maps of the views (an sm_90 GPU only)
@pytest.mark.parametrize("window", [128, 0])
def test_kernel_strided_inputs_and_int64_docs(window, fwd, monkeypatch):
    """The model passes q, k, v as (B, T, H, D) views transposed to (B, H, T, D), and int64 document ids."""
    _set_forward_config(fwd, monkeypatch)
    B, H, T, D = 2, 6, 300, 128
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, T, 3, H, D, generator=g).to(torch.bfloat16).cuda()
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, H, T, D), not contiguous
    assert not q.is_contiguous()
    do = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16).cuda().transpose(1, 2)
    docs = doc_ids(B, T, "sparse", g).cuda()
    _check_kernel(q, k, v, do, docs, window=window, sink=True)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
def test_kernel_backward_under_cuda_graph_capture():
    """The backward as torch.compile's reduce-overhead mode runs it, captured in a CUDA graph: every replay gives
    the reference's gradients, and so do eager calls before and after the capture."""
    q, k, v, do, docs = _case(2, 3, 300, 128, "short", seed=11, device="cuda")
    docs32, scale = docs.int(), 128 ** -0.5
    out, lse = torch.ops.tscale.attention_fwd_cuda(q, k, v, docs32, 64, True, scale)
    want = _reference(q, k, v, do, window=64, doc_ids=docs, sink=True, scale=scale)[1:]

    def backward():
        return torch.ops.tscale.attention_bwd_cuda(do, q, k, v, out, lse, docs32, 64, True, scale)

    for name, a, b in zip(("dq", "dk", "dv"), backward(), want):
        _assert_close(name, a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        backward()  # warm-up on a side stream, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backward()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for name, a, b in zip(("dq", "dk", "dv"), captured, want):
            _assert_close(f"replayed {name}", a, b)
    for name, a, b in zip(("dq", "dk", "dv"), backward(), want):
        _assert_close(f"eager {name} after the graph", a, b)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("sink", [False, True])
def test_lonely_rows_are_finite(sink):
    """Every query sees itself, so no row is ever empty; the nearest cases are a query whose only key is
    itself (window 1, or documents of length 1) and, with the sink, logits so negative that every key's
    weight underflows: outputs are finite, and ~0 in the second case."""
    q, k, v, do, _ = _case(1, 2, 130, 64, "none", device="cuda")
    docs = torch.arange(130, device="cuda").expand(1, 130)
    for kw in (dict(window=1, doc_ids=None), dict(window=0, doc_ids=docs)):
        out = attention_kernel(q, k, v, sink=sink, scale=0.125, **kw)
        want = attention_reference(q.float(), k.float(), v.float(), sink=sink, scale=0.125, **kw)
        _assert_close("out", out, want)
        if not sink:
            torch.testing.assert_close(out, v)  # softmax over one key: that key's value
    qb = torch.ones_like(q) * 8
    kb = -torch.ones_like(k) * 8  # logits q.k * scale = 64 * (-64) * 0.125 = -512: every exp underflows to 0
    out = attention_kernel(qb, kb, v, window=0, doc_ids=None, sink=True, scale=0.125)
    assert torch.isfinite(out).all() and out.abs().max().item() == 0.0
    _check_kernel(qb, kb, v, do, None, window=16, sink=True, scale=0.125)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
def test_attention_picks_the_kernel_and_compiles():
    q, k, v, do, docs = _case(2, 2, 96, 128, "sparse", device="cuda")
    assert attention_path(q, k, v) == "kernel"
    assert attention_path(q.float(), k.float(), v.float()) == "flex"
    assert attention_path(q[:, :, -3:], k, v) == "reference"  # cached decoding
    with pytest.raises(ValueError, match="bfloat16"):
        attention_path(q.float(), k.float(), v.float(), impl="kernel")
    kw = dict(window=16, doc_ids=docs, sink=True, scale=128 ** -0.5)

    def fn(a, b, c):
        return attention(a, b, c, **kw)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.compile(fn, backend="aot_eager", fullgraph=True)(*leaves)
    grads = torch.autograd.grad(out, leaves, do)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), _reference(q, k, v, do, **kw)):
        _assert_close(name, a, b)
    _opcheck_kernel_ops(q, k, v, do, docs.int(), 16, 128 ** -0.5)


# ---------------------------------------------------------------------------------------------
# Emulator (CPU)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def emu():
    return build_emulator("tscale_attention_emu", "attention_emu/attention_emu.cpp", ["csrc/attention"])


EMU_CASES = [  # B, H, T, D, window, layout, sink
    (1, 2, 130, 64, 16, "sparse", True),
    (2, 1, 200, 128, 0, "short", False),
    (1, 1, 100, 128, 1, "each", True),
    (1, 1, 257, 64, 128, "none", False),
    (1, 1, 150, 128, 300, "one", True),
    (1, 1, 1, 64, 0, "none", True),
    (1, 1, 300, 64, 0, "short", True),
    (1, 1, 260, 128, 40, "one", False),  # one document: every masked tile pair lies inside it
    (2, 1, 400, 64, 100, "sparse", True),  # documents of ~50 tokens: tile pairs inside one and across several
]


@pytest.mark.parametrize("fwd", ["16-2", "32-2", "16-3"])
@pytest.mark.parametrize("copy_mode", [0, 1])  # cp.async copies land at random times / as early as possible
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_kernel_matches_reference(emu, case, copy_mode, fwd, monkeypatch):
    """With copy_mode 0 the blocks also run in a random order, as hardware may run them."""
    _set_forward_config(fwd, monkeypatch)
    B, H, T, D, window, layout, sink = case
    emu.set_seed(T + copy_mode)
    emu.set_copy_mode(copy_mode)
    emu.set_block_order(1 - copy_mode)
    q, k, v, do, docs = _case(B, H, T, D, layout, seed=T)
    docs32 = docs.int() if docs is not None else None
    kw = dict(window=window, doc_ids=docs, sink=sink, scale=D ** -0.5)
    out, lse = emu.fwd(q, k, v, docs32, window, sink, D ** -0.5)
    dq, dk, dv = emu.bwd(do, q, k, v, out, lse, docs32, window, sink, D ** -0.5)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), _reference(q, k, v, do, **kw)):
        _assert_close(name, a, b)


EMU_HOPPER_CASES = [c for c in EMU_CASES if c[3] == 128] + [(2, 1, 300, 128, 100, "sparse", True)]


def _emulated_case(emu, case, copy_mode):
    """An EMU_*_CASES entry's inputs with the emulator seeded, in copy_mode, blocks in a random order:
    (q, k, v, do, int32 document ids or None, the reference's keywords)."""
    B, H, T, D, window, layout, sink = case
    emu.set_seed(T + copy_mode)
    emu.set_copy_mode(copy_mode)
    emu.set_block_order(1)
    q, k, v, do, docs = _case(B, H, T, D, layout, seed=T)
    docs32 = docs.int() if docs is not None else None
    return q, k, v, do, docs32, dict(window=window, doc_ids=docs, sink=sink, scale=D ** -0.5)


def _assert_lse_like_sm80(emu, lse, q, k, v, args) -> None:
    """A Hopper forward's logsumexp against the emulated sm_80 forward's on the same call: infinite in the same rows,
    close elsewhere."""
    _, lse_sm80 = emu.fwd(q, k, v, *args)
    finite = torch.isfinite(lse_sm80)
    assert torch.equal(finite, torch.isfinite(lse)) and torch.allclose(lse[finite], lse_sm80[finite], atol=2e-3)


def _nan_framed_views(emu, B, H, T, D, seed):
    """q, k, v as (B, H, T, D) views of (B, T, H, D) storage between NaN-filled neighbours (a stray read would show),
    and a plain dO; the emulator set to random copy times and block order."""
    emu.set_copy_mode(0)
    emu.set_block_order(1)
    g = torch.Generator().manual_seed(seed)
    store = torch.full((B, T, 4, H, D), float("nan"), dtype=torch.bfloat16)  # slot 3 stays NaN
    store[:, :, :3] = torch.randn(B, T, 3, H, D, generator=g).to(torch.bfloat16)
    q, k, v = (store[:, :, i].transpose(1, 2) for i in range(3))
    return q, k, v, torch.randn(B, H, T, D, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("fwd", ["sm90-64-1", "sm90-128-1", "sm90-64-2", "sm90-128-2"])
@pytest.mark.parametrize("copy_mode", [0, 1, 2])  # copies and products complete at random times / early / late
@pytest.mark.parametrize("case", EMU_HOPPER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_hopper_forward_matches_reference(emu, case, copy_mode, fwd, monkeypatch):
    """The sm_90a forward's source with its wgmma products emulated (the descriptors' layouts, the products run at
    issue or at the wait that retires them): output against the reference, logsumexp against the sm_80 forward's,
    and the sm_80 backward fed by it. With copy_mode 2 every copy and product lands at its wait, so a tile
    refilled or a fragment touched before its product is done changes the result."""
    _, bn, wgs = fwd.split("-")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BN", bn)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_WGS", wgs)
    q, k, v, do, docs32, kw = _emulated_case(emu, case, copy_mode)
    args = (docs32, kw["window"], kw["sink"], kw["scale"])
    out, lse = emu.fwd_sm90(q, k, v, *args)
    _assert_lse_like_sm80(emu, lse, q, k, v, args)
    grads = emu.bwd(do, q, k, v, out, lse, *args)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), _reference(q, k, v, do, **kw)):
        _assert_close(name, a, b)


@pytest.mark.parametrize("form", HOPPER_BACKWARD_FORMS)
@pytest.mark.parametrize("copy_mode", [0, 1, 2])  # copies and TMA loads land at random times / early / late
@pytest.mark.parametrize("case", EMU_HOPPER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_hopper_backward_matches_reference(emu, case, copy_mode, form, monkeypatch):
    """The sm_90a backward main kernel's source (wgmma: S^T, dP^T, dV, dK and dQ products) between the sm_80 delta and
    dq kernels, emulated in each form, fed the sm_80 forward's output and logsumexp: dq, dk, dv against the
    reference. With copy_mode 2 a product lands only at the wait that retires it, so an operand or accumulator
    touched before then changes the result."""
    _set_backward_form(form, monkeypatch)
    q, k, v, do, docs32, kw = _emulated_case(emu, case, copy_mode)
    out, lse = emu.fwd(q, k, v, docs32, kw["window"], kw["sink"], kw["scale"])
    grads = emu.bwd_sm90(do, q, k, v, out, lse, docs32, kw["window"], kw["scale"])
    for name, a, b in zip(("dq", "dk", "dv"), grads, _reference(q, k, v, do, **kw)[1:]):
        _assert_close(name, a, b)


@pytest.mark.parametrize("form", ["128-2-1", "64-2-1", "128-3-1", "128-2-0"])  # BN-STAGES-PINGPONG
@pytest.mark.parametrize("copy_mode", [0, 1, 2])  # loads and products land at random times / early / late
@pytest.mark.parametrize("case", EMU_HOPPER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_hopper_ws_forward_matches_reference(emu, case, copy_mode, form, monkeypatch):
    """The specialised-warp forward (a producer warp's TMA loads and mbarriers, two consumer warpgroups) against the
    reference, its logsumexp against the sm_80 forward's. With copy_mode 2 a TMA load lands only at the first wait
    on its barrier, so a consumer that reads a buffer before waiting sees the 0xFF poison; with copy_mode 1 at
    issue, so a producer that refills a buffer still being read changes the result. With PINGPONG 1 the consumers
    take turns through named barriers, which must balance by the block's end."""
    bn, stages, pingpong = form.split("-")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BN", bn)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_STAGES", stages)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_PINGPONG", pingpong)
    q, k, v, do, docs32, kw = _emulated_case(emu, case, copy_mode)
    args = (docs32, kw["window"], kw["sink"], kw["scale"])
    out, lse = emu.fwd_sm90_ws(q, k, v, *args)
    _assert_lse_like_sm80(emu, lse, q, k, v, args)
    _assert_close("out", out, _reference(q, k, v, do, **kw)[0])


def test_emulated_hopper_ws_forward_strided_inputs(emu):
    """(B, T, H, D) storage seen as (B, H, T, D) through the TMA maps' strides, NaN-filled neighbours around it."""
    B, H, T, D = 2, 2, 150, 128
    q, k, v, do = _nan_framed_views(emu, B, H, T, D, seed=2)
    out, _ = emu.fwd_sm90_ws(q, k, v, None, 0, True, D ** -0.5)
    _assert_close("out", out, _reference(q, k, v, do, window=0, doc_ids=None, sink=True, scale=D ** -0.5)[0])


@pytest.mark.parametrize("tma, T", [("0", 150), ("1", 150), ("2", 152), ("2", 150)])
def test_emulated_hopper_backward_strided_inputs(emu, tma, T, monkeypatch):
    """The Hopper backward on (B, T, H, D) storage seen as (B, H, T, D), dO strided the same way, NaN-filled
    neighbours around q, k, v: through the TMA maps' strides or cp.async's. TMA 2 at T 150 runs form 1: its rows'
    boxes would start off the 16-byte boundaries the TMA unit needs (the emulator fails such a load)."""
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BWD_TMA", tma)
    B, H, D = 2, 2, 128
    q, k, v, do = _nan_framed_views(emu, B, H, T, D, seed=4)
    do = do.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, T, D) view of (B, T, H, D) storage
    out, lse = emu.fwd(q, k, v, None, 0, True, D ** -0.5)
    grads = emu.bwd_sm90(do, q, k, v, out, lse, None, 0, D ** -0.5)
    want = _reference(q, k, v, do, window=0, doc_ids=None, sink=True, scale=D ** -0.5)[1:]
    for name, a, b in zip(("dq", "dk", "dv"), grads, want):
        _assert_close(name, a, b)


def test_emulated_hopper_ws_forward_config_is_checked(emu, monkeypatch):
    q, k, v, _, _ = _case(1, 1, 64, 128, "none")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_STAGES", "4")
    with pytest.raises(RuntimeError, match="TSCALE_ATTENTION_SM90_STAGES must be one of auto, 2, 3; got '4'"):
        emu.fwd_sm90_ws(q, k, v, None, 0, False, 0.125)


def test_emulated_hopper_forward_refuses_head_dim_64(emu):
    q, k, v, _, _ = _case(1, 1, 64, 64, "none")
    with pytest.raises(RuntimeError, match="serves head dim 128"):
        emu.fwd_sm90(q, k, v, None, 0, False, 0.125)


def test_emulated_forward_config_is_checked(emu, monkeypatch):
    """Three blocks a multiprocessor exist only for 64-query tiles; a bad override names its variable."""
    q, k, v, _, _ = _case(1, 1, 64, 128, "none")
    monkeypatch.setenv("TSCALE_ATTENTION_FWD_ROWS", "32")
    monkeypatch.setenv("TSCALE_ATTENTION_FWD_BLOCKS", "3")
    with pytest.raises(RuntimeError, match="needs 16 rows per warp"):
        emu.fwd(q, k, v, None, 0, False, 0.125)
    monkeypatch.setenv("TSCALE_ATTENTION_FWD_BLOCKS", "4")
    with pytest.raises(RuntimeError, match="TSCALE_ATTENTION_FWD_BLOCKS must be 2 or 3"):
        emu.fwd(q, k, v, None, 0, False, 0.125)


@pytest.mark.parametrize("variable, allowed", [("WGS", "1, 2"), ("TMA", "0, 1, 2"), ("EARLY_DV", "0, 1")])
def test_emulated_hopper_backward_config_is_checked(emu, monkeypatch, variable, allowed):
    """A bad value of a Hopper backward setting names its variable and the values it takes."""
    q, k, v, do, _ = _case(1, 1, 64, 128, "none")
    out, lse = emu.fwd(q, k, v, None, 0, False, 0.125)
    name = f"TSCALE_ATTENTION_SM90_BWD_{variable}"
    monkeypatch.setenv(name, "3")
    with pytest.raises(RuntimeError, match=f"{name} must be one of auto, {allowed}; got '3'"):
        emu.bwd_sm90(do, q, k, v, out, lse, None, 0, 0.125)


def test_emulated_kernel_strided_inputs(emu):
    """(B, T, H, D) storage seen as (B, H, T, D), with NaN-filled neighbours: a stray read would show."""
    q, k, v, do = _nan_framed_views(emu, B=1, H=2, T=70, D=64, seed=1)
    out, lse = emu.fwd(q, k, v, None, 0, True, 0.125)
    grads = emu.bwd(do, q, k, v, out, lse, None, 0, True, 0.125)
    want = _reference(q, k, v, do, window=0, doc_ids=None, sink=True, scale=0.125)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
        _assert_close(name, a, b)


def _opcheck_kernel_ops(q, k, v, do, docs, window: int, scale: float) -> None:
    """The extension's forward and backward ops against their schemas and fake kernels (torch.compile's view)."""
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.tscale.attention_fwd_cuda.default, (q, k, v, docs, window, True, scale),
                          test_utils=utils)
    out, lse = torch.ops.tscale.attention_fwd_cuda(q, k, v, docs, window, True, scale)
    torch.library.opcheck(torch.ops.tscale.attention_bwd_cuda.default,
                          (do, q, k, v, out, lse, docs, window, True, scale), test_utils=utils)


@pytest.fixture
def emulated_op(emu):
    """The emulator as the CPU kernel of tscale::attention_fwd_cuda / attention_bwd_cuda, for this test only."""
    if not kernels_available():
        pytest.skip("tscale._C is not built (the op schemas live there)")
    lib = torch.library.Library("tscale", "IMPL")
    lib.impl("attention_fwd_cuda", lambda *a: emu.fwd(*a), "CPU")
    lib.impl("attention_bwd_cuda", lambda *a: emu.bwd(*a), "CPU")
    emu.set_copy_mode(0)
    emu.set_block_order(1)
    yield
    lib._destroy()


def test_kernel_ops_autograd_fake_and_compile(emulated_op):
    q, k, v, do, docs = _case(1, 2, 80, 64, "sparse", seed=3)
    kw = dict(window=9, doc_ids=docs, sink=True, scale=0.125)
    want = _reference(q, k, v, do, **kw)

    def fn(a, b, c):
        return attention_kernel(a, b, c, **kw)

    for run in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        grads = torch.autograd.grad(out, leaves, do)
        for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
            _assert_close(name, a, b)
    _opcheck_kernel_ops(q, k, v, do, docs.int(), 9, 0.125)


# ---------------------------------------------------------------------------------------------
# Path selection (CPU)
# ---------------------------------------------------------------------------------------------

def test_path_selection_on_cpu(monkeypatch):
    q, k, v, _, docs = _case(1, 2, 40, 64, "sparse")
    monkeypatch.delenv("TSCALE_ATTENTION", raising=False)
    assert attention_path(q, k, v) == "reference"
    assert "not CUDA" in kernel_unusable_reason(q, k, v)
    with pytest.raises(ValueError, match="not CUDA"):
        attention(q, k, v, window=4, doc_ids=docs, sink=True, scale=0.1, impl="kernel")
    with pytest.raises(ValueError, match="unknown path"):
        attention_path(q, k, v, impl="fast")
    monkeypatch.setenv("TSCALE_ATTENTION", "flex")
    assert attention_path(q, k, v) == "flex"
    assert attention_path(q, k, v, impl="reference") == "reference"  # the argument wins over the environment
    monkeypatch.setenv("TSCALE_ATTENTION", "kernel")
    with pytest.raises(ValueError, match="fused kernel"):
        attention_path(q, k, v)


def test_reference_ops_fake_kernels_match_on_strided_inputs():
    """The model hands the op (B, T, H, D) storage seen as (B, H, T, D); the fakes must give the real outputs'
    layouts (contiguous) or torch.compile's stride checks fail on the backward."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 12, 3, 8, generator=g).transpose(1, 2) for _ in range(4))  # (B, H, T, D) views
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    for op, args in ((_attention_op, (q, k, v, docs, 4, True, 0.3)),
                     (_attention_backward_op, (do.contiguous(), q, k, v, docs, 4, True, 0.3))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_reference_path_without_gradients_skips_the_custom_op(monkeypatch):
    """Decoding and evaluation (nothing to differentiate) run the reference's plain ops; training its custom op."""
    import tscale.ops.attention as attention_module

    monkeypatch.delenv("TSCALE_ATTENTION", raising=False)
    q, k, v, do, docs = _case(1, 2, 30, 64, "sparse", seed=5)
    q, k, v, do = q.float(), k.float(), v.float(), do.float()
    kw = dict(window=6, doc_ids=docs, sink=True, scale=0.2)
    calls = []
    real_op = attention_module._attention_op
    monkeypatch.setattr(attention_module, "_attention_op", lambda *a: calls.append(1) or real_op(*a))
    want = attention_reference(q, k, v, **kw)
    with torch.no_grad():
        torch.testing.assert_close(attention(q[:, :, -4:], k, v, **kw), want[:, :, -4:])  # cached decoding
    torch.testing.assert_close(attention(q, k, v, **kw), want)  # no input requires grad
    assert calls == []
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, **kw)
    assert calls == [1]
    torch.testing.assert_close(out, want)
    grads = torch.autograd.grad(out, leaves, do)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want_grads = torch.autograd.grad(attention_reference(*ref_leaves, **kw), ref_leaves, do)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_forced_paths_agree_on_cpu(monkeypatch):
    monkeypatch.delenv("TSCALE_ATTENTION", raising=False)
    q, k, v, _, docs = _case(2, 2, 50, 64, "sparse", seed=4)
    q, k, v = q.float(), k.float(), v.float()
    kw = dict(window=7, doc_ids=docs, sink=True, scale=0.2)
    want = attention_reference(q, k, v, **kw)
    for impl in ("flex", "reference"):
        torch.testing.assert_close(attention(q, k, v, impl=impl, **kw), want, atol=2e-5, rtol=1e-4)


def test_sdpa_path_is_plain_causal_attention_and_refuses_masks(monkeypatch):
    """The benchmarks' baseline: forced only, exact on plain causal calls, an error for any other mask."""
    monkeypatch.delenv("TSCALE_ATTENTION", raising=False)
    q, k, v, do, docs = _case(2, 2, 33, 64, "sparse", seed=6)
    q, k, v, do = q.float(), k.float(), v.float(), do.float()
    assert attention_path(q, k, v) != "sdpa"  # never the automatic choice
    plain = dict(window=0, doc_ids=None, sink=False, scale=0.2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, impl="sdpa", **plain)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = attention_reference(*ref_leaves, **plain)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)
    for g, w in zip(torch.autograd.grad(out, leaves, do), torch.autograd.grad(want, ref_leaves, do)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(attention(q, k, v, impl="sdpa", **{**plain, "window": 33}), want.detach(),
                               atol=1e-5, rtol=1e-4)  # a window as long as the sequence hides nothing
    for change, reason in (({"window": 8}, "window 8"), ({"doc_ids": docs}, "document ids"),
                           ({"sink": True}, "sink")):
        with pytest.raises(ValueError, match=reason):
            attention(q, k, v, impl="sdpa", **{**plain, **change})
    with pytest.raises(ValueError, match="cached decoding"):
        attention(q[:, :, -1:], k, v, impl="sdpa", **plain)
    monkeypatch.setenv("TSCALE_ATTENTION", "sdpa")
    assert attention_path(q, k, v) == "sdpa"


def test_kernel_ops_have_schemas_and_no_cpu_kernel():
    if not kernels_available():
        pytest.skip("tscale._C is not built")
    q, k, v, _, _ = _case(1, 1, 8, 64, "none")  # attention has CUDA kernels only
    with pytest.raises(NotImplementedError):
        torch.ops.tscale.attention_fwd_cuda(q, k, v, None, 0, True, 0.1)
