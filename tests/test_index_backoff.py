"""The backoff distribution: kernel vs reference, Witten-Bell by brute force, its features and its log-probs."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_index import write_token_folder

from tscale.data.shards import TokenFolder
from tscale.errors import UserError
from tscale.index import Index, build_index
from tscale.index import distribution as dist_module
from tscale.index.distribution import LEVEL_TOPK, WEIGHT_SCALE, FeatureLookup, backoff_caps
from tscale.index.features import StoredFeatures, unpack
from tscale.index.mixing import IndexMixer, index_log_probs, index_target_log_probs
from tscale.ops import index as ops
from tscale.ops.backend import kernels_available

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
import index_mix_oracle as oracle  # noqa: E402  (its p_backoff: the recursion, checked by hand in its own tests)

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="tscale._C not built")


def _random_levels(rng, levels: int, n: int, k: int, vocab: int):
    """Lookups as index_lookup gives them: distinct tokens per level, most frequent first, -1 / 0 padding."""
    lens = np.zeros((levels, n), np.int32)
    nxt = np.full((levels, n, k), -1, np.int64)
    cnt = np.zeros((levels, n, k), np.int64)
    for i in range(n):
        longest = int(rng.integers(0, 12))
        for c in range(levels):
            lens[c, i] = min(longest, 2 ** (levels - 1 - c))  # caps 2^(C-1) .. 1, longest first
            listed = int(rng.integers(0, k + 1)) if lens[c, i] else 0
            nxt[c, i, :listed] = rng.choice(vocab, listed, replace=False)
            cnt[c, i, :listed] = np.sort(rng.integers(1, 400, listed))[::-1]
    return lens, nxt, cnt


@needs_kernels
@pytest.mark.parametrize("topk", [1, 3, 40])
def test_backoff_kernel_is_its_reference(topk):
    rng = np.random.default_rng(topk)
    lens, nxt, cnt = _random_levels(rng, 4, 500, 6, 23)
    cnt[1, ::7] = cnt[0, ::7]  # some levels repeat a longer one's counts (same context, capped)
    got = ops.index_backoff(lens, nxt, cnt, 23, topk, WEIGHT_SCALE)
    want = ops.index_backoff_reference(lens, nxt, cnt, 23, topk, WEIGHT_SCALE)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    listed = (got[0] >= 0).sum(1)
    assert (listed > 0).mean() > 0.5 and (listed == min(topk, 7)).any()  # lists more than one level's (6) tokens


@pytest.fixture
def repetitive_folder(tmp_path):
    rng = np.random.default_rng(5)
    motifs = [list(rng.integers(0, 12, 6)) for _ in range(4)]
    docs = [sum((motifs[int(j)] for j in rng.integers(0, 4, 5)), []) + list(rng.integers(0, 39, 4)) for _ in range(30)]
    val = [sum((motifs[int(j)] for j in rng.integers(0, 4, 3)), []) for _ in range(4)]
    return write_token_folder(tmp_path / "tokens", docs, val)


@needs_kernels
def test_backoff_features_are_witten_bell_over_the_capped_lookups(repetitive_folder, tmp_path, monkeypatch):
    """Every listed probability is the recursion's over the brute-force lookups at each cap, the rest is what the
    others hold, and cutting the positions into chunks (each warmed up) changes nothing."""
    build_index(repetitive_folder, tmp_path / "index", quiet=True)
    index = Index(tmp_path / "index")
    folder = TokenFolder(repetitive_folder)
    query = np.asarray(folder.shards("val")[0].tokens, dtype=np.int64)
    vocab = index.vocab_size
    lookup = FeatureLookup(topk=vocab, max_len=9, distribution="backoff", max_support=1 << 20)  # exact counts
    lens, nxt, weight = lookup(index, query)
    caps = backoff_caps(9)
    assert caps == (9, 8, 4, 2, 1)
    assert len(index.shards) == 1
    levels = [ops.index_lookup_reference(index.shards[0].tokens, None, None, query, None, folder.eos_id, cap, LEVEL_TOPK, 0)
              for cap in caps]
    every = [np.full(len(query), y) for y in range(vocab)]  # the probe's Witten-Bell recursion, token by token
    want = np.stack([oracle.p_backoff(levels, y, vocab) for y in every], axis=1)  # (N, V)
    np.testing.assert_array_equal(lens, levels[0][0])
    for i in range(len(query)):
        listed = nxt[i] >= 0
        assert listed.sum() > 0
        np.testing.assert_allclose(weight[i][listed] / WEIGHT_SCALE, want[i, nxt[i][listed]], rtol=1e-6, atol=2e-9)
        assert 1 - weight[i][listed].sum() / WEIGHT_SCALE == pytest.approx(1 - want[i, nxt[i][listed]].sum(), abs=1e-6)
    assert (lens >= 4).mean() > 0.3  # the motifs give long matches, so several levels differ
    monkeypatch.setattr(dist_module, "CHUNK", 7)
    chunked = lookup(index, query)
    for a, b in zip(chunked, (lens, nxt, weight)):
        np.testing.assert_array_equal(a, b)


@needs_kernels
def test_backoff_top_tokens_come_from_every_level(repetitive_folder, tmp_path):
    """Top 4 of the backoff where the longest match lists fewer: shorter contexts fill the other slots."""
    build_index(repetitive_folder, tmp_path / "index", quiet=True)
    index = Index(tmp_path / "index")
    query = np.asarray(TokenFolder(repetitive_folder).shards("val")[0].tokens, dtype=np.int64)
    counts = FeatureLookup(4, 64)(index, query)
    lens, nxt, weight = FeatureLookup(4, 64, "backoff")(index, query)
    np.testing.assert_array_equal(lens, counts[0])
    fewer = (counts[1] >= 0).sum(1) < 4
    assert fewer.any() and ((nxt[fewer] >= 0).sum(1) > (counts[1][fewer] >= 0).sum(1)).any()
    assert (np.diff(weight, axis=1) <= 0).all()  # most probable first
    assert (weight.sum(1) < WEIGHT_SCALE).all()  # some mass always left for the unlisted tokens


def test_backoff_log_probs_are_normalised_and_the_targets_are_their_gather():
    rng = np.random.default_rng(1)
    vocab, k = 50, 4
    _, nxt, _ = _random_levels(rng, 1, 24, k, vocab)
    w = np.zeros((24, k), np.int64)
    for i in range(24):
        listed = int((nxt[0, i] >= 0).sum())
        probs = rng.dirichlet(np.ones(listed + 1))[:listed] if listed else np.zeros(0)
        w[i, :listed] = np.floor(np.sort(probs)[::-1] * WEIGHT_SCALE)
    nxt_t, w_t = torch.from_numpy(nxt[0]).view(4, 6, k), torch.from_numpy(w).view(4, 6, k)
    logp = index_log_probs(nxt_t, w_t, vocab, 1e-5, "backoff")  # (4, 6, V)
    assert torch.allclose(logp.double().exp().sum(-1), torch.ones(4, 6, dtype=torch.float64), atol=1e-5)
    targets = torch.randint(0, vocab, (4, 6))
    targets[0, 0] = nxt_t[0, 0, 0] if nxt_t[0, 0, 0] >= 0 else targets[0, 0]
    want = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(index_target_log_probs(nxt_t, w_t, targets, vocab, 1e-5, "backoff"), want, atol=1e-6)
    counts_form = index_log_probs(nxt_t, w_t, vocab, 1e-5)  # read as counts instead: other numbers
    assert not torch.allclose(counts_form, logp, atol=1e-3)
    mixer = IndexMixer(8, vocab, distribution="backoff")
    hidden, logits = torch.randn(4, 6, 8), torch.randn(4, 6, vocab)
    match_len = torch.from_numpy((nxt[0] >= 0).any(1).astype(np.int64) * 5).view(4, 6)
    mixed = mixer(hidden, logits, match_len, nxt_t, w_t)
    assert torch.allclose(mixed.double().exp().sum(-1), torch.ones(4, 6, dtype=torch.float64), atol=1e-5)
    nll = mixer.nll(hidden, logits, match_len, nxt_t, w_t, targets)
    assert torch.allclose(nll, -mixed.gather(-1, targets.unsqueeze(-1)).squeeze(-1), atol=1e-5)


@needs_kernels
def test_backoff_features_on_disk_and_their_errors(repetitive_folder, tmp_path):
    m = build_index(repetitive_folder, tmp_path / "index", features=True, features_distribution="backoff",
                    features_topk=5, quiet=True)
    f = m["features"]
    assert f["distribution"] == "backoff" and f["backoff_caps"] == [64, 32, 16, 8, 4, 2, 1]
    assert f["weight_scale"] == WEIGHT_SCALE and f["level_topk"] == LEVEL_TOPK
    index, folder = Index(tmp_path / "index"), TokenFolder(repetitive_folder)
    stored = StoredFeatures(index.path, folder, 5, distribution="backoff")
    val = np.concatenate(stored.shards("val"))
    lens, nxt, weight = unpack(val, 5, index.vocab_size)
    query = np.concatenate([s.tokens for s in folder.shards("val")]).astype(np.int64)  # contexts restart at eos
    want = FeatureLookup(5, 64, "backoff")(index, query)
    np.testing.assert_array_equal(lens, want[0])
    np.testing.assert_array_equal(nxt, want[1])
    np.testing.assert_array_equal(weight, want[2])
    train = np.concatenate(stored.shards("train"))
    assert (train["count"][:, 0] > 0).mean() > 0.5  # leave-one-out lookups, mostly matched
    with pytest.raises(UserError, match="index.distribution 'counts': .* hold the 'backoff' distribution"):
        StoredFeatures(index.path, folder, 5)
    build_index(repetitive_folder, tmp_path / "plain", features=True, quiet=True)
    with pytest.raises(UserError, match="index.distribution 'backoff': .* rebuild with --features-distribution backoff"):
        StoredFeatures(tmp_path / "plain", folder, 4, distribution="backoff")
    with pytest.raises(UserError, match="--features-distribution backoff: only with --features"):
        build_index(repetitive_folder, tmp_path / "x", features_distribution="backoff", quiet=True)
    with pytest.raises(UserError, match="--features-distribution kneser: must be one of counts, backoff"):
        build_index(repetitive_folder, tmp_path / "y", features=True, features_distribution="kneser", quiet=True)


def test_backoff_log_probs_stay_finite_at_the_edges():
    """All the mass on the listed tokens (the rest floored at one unit), and no match at all (uniform)."""
    vocab = 10
    nxt = torch.tensor([[[3, 5], [-1, -1]]])  # (1, 2, 2): a position listing two tokens, one listing none
    w = torch.tensor([[[WEIGHT_SCALE - 5, 5], [0, 0]]])
    logp = index_log_probs(nxt, w, vocab, 1e-5, "backoff")  # (1, 2, V)
    assert torch.isfinite(logp).all()
    assert logp[0, 0, 3].exp().item() == pytest.approx(1 - 5 / WEIGHT_SCALE, abs=1e-7)
    assert logp[0, 0, 0].exp().item() == pytest.approx(1 / WEIGHT_SCALE / (vocab - 2), rel=1e-3)  # the one unit left
    assert torch.allclose(logp[0, 1].exp(), torch.full((vocab,), 1 / vocab))


@needs_kernels
def test_fold_features_hold_the_backoff_distribution(repetitive_folder, tmp_path):
    """--features-folds with the backoff: the training records are distributions (weights below 2^30 in all, most
    probable first) looked up in the other fold's index, and the record says which distribution."""
    m = build_index(repetitive_folder, tmp_path / "index", features=True, features_folds=2, features_span=40,
                    features_distribution="backoff", quiet=True)  # no document is 40 tokens long: folds keep the rest
    assert m["features"]["distribution"] == "backoff" and m["features"]["train_lookups"]["folds"] == 2
    assert all(f["index_tokens"] > 0 for f in m["features"]["train_lookups"]["per_fold"])
    folder = TokenFolder(repetitive_folder)
    train = np.concatenate(StoredFeatures(tmp_path / "index", folder, 4, distribution="backoff").shards("train"))
    matched = train["len"] > 0
    assert matched.mean() > 0.5
    assert (train["count"][matched].astype(np.int64).sum(1) < WEIGHT_SCALE).all()
    assert (np.diff(train["count"][matched].astype(np.int64), axis=1) <= 0).all()
    assert (train["count"][matched, 0] >= WEIGHT_SCALE // 40).all()  # the top probability is at least 1 / V: not a count
    assert (train["count"][~matched] == 0).all()
