"""The fused attention kernel's source (csrc/attention) run on CPU through an emulator, against attention_reference.

The emulator (tests/attention_emu) runs the kernels on CPU fibers, one per CUDA thread, with ldmatrix, mma, wgmma,
cp.async and TMA emulated as the PTX ISA describes them; it costs about a minute of compiling, cached by torch. The
tests check every kernel and form on small cases with copies landing at random, early and late times, and the custom
op's autograd, fake tensors and torch.compile. TSCALE_SKIP_EMU=1 skips them.
Tolerances as in tests/test_attention_kernel.py (helpers_attention_kernel.TOL).
"""

import pytest
import torch
from helpers_attention_kernel import (HOPPER_BACKWARD_FORMS, assert_close, make_case, opcheck_kernel_ops,
                                      reference_grads, set_backward_form, set_forward_config)
from helpers_emu import build_emulator

from tscale.ops.attention import attention_kernel
from tscale.ops.backend import kernels_available


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


@pytest.mark.parametrize("fwd", ["16-2", "32-2", "16-3", "16-2-v"])
@pytest.mark.parametrize("copy_mode", [0, 1])  # cp.async copies land at random times / as early as possible
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_kernel_matches_reference(emu, case, copy_mode, fwd, monkeypatch):
    """With copy_mode 0 the blocks also run in a random order, as hardware may run them."""
    set_forward_config(fwd, monkeypatch)
    B, H, T, D, window, layout, sink = case
    emu.set_seed(T + copy_mode)
    emu.set_copy_mode(copy_mode)
    emu.set_block_order(1 - copy_mode)
    q, k, v, do, docs = make_case(B, H, T, D, layout, seed=T)
    docs32 = docs.int() if docs is not None else None
    kw = dict(window=window, doc_ids=docs, sink=sink, scale=D ** -0.5)
    out, lse = emu.fwd(q, k, v, docs32, window, sink, D ** -0.5)
    dq, dk, dv = emu.bwd(do, q, k, v, out, lse, docs32, window, sink, D ** -0.5)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), reference_grads(q, k, v, do, **kw)):
        assert_close(name, a, b)


EMU_HOPPER_CASES = [c for c in EMU_CASES if c[3] == 128] + [(2, 1, 300, 128, 100, "sparse", True)]


def _emulated_case(emu, case, copy_mode):
    """An EMU_*_CASES entry's inputs with the emulator seeded, in copy_mode, blocks in a random order:
    (q, k, v, do, int32 document ids or None, the reference's keywords)."""
    B, H, T, D, window, layout, sink = case
    emu.set_seed(T + copy_mode)
    emu.set_copy_mode(copy_mode)
    emu.set_block_order(1)
    q, k, v, do, docs = make_case(B, H, T, D, layout, seed=T)
    docs32 = docs.int() if docs is not None else None
    return q, k, v, do, docs32, dict(window=window, doc_ids=docs, sink=sink, scale=D ** -0.5)


@pytest.mark.parametrize("copy_mode", [0, 1, 2])  # copies land at random times / early / late
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_split_backward_matches_reference(emu, case, copy_mode, monkeypatch):
    """The split backward (TSCALE_ATTENTION_BWD_DQ=split): the query-major dQ kernel, then the sm_80 main kernel
    without dQ, blocks in a random order; dq, dk, dv against the reference, dq the same in two runs (no atomics)."""
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_DQ", "split")
    q, k, v, do, docs32, kw = _emulated_case(emu, case, copy_mode)
    args = (docs32, kw["window"], kw["sink"], kw["scale"])
    out, lse = emu.fwd(q, k, v, *args)
    grads = emu.bwd(do, q, k, v, out, lse, *args)
    for name, a, b in zip(("dq", "dk", "dv"), grads, reference_grads(q, k, v, do, **kw)[1:]):
        assert_close(name, a, b)
    assert torch.equal(emu.bwd(do, q, k, v, out, lse, *args)[0], grads[0])


def test_emulated_backward_dq_setting_is_checked(emu, monkeypatch):
    monkeypatch.setenv("TSCALE_ATTENTION_BWD_DQ", "both")
    q, k, v, do, docs32, kw = _emulated_case(emu, EMU_CASES[0], 1)
    out, lse = emu.fwd(q, k, v, docs32, kw["window"], kw["sink"], kw["scale"])
    with pytest.raises(RuntimeError, match="TSCALE_ATTENTION_BWD_DQ must be atomic, split or auto, got 'both'"):
        emu.bwd(do, q, k, v, out, lse, docs32, kw["window"], kw["sink"], kw["scale"])


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
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), reference_grads(q, k, v, do, **kw)):
        assert_close(name, a, b)


