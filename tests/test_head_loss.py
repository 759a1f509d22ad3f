"""The one-pass head loss's kernel and reference twin (tscale/ops/head_loss.py).

The kernel's source (csrc/loss/softcap_xent_kernel.cuh) runs on a GPU (tests marked cuda) and on the CPU
emulator of tests/attention_emu (tests/loss_emu, built by torch.utils.cpp_extension; TSCALE_SKIP_EMU=1 skips
those), each compared with the reference twin on random logits.

The loss against the logits path, in the models, compiled and in training, is tested with the chunked one in
test_fused_loss.py.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers_emu import build_emulator

from tscale.ops.head_loss import softcap_xent_grad, softcap_xent_grad_reference

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _logits(N, V_pad, seed=0, dtype=torch.float32, device="cpu", spread=4.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, V_pad, generator=g) * spread).to(device=device, dtype=dtype)


@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_reference_twin_is_cross_entropy_and_its_gradient(softcap):
    """Losses are F.cross_entropy's per token; grad is autograd's gradient of their sum, times scale."""
    N, V, V_pad, scale = 29, 37, 40, 0.25
    logits = _logits(N, V_pad, dtype=torch.float64)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(1))
    x = logits.clone().requires_grad_()
    z = softcap * torch.tanh(x / softcap) if softcap else x
    want = F.cross_entropy(z[:, :V], targets, reduction="none")
    want.sum().backward()
    losses, grad = softcap_xent_grad_reference(logits, targets, V, softcap, scale)
    torch.testing.assert_close(losses, want.detach().float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, x.grad * scale, rtol=1e-4, atol=1e-7)  # the twin computes in float32
    assert torch.all(grad[:, V:] == 0) and grad[:, :V].abs().sum() > 0


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("softcap", [0.0, 15.0, 50.0])  # no cap, a fixed reference, a running maximum
@pytest.mark.parametrize("N,V,V_pad", [(37, 1000, 1024), (5, 8, 8), (64, 50257, 50304), (3, 65530, 65536),
                                       (2, 131_071, 131_072)])
def test_kernel_matches_its_reference_on_random_logits(N, V, V_pad, softcap):
    logits = _logits(N, V_pad, seed=N, dtype=torch.bfloat16, device="cuda")
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(V)).cuda()
    scale = 1.0 / N
    losses, grad = torch.ops.tscale.softcap_xent_grad(logits, targets, V, softcap, scale)
    want_losses, want_grad = softcap_xent_grad_reference(logits, targets, V, softcap, scale)
    assert grad.dtype == torch.bfloat16 and grad.shape == logits.shape
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=2e-2, atol=1e-3 * scale)
    assert torch.all(grad[:, V:] == 0)
    if not softcap:  # softmax minus one-hot: every row sums to 0 (the soft-cap's derivative weighs the terms apart)
        assert (grad.float().sum(1).abs() <= 1e-2 * scale).all(), "each row's gradient sums to about 0"


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("softcap", [15.0, 30.0])
def test_kernel_is_exact_where_the_stash_would_not_be(softcap):
    N, V, V_pad = 64, 50257, 50304
    logits, targets = _confident_rows(N, V, V_pad, softcap, device="cuda")
    losses, grad = torch.ops.tscale.softcap_xent_grad(logits, targets, V, softcap, 1.0 / N)
    want_losses, want_grad = softcap_xent_grad_reference(logits, targets, V, softcap, 1.0 / N)
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=2e-2, atol=1e-6 / N)
    assert torch.all(grad[:, V:] == 0)


@pytest.mark.cuda
@cuda
def test_kernel_marks_a_target_outside_the_vocabulary():
    logits = _logits(4, 64, dtype=torch.bfloat16, device="cuda")
    losses, _ = softcap_xent_grad(logits, torch.tensor([0, 49, 50, -1], device="cuda"), 50, 0.0, 1.0)
    assert torch.isfinite(losses[:2]).all() and torch.isnan(losses[2:]).all()


@pytest.fixture(scope="module")
def emu():
    return build_emulator("tscale_loss_emu", "loss_emu/softcap_xent_emu.cpp", ["csrc/loss", "tests/loss_emu"])


EMU_CASES = [  # N, V, V_pad, softcap: rows of 5 to 6,288 vectors of 8 (the last the GPT-2 vocabulary); caps of 40
    (3, 37, 40, 0.0), (2, 1000, 1024, 15.0), (2, 5000, 5120, 0.0), (1, 50257, 50304, 30.0), (2, 3000, 3072, 50.0)]
# or less sum against a fixed reference, a larger cap keeps a running maximum


@pytest.mark.parametrize("seed", [0, 1])  # the emulator's fibers run in another random order
@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_emulated_kernel_matches_its_reference(emu, case, seed):
    N, V, V_pad, softcap = case
    emu.set_seed(seed)
    logits = _logits(N, V_pad, seed=V + seed, dtype=torch.bfloat16)
    targets = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(seed))
    losses, grad = emu.softcap_xent_grad(logits, targets, V, softcap, 1.0 / N)
    want_losses, want_grad = softcap_xent_grad_reference(logits, targets, V, softcap, 1.0 / N)
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=1e-2, atol=1e-6 / N)  # one bf16 rounding apart
    assert torch.all(grad[:, V:] == 0) and grad[:, :V].abs().sum() > 0


def _confident_rows(N, V, V_pad, softcap, seed=0, dtype=torch.bfloat16, device="cpu"):
    """Logits of the terms that the kernel computes from the logits rather than from pass 1's stash: in even rows
    the target takes most of the softmax (its gradient, softmax - 1, cancels), odd rows have values past the
    soft-cap's knee (tanh > 0.95, where 1 - tanh^2 is small)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, V_pad, generator=g)  # (N, V_pad)
    targets = torch.randint(0, V, (N,), generator=g)
    even, odd = torch.arange(0, N, 2), torch.arange(1, N, 2)
    logits[even, targets[even]] = 0.9 * softcap  # softmax of the target about 0.9-0.99
    knee = torch.randint(0, V, (odd.numel(), 3), generator=g)
    logits[odd] = logits[odd].scatter(1, knee, 4.0 * softcap * torch.sign(torch.randn(odd.numel(), 3, generator=g)))
    logits[:, V:] = 100.0  # padding columns never count
    return logits.to(device=device, dtype=dtype), targets.to(device)


