"""Index lookups at several match caps in one pass (index_lookup_levels) against one lookup per cap."""

import numpy as np
import pytest

from helpers_index import write_token_folder
from test_index import _random_case, _repetitive_index, needs_kernels
from tscale.data.shards import TokenFolder
from tscale.index import Index, build_index
from tscale.index.features import doc_batches
from tscale.ops import index as ops


@needs_kernels
def test_levels_match_the_brute_force_at_each_cap():
    rng = np.random.default_rng(11)
    for trial in range(40):
        vocab, text, query, excl = _random_case(rng, trial)
        sa = ops.suffix_array(text)
        tables = ops.lookup_tables(text, sa, vocab + 1)
        caps = sorted({int(c) for c in rng.integers(1, 12, int(rng.integers(1, 5)))} | {64 if trial % 4 == 0 else 12},
                      reverse=True)
        topk = int(rng.integers(1, 5))
        for eos in (-1, vocab):
            got = ops.index_lookup_levels(text, sa, tables, query, excl, eos, caps, topk, 1 << 30)
            want = ops.index_lookup_levels_reference(text, sa, tables, query, excl, eos, caps, topk, 0)
            assert got[0].shape == (len(caps), len(query)) and got[1].shape == (len(caps), len(query), topk)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


@needs_kernels
def test_levels_equal_one_lookup_per_cap_on_long_repetitive_text():
    """Ranges above max_support are sampled, and the positions without exclusion share the counting cache."""
    rng = np.random.default_rng(12)
    text, sa, tables = _repetitive_index(rng, 30, 2000, 4, 0.002)
    query = np.concatenate([text[500:20500], rng.integers(0, 31, 15000)])
    starts = rng.integers(0, len(text), len(query))
    excl = np.stack([starts, starts + rng.integers(1, 300, len(query))], axis=1)
    excl[rng.random(len(query)) < 0.6] = ops.NO_RANGE
    caps = (64, 32, 16, 8, 4, 2, 1)
    for ex in (None, excl):
        got = ops.index_lookup_levels(text, sa, tables, query, ex, 30, caps, 6, 64)
        for c, cap in enumerate(caps):
            want = ops.index_lookup(text, sa, tables, query, ex, 30, cap, 6, 64)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g[c], w)
        assert (got[0][0] > 8).mean() > 0.3  # long matches: the short caps search on their own


@needs_kernels
def test_sharded_index_levels_equal_lookups_at_each_cap(tmp_path):
    rng = np.random.default_rng(13)
    motif = list(rng.integers(0, 39, 20))
    train = [motif[: int(rng.integers(5, 20))] + list(rng.integers(0, 39, int(rng.integers(3, 15)))) for _ in range(30)]
    folder = TokenFolder(write_token_folder(tmp_path / "tokens", train, [motif + motif[:7]]))
    build_index(folder.path, tmp_path / "index", shard_tokens=90, quiet=True)
    index = Index(tmp_path / "index")
    assert len(index.shards) > 2
    s, e, excl = next(doc_batches(folder.shards("train")[0], 0, index.doc_ranges()))
    val = np.asarray(folder.shards("val")[0].tokens)
    for query, ex in ((val, None), (np.asarray(folder.shards("train")[0].tokens[s:e]), excl)):
        caps = (16, 8, 4, 2, 1)
        got = index.lookup_levels(query, ex, caps, topk=3)
        for c, cap in enumerate(caps):
            for g, w in zip(got, index.lookup(query, ex, max_len=cap, topk=3)):
                np.testing.assert_array_equal(g[c], w)


@pytest.mark.parametrize("caps", [(), (4, 4), (2, 8), (3, 0)])
def test_levels_refuse_caps_that_are_not_strictly_descending(caps):
    text = np.array([1, 2, 3, 1, 2], np.uint16)
    with pytest.raises(ValueError, match="strictly descending"):
        ops.index_lookup_levels(text, None, None, np.array([1, 2]), None, -1, caps, 2, 64)
