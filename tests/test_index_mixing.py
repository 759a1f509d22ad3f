"""The index's mixture with the model (tscale/index/mixing.py): gate, buckets, gate statistics, gradients."""

import pytest


def _mix_case(seed=6, b=2, t=5, v=11, d=8, k=3):
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, d, generator=g)
    logits = torch.randn(b, t, v, generator=g)
    match_len = torch.randint(0, 40, (b, t), generator=g)
    nxt = torch.randint(-1, v, (b, t, k), generator=g)
    cnt = torch.randint(0, 9, (b, t, k), generator=g) * (nxt >= 0)
    return hidden, logits, match_len, nxt, cnt


def test_index_mixer_gate_zero_is_the_model_and_sums_to_one():
    import torch
    from tscale.index.mixing import IndexMixer, length_bucket

    hidden, logits, match_len, nxt, cnt = _mix_case()
    assert length_bucket(torch.tensor([0, 1, 3, 4, 7, 8, 15, 16, 31, 32, 99])).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    mixer = IndexMixer(hidden.shape[-1], logits.shape[-1])
    out = mixer(hidden, logits, match_len, nxt, cnt)
    assert torch.allclose(out.exp().sum(-1), torch.ones(out.shape[:-1]), atol=1e-5)
    model = torch.log_softmax(logits, -1)
    zero = mixer(hidden, logits, torch.zeros_like(match_len), nxt, cnt)
    assert torch.equal(zero, model)
    with torch.no_grad():
        mixer.length_bias.weight.fill_(float("-inf"))  # gate sigmoid(-inf) = 0 at every length
    assert torch.equal(mixer(hidden, logits, match_len, nxt, cnt), model)


