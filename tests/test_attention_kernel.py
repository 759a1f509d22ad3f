"""The fused attention kernel (csrc/attention) against attention_reference on a GPU, and the op's path selection.

* GPU tests (marked cuda; skipped without a GPU or without tscale._C's CUDA kernels) compare the
  forward output and dq/dk/dv with attention_reference on random bf16 data: head dims 64 and 128,
  windows 0/1/16/128/300, document layouts (none, one, random lengths, many of length 1, every
  token its own), sink on and off, T from 1 to 2048 (multiples of the 64-tile and not), strided
  inputs like the model's, and the path `attention` picks.
* Plain CPU tests cover the path selection of tscale.ops.attention.
The same kernels run on CPU through the emulator in tests/test_attention_emulated.py.
Tolerances: bf16 output and gradients within 2.5% of the largest reference value (+1e-3); the
kernel rounds P and dS to bf16 for the tensor cores, as FlashAttention does.
"""

import pytest
import torch
from helpers_attention import doc_ids
from helpers_attention_kernel import (HOPPER_BACKWARD_FORMS, assert_close, backward_form_tma, hopper, make_case,
                                      opcheck_kernel_ops, reference_grads, set_backward_form, set_forward_config)

from tscale.ops.attention import (KERNEL_MAX_BATCH, KERNEL_MAX_SEQ_LEN, _attention_backward_op, _attention_op,
                                  attention, attention_kernel, attention_path, attention_reference,
                                  kernel_unusable_reason)
from tscale.ops.backend import cuda_kernels_available, kernels_available

needs_kernel = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_kernels_available()),
                                  reason="needs a CUDA GPU and tscale._C built with its CUDA kernels")
needs_sm80 = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0),
                                reason="the kernel needs sm_80 or newer")


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
    want = reference_grads(q, k, v, do, **kw)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
        assert_close(name, a, b)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "one", "sparse", "short", "each"])
@pytest.mark.parametrize("window", [0, 1, 16, 128, 300])
@pytest.mark.parametrize("D", [64, 128])
def test_kernel_matches_reference(D, window, layout, sink):
    _check_kernel(*make_case(2, 3, 333, D, layout, seed=window, device="cuda"), window=window, sink=sink)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "sparse", "each"])
@pytest.mark.parametrize("window", [0, 1, 128, 300])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("main", ["mma", "auto"])
def test_split_backward_matches_reference(main, D, window, layout, sink, monkeypatch):
    """The split backward (TSCALE_ATTENTION_BWD_DQ=split): the query-major dQ kernel, then the sm_80 main kernel
    (mma) or the one the GPU prefers (auto: the Hopper one at head dim 128 on sm_90) without dQ; dq reproducible."""
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_DQ", "split")
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_KERNEL", main)
    case = make_case(2, 3, 332, D, layout, seed=window + 3, device="cuda")
    _check_kernel(*case, window=window, sink=sink)
    q, k, v, do, docs = case
    kw = dict(window=window, doc_ids=docs, sink=sink, scale=D ** -0.5)

    def dq():
        leaf = q.detach().clone().requires_grad_()
        return torch.autograd.grad(attention_kernel(leaf, k, v, **kw), leaf, do)[0]
    assert torch.equal(dq(), dq())


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("window", [0, 128])
def test_kernels_with_the_shared_memory_of_a_smaller_gpu(D, window, monkeypatch):
    """TSCALE_ATTENTION_SMEM_PER_SM_KB=100 runs the sm_80 kernels as on an sm_86 / sm_89 GPU (padded launches, and
    with TSCALE_ATTENTION_FWD_V_IN_Q=auto the forward's V in Q's buffer at head dim 128); a value past this GPU's
    shared memory is refused by name."""
    monkeypatch.setenv("TSCALE_ATTENTION_FWD_KERNEL", "mma")
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_KERNEL", "mma")
    monkeypatch.setenv("TSCALE_ATTENTION_SMEM_PER_SM_KB", "100")
    monkeypatch.setenv("TSCALE_ATTENTION_FWD_V_IN_Q", "auto")
    case = make_case(2, 3, 300, D, "sparse", seed=D + window, device="cuda")
    _check_kernel(*case, window=window, sink=True)
    monkeypatch.setenv("TSCALE_ATTENTION_SMEM_PER_SM_KB", "100000")
    with pytest.raises(RuntimeError, match="TSCALE_ATTENTION_SMEM_PER_SM_KB must be a count of KB"):
        _check_kernel(*case, window=window, sink=True)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("B,H,T", [(1, 1, 1), (1, 1, 64), (2, 3, 100), (1, 8, 257), (4, 2, 1000), (3, 4, 1024),
                                   (2, 4, 2048)])