def test_emulated_kernel_is_exact_where_the_stash_would_not_be(emu):
    N, V, V_pad, softcap = 4, 1000, 1024, 15.0
    logits, targets = _confident_rows(N, V, V_pad, softcap)
    losses, grad = emu.softcap_xent_grad(logits, targets, V, softcap, 1.0 / N)
    want_losses, want_grad = softcap_xent_grad_reference(logits, targets, V, softcap, 1.0 / N)
    even = torch.arange(0, N, 2)
    assert (want_grad[even, targets[even]].float() * N > -0.1).all(), "the targets take most of the softmax"
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=1e-2, atol=1e-6 / N)
    assert torch.all(grad[:, V:] == 0)


def test_emulated_kernel_marks_targets_outside_the_vocabulary_and_refuses_bad_rows(emu):
    logits = _logits(4, 64, dtype=torch.bfloat16)
    losses, _ = emu.softcap_xent_grad(logits, torch.tensor([0, 49, 50, -1]), 50, 0.0, 1.0)
    assert torch.isfinite(losses[:2]).all() and torch.isnan(losses[2:]).all()
    with pytest.raises(RuntimeError, match="multiple of 8"):
        emu.softcap_xent_grad(_logits(2, 60, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.long), 50, 0.0, 1.0)
    with pytest.raises(RuntimeError, match="bf16"):
        emu.softcap_xent_grad(_logits(2, 64), torch.zeros(2, dtype=torch.long), 50, 0.0, 1.0)