def test_index_mixer_and_inputs_pass_gradients():
    import torch
    from tscale.index.mixing import IndexInputs, IndexMixer, index_log_probs

    hidden, logits, match_len, nxt, cnt = _mix_case()
    v = logits.shape[-1]
    probs = index_log_probs(nxt, cnt, v, 0.5).exp()
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1]), atol=1e-5)
    one = index_log_probs(torch.tensor([[[3, -1]]]), torch.tensor([[[4, 0]]]), v, 0.5)[0, 0].exp()
    assert torch.isclose(one[3], torch.tensor(4.5 / (4 + 0.5 * v))) and torch.isclose(one[0], torch.tensor(0.5 / (4 + 0.5 * v)))
    inputs = IndexInputs(v, hidden.shape[-1])
    emb = inputs(torch.where(nxt[..., 0] >= 0, nxt[..., 0], torch.full_like(nxt[..., 0], v)), match_len)
    assert emb.shape == hidden.shape
    mixer = IndexMixer(hidden.shape[-1], v)
    torch.nn.init.normal_(mixer.gate_weight)  # it starts at zero, which would leave the hidden state no gradient
    hidden = hidden.requires_grad_(True)
    logits = logits.requires_grad_(True)
    mixed = hidden + emb
    targets = torch.randint(0, v, match_len.shape)
    loss = -mixer(mixed, logits, match_len, nxt, cnt).gather(-1, targets.unsqueeze(-1)).mean()
    loss.backward()
    for p in (hidden, logits, mixer.gate_weight, mixer.length_bias.weight, mixer.count_bias.weight,
              inputs.next_token.weight, inputs.bucket.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def _gate_case(seed=3, b=4, t=16, v=40, d=8, k=4):
    """Random lookups (0..k distinct next tokens, counts most frequent first, some all on one token) and logits
    that give the index's top token every probability from ~0 to ~1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, d, generator=g)
    match_len = torch.randint(0, 40, (b, t), generator=g)
    nxt = torch.rand(b, t, v, generator=g).argsort(-1)[..., :k]  # (B, T, K) distinct tokens
    peak = torch.rand(b, t, 1, generator=g) * 3  # (B, T, 1): 0 = all counts equal, 3 = one token holds ~90%
    cnt = (20 * torch.exp(-peak * torch.arange(k))).long() + torch.randint(0, 2, (b, t, k), generator=g)
    cnt = cnt.sort(-1, descending=True).values  # (B, T, K)
    keep = torch.arange(k) < torch.randint(0, k + 1, (b, t, 1), generator=g)  # (B, T, K): first n entries
    nxt, cnt = torch.where(keep, nxt, -1), cnt * keep
    logits = torch.randn(b, t, v, generator=g) * 2
    boost = torch.rand(b, t, 1, generator=g) * 14 - 4  # (B, T, 1)
    logits.scatter_add_(-1, nxt[..., :1].clamp(min=0), boost)
    targets = torch.where(torch.rand(b, t, generator=g) < 0.5, nxt[..., 0].clamp(min=0), torch.randint(0, v, (b, t), generator=g))
    return hidden, logits, match_len, nxt, cnt, targets


def _stats_mixer(d, v, seed=4, **kw):
    """A mixer with gate_stats whose every gate parameter is random (none left at its zero start)."""
    import torch
    from tscale.index.mixing import IndexMixer

    mixer = IndexMixer(d, v, gate_stats=True, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return mixer


def test_index_top_share_and_agreement_buckets():
    import math

    import torch
    from tscale.index.mixing import NUM_AGREE_BUCKETS, NUM_SHARE_BUCKETS, agree_bucket, index_top

    nxt = torch.tensor([[[5, 2, 9, -1], [7, -1, -1, -1], [-1, -1, -1, -1], [3, 4, 6, 8], [1, 2, 3, -1], [6, 4, -1, -1],
                         [8, 5, -1, -1], [9, 1, 2, 3]]])
    cnt = torch.tensor([[[5, 3, 2, 0], [4, 0, 0, 0], [0, 0, 0, 0], [9, 9, 9, 9], [1, 8, 1, 0], [4, 6, 0, 0],
                         [9, 1, 0, 0], [2, 1, 1, 1]]])
    top = index_top(nxt, cnt, 10)
    # shares: 0.5, all on one, none, 0.25, 0.8 (largest not first), 0.6 (likewise), 0.9, 0.4
    assert top.share_bucket.tolist() == [[3, 5, 0, 1, 4, 3, 4, 2]]
    assert top.token.tolist() == [[5, 7, 0, 3, 2, 4, 8, 9]] and top.found.tolist() == [[1, 1, 0, 1, 1, 1, 1, 1]]
    big = torch.tensor([[[3, 4]]])  # beyond float32's exact integers: all on one only when it truly is
    assert index_top(big, torch.tensor([[[1 << 30, 1]]]), 10).share_bucket.item() == 4
    assert index_top(big, torch.tensor([[[(1 << 30) + 1, 0]]]), 10).share_bucket.item() == 5
    p = torch.tensor([0.0001, 0.0099, 0.011, 0.05, 0.2, 0.31, 0.59, 0.61, 0.99, 0.5])
    found = torch.tensor([True] * 9 + [False])
    assert agree_bucket(p.log(), found).tolist() == [1, 1, 2, 2, 3, 4, 4, 5, 5, 0]
    assert NUM_SHARE_BUCKETS == 6 and NUM_AGREE_BUCKETS == 6 and math.isfinite(p.log().min())


def test_gate_stats_start_as_the_old_gate_and_change_it_once_trained():
    import torch
    from tscale.index.mixing import IndexMixer

    hidden, logits, match_len, nxt, cnt, targets = _gate_case()
    d, v = hidden.shape[-1], logits.shape[-1]
    old = IndexMixer(d, v)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in old.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    new = IndexMixer(d, v, gate_stats=True)
    missing, unexpected = new.load_state_dict(old.state_dict(), strict=False)
    assert sorted(missing) == ["agree_bias.weight", "pair_bias.weight", "share_bias.weight"] and not unexpected
    assert all(getattr(new, name).weight.abs().sum() == 0 for name in ("share_bias", "pair_bias", "agree_bias"))
    assert [n for n, _ in old.named_parameters()] == ["gate_weight", "length_bias.weight", "count_bias.weight"]
    assert torch.equal(new(hidden, logits, match_len, nxt, cnt), old(hidden, logits, match_len, nxt, cnt))
    assert torch.equal(new.nll(hidden, logits, match_len, nxt, cnt, targets),
                       old.nll(hidden, logits, match_len, nxt, cnt, targets))
    for name in ("share_bias", "pair_bias", "agree_bias"):  # each table alone moves the gate
        moved = IndexMixer(d, v, gate_stats=True)
        moved.load_state_dict(new.state_dict())
        with torch.no_grad():
            getattr(moved, name).weight.normal_(generator=g)
        diff = moved.nll(hidden, logits, match_len, nxt, cnt, targets) - old.nll(hidden, logits, match_len, nxt, cnt, targets)
        assert diff[match_len > 0].abs().min() > 0 and torch.equal(diff[match_len == 0], torch.zeros_like(diff[match_len == 0]))


@pytest.mark.parametrize("joint", [False, True])
def test_gate_stats_forward_gathered_at_the_targets_is_nll(joint):
    import torch
    from tscale.index.mixing import agree_bucket, index_top

    hidden, logits, match_len, nxt, cnt, targets = _gate_case()
    mixer = _stats_mixer(hidden.shape[-1], logits.shape[-1], joint=joint)
    top = index_top(nxt, cnt, logits.shape[-1])
    agree = agree_bucket(torch.log_softmax(logits, -1).gather(-1, top.token.unsqueeze(-1)).squeeze(-1), top.found)
    assert len(top.share_bucket.unique()) == 6 and len(agree.unique()) == 6  # every bucket of both is exercised
    logp = mixer(hidden, logits, match_len, nxt, cnt)  # (B, T, V)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(logp.shape[:-1]), atol=1e-5)
    nll = mixer.nll(hidden, logits, match_len, nxt, cnt, targets)
    assert torch.allclose(nll, -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    half = mixer.nll(hidden, logits.bfloat16(), match_len, nxt, cnt, targets)  # bf16 logits: float32 inside
    full = -mixer(hidden, logits.bfloat16().float(), match_len, nxt, cnt).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(half, full, atol=1e-5)


@pytest.mark.parametrize("joint", [False, True])
def test_gate_stats_train_their_tables_and_give_the_network_no_gradient(joint):
    import torch
    import torch.nn.functional as F
    from tscale.index.mixing import index_target_log_probs, index_top

    hidden, logits, match_len, nxt, cnt, targets = _gate_case()
    v = logits.shape[-1]
    mixer = _stats_mixer(hidden.shape[-1], v, joint=joint)
    logits = logits.requires_grad_(True)
    mixer.nll(hidden, logits, match_len, nxt, cnt, targets).mean().backward()
    for name in ("share_bias", "pair_bias", "agree_bias"):
        grad = getattr(mixer, name).weight.grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # the network's gradient: its own loss's (gate-only) or the mixture's with the agreement held fixed (joint)
    ref = logits.detach().clone().requires_grad_(True)
    own = torch.log_softmax(ref, -1)  # (B, T, V)
    if joint:
        top = index_top(nxt, cnt, v)
        fixed = own.detach().gather(-1, top.token.unsqueeze(-1)).squeeze(-1)  # (B, T), no graph
        log_g, log_keep = mixer._log_gates(hidden, match_len, cnt, top, fixed)
        index = index_target_log_probs(nxt, cnt, targets, v, mixer.delta)
        loss = -torch.logaddexp(own.gather(-1, targets.unsqueeze(-1)).squeeze(-1) + log_keep, index + log_g)
    else:
        loss = F.nll_loss(own.reshape(-1, v), targets.reshape(-1), reduction="none")
    loss.mean().backward()
    assert torch.allclose(logits.grad, ref.grad, atol=1e-7)
    top_logp = torch.randn(match_len.shape).requires_grad_(True)  # (B, T)
    z = mixer.gate_logit(hidden, match_len, cnt, index_top(nxt, cnt, v), top_logp)
    assert torch.autograd.grad(z.sum(), top_logp, allow_unused=True)[0] is None  # it enters as a bucket only