# Every form with copies and TMA loads landing at random times (0), early (1) and late (2); the split forms with the
# sm_80 dQ kernel (emulated in every mode by the split tests above) and the Hopper one waiting at once only late.
HOPPER_BACKWARD_RUNS = [(form, mode) for form in HOPPER_BACKWARD_FORMS for mode in (0, 1, 2)
                        if mode == 2 or not form.startswith(("s0-", "s1-"))]


@pytest.mark.parametrize("form, copy_mode", HOPPER_BACKWARD_RUNS)
@pytest.mark.parametrize("case", EMU_HOPPER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_hopper_backward_matches_reference(emu, case, copy_mode, form, monkeypatch):
    """The sm_90a backward main kernel's source (wgmma: S^T, dP^T, dV, dK and dQ products) between the sm_80 delta and
    dq kernels, emulated in each form, fed the sm_80 forward's output and logsumexp: dq, dk, dv against the
    reference. With copy_mode 2 a product lands only at the wait that retires it, so an operand or accumulator
    touched before then changes the result."""
    set_backward_form(form, monkeypatch)
    q, k, v, do, docs32, kw = _emulated_case(emu, case, copy_mode)
    out, lse = emu.fwd(q, k, v, docs32, kw["window"], kw["sink"], kw["scale"])
    grads = emu.bwd_sm90(do, q, k, v, out, lse, docs32, kw["window"], kw["scale"])
    for name, a, b in zip(("dq", "dk", "dv"), grads, reference_grads(q, k, v, do, **kw)[1:]):
        assert_close(name, a, b)


@pytest.mark.parametrize("form", ["128-2-1", "64-2-1", "128-3-1", "128-2-0", "128-2-0-1", "64-2-0-1"])  # BN-STAGES-PINGPONG[-PERSISTENT]
@pytest.mark.parametrize("copy_mode", [0, 1, 2])  # loads and products land at random times / early / late
@pytest.mark.parametrize("case", EMU_HOPPER_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_hopper_ws_forward_matches_reference(emu, case, copy_mode, form, monkeypatch):
    """The specialised-warp forward (a producer warp's TMA loads and mbarriers, two consumer warpgroups) against the
    reference, its logsumexp against the sm_80 forward's. With copy_mode 2 a TMA load lands only at the first wait
    on its barrier, so a consumer that reads a buffer before waiting sees the 0xFF poison; with copy_mode 1 at
    issue, so a producer that refills a buffer still being read changes the result. With PINGPONG 1 the consumers
    take turns through named barriers, which must balance by the block's end. With PERSISTENT 1 the emulated device's
    three blocks each walk several work tiles, one ring of K and V buffers and two Q buffers across them."""
    bn, stages, pingpong, *persistent = form.split("-")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BN", bn)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_STAGES", stages)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_PINGPONG", pingpong)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_PERSISTENT", persistent[0] if persistent else "0")
    q, k, v, do, docs32, kw = _emulated_case(emu, case, copy_mode)
    args = (docs32, kw["window"], kw["sink"], kw["scale"])
    out, lse = emu.fwd_sm90_ws(q, k, v, *args)
    _assert_lse_like_sm80(emu, lse, q, k, v, args)
    assert_close("out", out, reference_grads(q, k, v, do, **kw)[0])


def test_emulated_hopper_ws_forward_strided_inputs(emu):
    """(B, T, H, D) storage seen as (B, H, T, D) through the TMA maps' strides, NaN-filled neighbours around it."""
    B, H, T, D = 2, 2, 150, 128
    q, k, v, do = _nan_framed_views(emu, B, H, T, D, seed=2)
    out, _ = emu.fwd_sm90_ws(q, k, v, None, 0, True, D ** -0.5)
    assert_close("out", out, reference_grads(q, k, v, do, window=0, doc_ids=None, sink=True, scale=D ** -0.5)[0])


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
    want = reference_grads(q, k, v, do, window=0, doc_ids=None, sink=True, scale=D ** -0.5)[1:]
    for name, a, b in zip(("dq", "dk", "dv"), grads, want):
        assert_close(name, a, b)


@pytest.mark.parametrize("blocks", ["1", "2"])
def test_emulated_persistent_forward_with_fewer_blocks(emu, blocks, monkeypatch):
    """One or two blocks walk every work tile of a call with documents, a window and rows past T."""
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_PERSISTENT", "1")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BLOCKS", blocks)
    q, k, v, do, docs32, kw = _emulated_case(emu, (2, 2, 330, 128, 200, "short", True), copy_mode=0)
    args = (docs32, kw["window"], kw["sink"], kw["scale"])
    out, lse = emu.fwd_sm90_ws(q, k, v, *args)
    _assert_lse_like_sm80(emu, lse, q, k, v, args)
    assert_close("out", out, reference_grads(q, k, v, do, **kw)[0])


