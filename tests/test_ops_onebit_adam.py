"""The fused 1-bit Adam passes (tscale._C, CPU) against their torch references, on random data."""

import pytest
import torch

from tscale.ops import kernels_available, onebit_adam

pytestmark = pytest.mark.skipif(not kernels_available(), reason="tscale._C is not built")


def _random(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"g": torch.randn(n, generator=g) * 5, "m": torch.randn(n, generator=g) * 0.1,
            "d": torch.rand(n, generator=g) * 0.5 + 1e-3, "p": torch.randn(n, generator=g),
            "inv_d": 1 / (torch.rand(n, generator=g) * 0.5 + 1e-3)}


@pytest.mark.parametrize("n", [1, 7, 1000, 200_003])
def test_fold_matches_reference(n):
    t = _random(n, n)
    got, want = t["g"].clone(), t["g"].clone()
    torch.ops.tscale.onebit_adam_fold_(got, t["m"], t["inv_d"], 0.9, 4.47)
    onebit_adam.onebit_adam_fold_reference(want, t["m"], t["inv_d"], 0.9, 4.47)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert (got - 0.9 * t["m"] * t["inv_d"]).abs().max() <= 0.1 * 4.47 + 1e-3  # the clamp bit (rounding of m inv_d)


@pytest.mark.parametrize("decay", [1.0, 0.999])
def test_step_matches_reference(decay):
    t = _random(50_001, 3)
    p, p_ref = t["p"].clone(), t["p"].clone()
    m, m_ref = torch.empty_like(p), torch.empty_like(p)
    torch.ops.tscale.onebit_adam_step_(p, m, t["g"], t["d"], decay, 3e-3)
    onebit_adam.onebit_adam_step_reference(p_ref, m_ref, t["g"], t["d"], decay, 3e-3)
    torch.testing.assert_close(p, p_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(m, m_ref)
    assert not torch.equal(p, t["p"])


def test_dispatch_takes_matrices_and_falls_back_for_strided():
    t = _random(64 * 32, 5)
    g = t["g"].view(64, 32)
    want = g.clone()
    onebit_adam.onebit_adam_fold_(g, t["m"].view(64, 32), t["inv_d"].view(64, 32), 0.9, 4.47)
    onebit_adam.onebit_adam_fold_reference(want, t["m"].view(64, 32), t["inv_d"].view(64, 32), 0.9, 4.47)
    torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6)
    strided = torch.randn(64, 64)[:, ::2]
    want = strided.clone()
    onebit_adam.onebit_adam_fold_(strided, t["m"].view(64, 32), t["inv_d"].view(64, 32), 0.9, 4.47)
    onebit_adam.onebit_adam_fold_reference(want, t["m"].view(64, 32), t["inv_d"].view(64, 32), 0.9, 4.47)
    torch.testing.assert_close(strided, want)


def test_kernel_rejects_mismatched_sizes():
    with pytest.raises(RuntimeError, match="onebit_adam_fold_: m has 3 elements, expected 4"):
        torch.ops.tscale.onebit_adam_fold_(torch.randn(4), torch.randn(3), torch.rand(4), 0.9, 1.0)


@pytest.mark.parametrize("layout,chunk", [
    ([(0, 300), (300, 5), (305, 1000)], 256),  # parameters end to end, chunks across their borders
    ([(3, 40), (50, 0), (50, 900), (1200, 77)], 64),  # gaps, an empty parameter, a short tail
    ([(0, 20_000)], 2048),
])
def test_fold_pack_is_fold_then_add_then_pack(layout, chunk):
    g = torch.Generator().manual_seed(len(layout))
    n = layout[-1][0] + layout[-1][1] + 11
    n_pad = -(-n // (2 * chunk)) * 2 * chunk
    bucket = torch.randn(n, generator=g) * 3  # (n,)
    worker = torch.randn(n_pad, generator=g) * 0.1  # (n_pad,) residual
    ms = [torch.randn(size, generator=g) * 0.1 for _, size in layout]
    inv_ds = [1 / (torch.rand(size, generator=g) * 0.5 + 1e-3) for _, size in layout]
    offsets = [off for off, _ in layout]
    want_worker, before = worker.clone(), bucket.clone()
    want = onebit_adam.onebit_adam_fold_pack_reference(want_worker, bucket, ms, inv_ds, offsets, 0.9, 31.6, chunk)
    got = torch.ops.tscale.onebit_adam_fold_pack_(worker, bucket, ms, inv_ds, offsets, 0.9, 31.6, chunk)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(worker, want_worker, rtol=1e-5, atol=1e-5)
    assert torch.equal(bucket, before)  # the bucket itself is not written


def test_fold_pack_refuses_overlapping_parameters():
    with pytest.raises(RuntimeError, match="overlaps another"):
        torch.ops.tscale.onebit_adam_fold_pack_(torch.zeros(64), torch.zeros(64), [torch.zeros(10)] * 2,
                                                [torch.ones(10)] * 2, [0, 5], 0.9, 31.6, 8)