@pytest.mark.parametrize("fwd", ["auto", "16-2", "32-2", "16-3", "16-2-v", "sm90-64-1", "sm90-64-2", "ws-128-2",
                                 "ws-64-3"])
def test_kernel_shapes(B, H, T, D, fwd, monkeypatch):
    set_forward_config(fwd, monkeypatch, D)
    case = make_case(B, H, T, D, "sparse", seed=T, device="cuda")
    _check_kernel(*case, window=128, sink=True)
    _check_kernel(*case[:4], None, window=0, sink=False)


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "sparse", "each"])
@pytest.mark.parametrize("window", [0, 16, 128, 300])
@pytest.mark.parametrize("fwd", ["sm90-64-1", "sm90-128-1", "sm90-64-2", "sm90-128-2", "ws-128-2-1", "ws-64-2-1",
                                 "ws-128-3-1", "ws-128-2-0", "ws-128-2-0-1", "ws-64-2-0-1"])
def test_hopper_forward_matches_reference(fwd, window, layout, sink, monkeypatch):
    """The sm_90a forwards (wgmma) on every mask rule: the pipelined one at both key-tile sizes with one or two
    warpgroups a block, the specialised-warp one (TMA loads) at both tile sizes with two or three buffers, its
    consumers taking turns or not, and its persistent form (two blocks walking the call's 2 x 3 x 3 = 18 query tiles,
    TSCALE_ATTENTION_SM90_BLOCKS); the backward after it is the sm_80 kernel's, fed the Hopper forward's output and
    logsumexp."""
    set_forward_config(fwd, monkeypatch)
    _check_kernel(*make_case(2, 3, 333, 128, layout, seed=window + 1, device="cuda"), window=window, sink=sink)


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize("form", HOPPER_BACKWARD_FORMS)
@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("layout", ["none", "sparse", "each"])
@pytest.mark.parametrize("window", [0, 16, 128, 300])
def test_hopper_backward_matches_reference(window, layout, sink, form, monkeypatch):
    """The sm_90a backward main kernel (TSCALE_ATTENTION_BWD_KERNEL=sm90) in each form, after the op's own
    forward."""
    if not hopper():
        pytest.skip("the Hopper backward needs an sm_90 GPU")
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_KERNEL", "sm90")
    set_backward_form(form, monkeypatch)
    T = 332 if backward_form_tma(form) == "2" else 333  # form 2 needs T a multiple of 4 (else it runs form 1)
    _check_kernel(*make_case(2, 3, T, 128, layout, seed=window + 2, device="cuda"), window=window, sink=sink)


@pytest.mark.cuda
@needs_kernel
@pytest.mark.parametrize("T", [333, 330])
def test_hopper_backward_rows_off_tma_boundaries(T, monkeypatch):
    """TMA 2 where a tile's lse, Delta and document ids would start off a 16-byte boundary (T not a multiple of 4;
    the GPU faults on such a load): the backward runs form 1 and matches the reference."""
    if not hopper():
        pytest.skip("the Hopper backward needs an sm_90 GPU")
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_KERNEL", "sm90")
    set_backward_form("1-2-1", monkeypatch)
    _check_kernel(*make_case(2, 3, T, 128, "sparse", seed=T, device="cuda"), window=0, sink=True)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("fwd", ["auto", "ws-128-2"])  # the second: TMA maps of the views (an sm_90 GPU only)