@pytest.mark.parametrize("settings, message", [
    ({"TSCALE_ATTENTION_SM90_BLOCKS": "0"}, "TSCALE_ATTENTION_SM90_BLOCKS must be auto or a count from 1 to 65535"),
    ({"TSCALE_ATTENTION_SM90_PINGPONG": "1"}, "PERSISTENT=1 runs two buffers without turns"),
    ({"TSCALE_ATTENTION_SM90_STAGES": "3"}, "PERSISTENT=1 runs two buffers without turns"),
])
def test_emulated_persistent_forward_config_is_checked(emu, monkeypatch, settings, message):
    q, k, v, _, _ = make_case(1, 1, 64, 128, "none")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_PERSISTENT", "1")
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match=message):
        emu.fwd_sm90_ws(q, k, v, None, 0, False, 0.125)


def test_emulated_hopper_ws_forward_config_is_checked(emu, monkeypatch):
    q, k, v, _, _ = make_case(1, 1, 64, 128, "none")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_STAGES", "4")
    with pytest.raises(RuntimeError, match="TSCALE_ATTENTION_SM90_STAGES must be one of auto, 2, 3; got '4'"):
        emu.fwd_sm90_ws(q, k, v, None, 0, False, 0.125)


def test_emulated_hopper_forward_refuses_head_dim_64(emu):
    q, k, v, _, _ = make_case(1, 1, 64, 64, "none")
    with pytest.raises(RuntimeError, match="serves head dim 128"):
        emu.fwd_sm90(q, k, v, None, 0, False, 0.125)


@pytest.mark.parametrize("settings, message", [
    ({"ROWS": "32", "BLOCKS": "3"}, "needs 16 rows per warp"),
    ({"ROWS": "32", "BLOCKS": "4"}, "TSCALE_ATTENTION_FWD_BLOCKS must be 2 or 3"),
    ({"ROWS": "16", "BLOCKS": "3", "V_IN_Q": "1"}, "V_IN_Q needs 16 rows per warp and 2 blocks"),
    ({"V_IN_Q": "yes"}, "TSCALE_ATTENTION_FWD_V_IN_Q must be 0, 1 or auto, got 'yes'"),
])
def test_emulated_forward_config_is_checked(emu, monkeypatch, settings, message):
    """Three blocks a multiprocessor exist only for 64-query tiles, V in Q's buffer only with two of them; a bad
    override names its variable."""
    q, k, v, _, _ = make_case(1, 1, 64, 128, "none")
    for name, value in settings.items():
        monkeypatch.setenv(f"TSCALE_ATTENTION_FWD_{name}", value)
    with pytest.raises(RuntimeError, match=message):
        emu.fwd(q, k, v, None, 0, False, 0.125)


@pytest.mark.parametrize("D", [64, 128])
def test_emulated_forward_puts_v_in_q_where_shared_memory_is_small(emu, D, monkeypatch):
    """The emulated GPU has sm_89's 100 KB a multiprocessor: at head dim 128 TSCALE_ATTENTION_FWD_V_IN_Q=auto takes
    V in Q's buffer (two blocks fit, one of the 53 KB layout), at head dim 64 (28 KB) not; unset, neither does. Which
    kernel ran is told by the emulator's count of thread switches, the same in every run of one form with copies
    landing at issue."""
    q, k, v, _, _ = make_case(1, 2, 200, D, "none")
    emu.set_copy_mode(1)
    emu.set_block_order(0)

    def switches(form, v_in_q_setting=None):
        set_forward_config(form, monkeypatch, D)
        if form == "auto":
            for name in ("ROWS", "BLOCKS", "V_IN_Q"):
                monkeypatch.delenv(f"TSCALE_ATTENTION_FWD_{name}", raising=False)
            if v_in_q_setting is not None:
                monkeypatch.setenv("TSCALE_ATTENTION_FWD_V_IN_Q", v_in_q_setting)
        before = emu.switches()
        emu.fwd(q, k, v, None, 0, True, D ** -0.5)
        return emu.switches() - before

    chosen, v_in_q, plain = switches("auto", "auto"), switches("16-2-v"), switches("16-2")
    assert v_in_q != plain
    assert (chosen == v_in_q) == (D == 128)
    assert switches("auto") != v_in_q


def test_emulated_kernels_cover_every_tile_head_and_batch_row(emu):
    """Every kernel family (the sm_80 forward and backward, the Hopper forwards and backward): its blocks, run in a
    random order, map to distinct (tile, head, batch row) that together cover all of them; two batch rows of three
    heads, so that a head mistaken for a batch row shows."""
    case = (2, 3, 200, 128, 0, "sparse", True)
    q, k, v, do, docs32, kw = _emulated_case(emu, case, 0)
    args = (docs32, kw["window"], kw["sink"], kw["scale"])
    want = reference_grads(q, k, v, do, **kw)
    out, lse = emu.fwd(q, k, v, *args)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *emu.bwd(do, q, k, v, out, lse, *args)), want):
        assert_close(name, a, b)
    assert_close("out sm90", emu.fwd_sm90(q, k, v, *args)[0], want[0])
    assert_close("out ws", emu.fwd_sm90_ws(q, k, v, *args)[0], want[0])
    for name, a, b in zip(("dq", "dk", "dv"), emu.bwd_sm90(do, q, k, v, out, lse, *args[:2], kw["scale"]), want[1:]):
        assert_close(name + " sm90", a, b)


def test_tile_grid_puts_heads_fastest_and_checks_the_tile_count(emu):
    """The launch grid is (H, tiles, B), and the dims with a 65535 limit (y, z) are checked against it."""
    assert emu.tile_grid(7, 6, 3) == (6, 7, 3)
    assert emu.tile_grid(65535, 70000, 65535) == (70000, 65535, 65535)
    with pytest.raises(RuntimeError, match="at most 65535 query or key tiles and 65535 sequences a call, got 65536 tiles"):
        emu.tile_grid(65536, 6, 1)
    with pytest.raises(RuntimeError, match="got 1 tiles and 65536 sequences"):
        emu.tile_grid(1, 6, 65536)


@pytest.mark.parametrize("variable, allowed", [("WGS", "1, 2"), ("TMA", "0, 1, 2"), ("EARLY_DV", "0, 1"),
                                               ("DQ_FIRST", "0, 1"), ("DQ_V4", "0, 1")])
def test_emulated_hopper_backward_config_is_checked(emu, monkeypatch, variable, allowed):
    """A bad value of a Hopper backward setting names its variable and the values it takes."""
    q, k, v, do, _ = make_case(1, 1, 64, 128, "none")
    out, lse = emu.fwd(q, k, v, None, 0, False, 0.125)
    name = f"TSCALE_ATTENTION_SM90_BWD_{variable}"
    monkeypatch.setenv(name, "3")
    with pytest.raises(RuntimeError, match=f"{name} must be one of auto, {allowed}; got '3'"):
        emu.bwd_sm90(do, q, k, v, out, lse, None, 0, 0.125)


def test_emulated_hopper_backward_dq_first_needs_early_dv(emu, monkeypatch):
    q, k, v, do, _ = make_case(1, 1, 64, 128, "none")
    out, lse = emu.fwd(q, k, v, None, 0, False, 0.125)
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BWD_DQ_FIRST", "1")
    monkeypatch.setenv("TSCALE_ATTENTION_SM90_BWD_EARLY_DV", "0")
    with pytest.raises(RuntimeError, match="DQ_FIRST=1 needs TSCALE_ATTENTION_SM90_BWD_EARLY_DV=1"):
        emu.bwd_sm90(do, q, k, v, out, lse, None, 0, 0.125)


@pytest.mark.parametrize("scale", [-0.125, 0.0, float("inf")])
def test_emulated_kernels_refuse_a_scale_that_is_not_positive(emu, scale):
    """The Hopper forwards scale the raw scores' running max, which needs a positive scale: others are refused by name,
    by the backward too (its lse can only come from a forward that took the scale)."""
    q, k, v, do, _ = make_case(1, 1, 64, 128, "none")
    with pytest.raises(RuntimeError, match="attention_fwd_cuda: scale must be finite and positive"):
        emu.fwd(q, k, v, None, 0, False, scale)
    out, lse = emu.fwd(q, k, v, None, 0, False, 0.125)
    with pytest.raises(RuntimeError, match="attention_bwd_cuda: scale must be finite and positive"):
        emu.bwd(do, q, k, v, out, lse, None, 0, False, scale)


def test_emulated_kernel_strided_inputs(emu):
    """(B, T, H, D) storage seen as (B, H, T, D), with NaN-filled neighbours: a stray read would show."""
    q, k, v, do = _nan_framed_views(emu, B=1, H=2, T=70, D=64, seed=1)
    out, lse = emu.fwd(q, k, v, None, 0, True, 0.125)
    grads = emu.bwd(do, q, k, v, out, lse, None, 0, True, 0.125)
    want = reference_grads(q, k, v, do, window=0, doc_ids=None, sink=True, scale=0.125)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
        assert_close(name, a, b)


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
    q, k, v, do, docs = make_case(1, 2, 80, 64, "sparse", seed=3)
    kw = dict(window=9, doc_ids=docs, sink=True, scale=0.125)
    want = reference_grads(q, k, v, do, **kw)

    def fn(a, b, c):
        return attention_kernel(a, b, c, **kw)

    for run in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        grads = torch.autograd.grad(out, leaves, do)
        for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), want):
            assert_close(name, a, b)
    opcheck_kernel_ops(q, k, v, do, docs.int(), 9, 0.125)