@pytest.mark.parametrize("window", [128, 0])
def test_kernel_strided_inputs_and_int64_docs(window, fwd, monkeypatch):
    """The model passes q, k, v as (B, T, H, D) views transposed to (B, H, T, D), and int64 document ids."""
    set_forward_config(fwd, monkeypatch)
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
    q, k, v, do, docs = make_case(2, 3, 300, 128, "short", seed=11, device="cuda")
    docs32, scale = docs.int(), 128 ** -0.5
    out, lse = torch.ops.tscale.attention_fwd_cuda(q, k, v, docs32, 64, True, scale)
    want = reference_grads(q, k, v, do, window=64, doc_ids=docs, sink=True, scale=scale)[1:]

    def backward():
        return torch.ops.tscale.attention_bwd_cuda(do, q, k, v, out, lse, docs32, 64, True, scale)

    for name, a, b in zip(("dq", "dk", "dv"), backward(), want):
        assert_close(name, a, b)
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
            assert_close(f"replayed {name}", a, b)
    for name, a, b in zip(("dq", "dk", "dv"), backward(), want):
        assert_close(f"eager {name} after the graph", a, b)


@pytest.mark.cuda
@needs_kernel
@needs_sm80
@pytest.mark.parametrize("sink", [False, True])
def test_lonely_rows_are_finite(sink):
    """Every query sees itself, so no row is ever empty; the nearest cases are a query whose only key is
    itself (window 1, or documents of length 1) and, with the sink, logits so negative that every key's
    weight underflows: outputs are finite, and ~0 in the second case."""
    q, k, v, do, _ = make_case(1, 2, 130, 64, "none", device="cuda")
    docs = torch.arange(130, device="cuda").expand(1, 130)
    for kw in (dict(window=1, doc_ids=None), dict(window=0, doc_ids=docs)):
        out = attention_kernel(q, k, v, sink=sink, scale=0.125, **kw)
        want = attention_reference(q.float(), k.float(), v.float(), sink=sink, scale=0.125, **kw)
        assert_close("out", out, want)
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
    q, k, v, do, docs = make_case(2, 2, 96, 128, "sparse", device="cuda")
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
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), reference_grads(q, k, v, do, **kw)):
        assert_close(name, a, b)
    opcheck_kernel_ops(q, k, v, do, docs.int(), 16, 128 ** -0.5)


# ---------------------------------------------------------------------------------------------
# Path selection (CPU)
# ---------------------------------------------------------------------------------------------

def test_kernel_refuses_shapes_past_its_grid_before_any_launch():
    """Sequences longer than 65535 tiles of 64 rows, or more than 65535 sequences, go to another path."""
    q = torch.empty(1, 1, 1, 64, dtype=torch.bfloat16).expand(1, 1, KERNEL_MAX_SEQ_LEN + 1, 64)
    assert "past the kernel's grid" in kernel_unusable_reason(q, q, q)
    wide = torch.empty(1, 1, 1, 64, dtype=torch.bfloat16).expand(KERNEL_MAX_BATCH + 1, 1, 64, 64)
    assert "past the kernel's grid" in kernel_unusable_reason(wide, wide, wide)
    fits = torch.empty(1, 1, 1, 64, dtype=torch.bfloat16).expand(1, 1, KERNEL_MAX_SEQ_LEN, 64)
    assert "not CUDA" in kernel_unusable_reason(fits, fits, fits)


def test_path_selection_on_cpu(monkeypatch):
    q, k, v, _, docs = make_case(1, 2, 40, 64, "sparse")
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
    q, k, v, do, docs = make_case(1, 2, 30, 64, "sparse", seed=5)
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
    q, k, v, _, docs = make_case(2, 2, 50, 64, "sparse", seed=4)
    q, k, v = q.float(), k.float(), v.float()
    kw = dict(window=7, doc_ids=docs, sink=True, scale=0.2)
    want = attention_reference(q, k, v, **kw)
    for impl in ("flex", "reference"):
        torch.testing.assert_close(attention(q, k, v, impl=impl, **kw), want, atol=2e-5, rtol=1e-4)


def test_sdpa_path_is_plain_causal_attention_and_refuses_masks(monkeypatch):
    """The benchmarks' baseline: forced only, exact on plain causal calls, an error for any other mask."""
    monkeypatch.delenv("TSCALE_ATTENTION", raising=False)
    q, k, v, do, docs = make_case(2, 2, 33, 64, "sparse", seed=6)
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
    q, k, v, _, _ = make_case(1, 1, 8, 64, "none")  # attention has CUDA kernels only
    with pytest.raises(NotImplementedError):
        torch.ops.tscale.attention_fwd_cuda(q, k, v, None, 0, True, 0.1)
