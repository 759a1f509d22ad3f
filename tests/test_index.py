"""The token index: suffix arrays, streaming lookup, leave-one-out, decontamination, features, CLI errors."""

import json
from pathlib import Path

import numpy as np
import pytest

from helpers_index import write_token_folder

from tscale.data.shards import TokenFolder
from tscale.errors import UserError
from tscale.eval.index_eval import val_features
from tscale.index import Index, build_index
from tscale.index import features as features_module
from tscale.index.distribution import FeatureLookup
from tscale.index.features import StoredFeatures, unpack
from tscale.index.folds import assign_folds
from tscale.index.lookup import MERGE_TOPK, merge_shards
from tscale.ops import index as ops
from tscale.ops.backend import kernels_available

needs_kernels = pytest.mark.skipif(not kernels_available(), reason="tscale._C not built")


def _streams(rng):
    yield rng.integers(0, 50, 400)
    yield rng.integers(0, 2, 300)
    yield np.full(257, 7)
    yield np.tile([3, 1, 4, 1, 5], 61)
    yield np.tile([2, 2, 2, 9], 40)
    yield np.array([5])
    yield rng.integers(0, 65535, 200)


@needs_kernels
def test_suffix_array_matches_sorted_suffixes():
    rng = np.random.default_rng(0)
    for s in _streams(rng):
        for dtype in (np.uint16, np.uint32):
            toks = s.astype(dtype)
            np.testing.assert_array_equal(ops.suffix_array(toks), ops.suffix_array_reference(toks))


def _random_case(rng, trial):
    vocab = int(rng.integers(2, 6))
    text = rng.integers(0, vocab, int(rng.integers(1, 250))).astype(np.uint16)
    text[rng.random(len(text)) < 0.08] = vocab  # eos = vocab
    query = rng.integers(0, vocab + 1, 120)
    if trial % 2 == 0 and len(text) >= 80:
        query[10:90] = text[:80]
    excl = None
    if trial % 3 == 1:  # one range for the whole query, like a document's own lookups
        s = int(rng.integers(0, len(text)))
        excl = np.tile([s, s + int(rng.integers(0, 60))], (len(query), 1))
    elif trial % 3 == 2:  # a different range at every position
        s = rng.integers(0, len(text), len(query))
        excl = np.stack([s, s + rng.integers(0, 60, len(query))], axis=1)
        excl[rng.random(len(query)) < 0.5] = ops.NO_RANGE  # positions without exclusion share the kernel's cache
    return vocab, text, query, excl


@needs_kernels
def test_lookup_matches_brute_force():
    rng = np.random.default_rng(1)
    for trial in range(60):
        vocab, text, query, excl = _random_case(rng, trial)
        sa = ops.suffix_array(text)
        tables = ops.lookup_tables(text, sa, vocab + 1)
        max_len = 64 if trial % 4 == 0 else int(rng.integers(1, 8))
        topk = int(rng.integers(1, 5))
        for eos in (-1, vocab):
            # max_support at or above every range size: exact counts, whatever the path
            support = 1 << 30 if trial % 2 else len(text)
            got = ops.index_lookup(text, sa, tables, query, excl, eos, max_len, topk, support)
            want = ops.index_lookup_reference(text, sa, tables, query, excl, eos, max_len, topk, 0)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


def _repetitive_index(rng, vocab: int, period: int, repeats: int, eos_share: float):
    """A random period of `vocab` ids repeated, with eos = vocab sprinkled in: (text uint16, sa, tables)."""
    text = np.tile(rng.integers(0, vocab, period), repeats).astype(np.uint16)
    text[rng.random(len(text)) < eos_share] = vocab
    sa = ops.suffix_array(text)
    return text, sa, ops.lookup_tables(text, sa, vocab + 1)


@needs_kernels
def test_lookup_does_not_depend_on_chunking():
    rng = np.random.default_rng(2)
    text, sa, tables = _repetitive_index(rng, 40, 3000, 3, 0.001)
    query = np.concatenate([text[:20000], rng.integers(0, 41, 20000)])
    full = ops.index_lookup(text, sa, tables, query, None, 40, 64, 2, 64)
    cut = 16384 - 300  # a later slice puts the kernel's chunk boundaries elsewhere
    part = ops.index_lookup(text, sa, tables, query[cut:], None, 40, 64, 2, 64)
    for f, p in zip(full, part):
        np.testing.assert_array_equal(f[cut + 100:], p[100:])


@needs_kernels
def test_pair_table_matches_reference():
    rng = np.random.default_rng(4)
    for s in _streams(rng):
        for dtype in (np.uint16, np.uint32):
            toks = s.astype(dtype)
            sa = ops.suffix_array(toks)
            vocab = int(toks.max()) + 1
            got = ops.lookup_tables(toks, sa, vocab)
            want = ops.pair_table_reference(toks, sa, vocab)
            for g, w in zip(got[1:], want):
                np.testing.assert_array_equal(g, w)
            assert got.pair_off[-1] == len(got.pair_next) == len(np.unique(toks[:-1].astype(np.int64) * vocab + toks[1:]))


@needs_kernels
def test_inline_tokens_match_reference_for_uint16_ids_only():
    """Each suffix's third token in suffix-array order (past the end: INLINE_END); none for uint32 ids."""
    rng = np.random.default_rng(5)
    for s in _streams(rng):
        toks = s.astype(np.uint16)
        sa = ops.suffix_array(toks)
        got = ops.lookup_tables(toks, sa, int(toks.max()) + 1).inline_tokens
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, ops.inline_tokens_reference(toks, sa))
        if len(toks) >= 2:  # the two shortest suffixes have no third token
            assert (got == ops.INLINE_END).sum() == 2
        wide = s.astype(np.uint32)
        assert len(ops.lookup_tables(wide, ops.suffix_array(wide), int(s.max()) + 1).inline_tokens) == 0


@needs_kernels
def test_lookup_gives_the_same_results_without_the_inline_tokens():
    """The inline tokens only spare reads: every level, count and exclusion comes out the same without them."""
    rng = np.random.default_rng(6)
    text, sa, tables = _repetitive_index(rng, 30, 700, 4, 0.01)
    assert len(tables.inline_tokens) == len(text)
    bare = tables._replace(inline_tokens=np.zeros(0, np.uint16))
    query = np.concatenate([text[500:3500], rng.integers(0, 31, 2000)])
    s = rng.integers(0, len(text), len(query))
    excl = np.stack([s, s + rng.integers(0, 900, len(query))], axis=1)
    for ex in (None, excl):
        for support in (8, 1 << 20):
            got = ops.index_lookup_levels(text, sa, tables, query, ex, 30, [64, 9, 3, 1], 3, support)
            want = ops.index_lookup_levels(text, sa, bare, query, ex, 30, [64, 9, 3, 1], 3, support)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
    assert (got[0][0] >= 3).mean() > 0.5  # long matches: the searches went past offset 2


def _sampled_reference(text, sa, tables, query, max_len, topk, max_support):
    """Next-token counts as documented for ranges above max_support: max_support evenly spaced entries, scaled."""
    lens = ops.index_lookup_reference(text, sa, tables, query, None, -1, max_len, 1, 0)[0]
    text = np.asarray(text, dtype=np.int64)
    nxt = np.full((len(query), topk), -1)
    cnt = np.zeros((len(query), topk), dtype=np.int64)
    for i, length in enumerate(lens):
        if length == 0:
            continue
        pat = query[i - length + 1: i + 1]
        rows = [j for j, p in enumerate(sa) if np.array_equal(text[p:p + length], pat)]  # the SA range
        size = len(rows)
        if size > max_support:
            rows = [rows[(k * size) // max_support] for k in range(max_support)]
        rows = [j for j in rows if sa[j] + length < len(text)]  # entries without a next token do not count
        vals, c = np.unique(text[np.asarray(sa, dtype=np.int64)[rows] + length], return_counts=True)
        order = sorted(range(len(vals)), key=lambda j: (-c[j], vals[j]))[:topk]
        for r, j in enumerate(order):
            nxt[i, r] = vals[j]
            cnt[i, r] = (c[j] * size + max_support // 2) // max_support if size > max_support else c[j]
    return lens, nxt, cnt


@needs_kernels
def test_lookup_samples_large_ranges_as_documented():
    rng = np.random.default_rng(5)
    text = rng.integers(0, 6, 3000).astype(np.uint16)
    sa = ops.suffix_array(text)
    tables = ops.lookup_tables(text, sa, 6)
    query = rng.integers(0, 6, 300)
    for support in (1, 7, 50):
        got = ops.index_lookup(text, sa, tables, query, None, -1, 4, 3, support)
        want = _sampled_reference(text, sa, tables, query, 4, 3, support)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_merge_shards_sums_counts_at_the_longest_length():
    a = (np.array([2, 3]), np.array([[5, 6], [1, -1]]), np.array([[4, 1], [2, 0]]))
    b = (np.array([2, 1]), np.array([[6, 7], [9, -1]]), np.array([[4, 1], [7, 0]]))
    lens, nxt, cnt = merge_shards([a, b], 2)
    np.testing.assert_array_equal(lens, [2, 3])
    np.testing.assert_array_equal(nxt, [[6, 5], [1, -1]])
    np.testing.assert_array_equal(cnt, [[5, 4], [2, 0]])


def _docs(rng, count, vocab=39):
    return [list(rng.integers(0, vocab, int(rng.integers(5, 25)))) for _ in range(count)]


@pytest.fixture
def token_folder(tmp_path):
    rng = np.random.default_rng(3)
    train = _docs(rng, 30)
    val = _docs(rng, 6)
    val[1], val[3] = list(rng.integers(0, 39, 25)), list(rng.integers(0, 39, 25))
    train[4] = train[4][:3] + val[1][2:17] + train[4][3:]  # shares a 15-token span with validation
    train[11] = val[3][:9] + [0] + val[3][9:13]  # shares only short spans
    train[20] = list(train[7])  # an exact duplicate inside train
    return write_token_folder(tmp_path / "tokens", train, val)


def _index_docs(folder: TokenFolder) -> list[np.ndarray]:
    return [np.asarray(s.tokens[a:b]) for s in folder.shards("train") for a, b in zip(s.docs[:, 0].astype(int), s.doc_ends)]


@needs_kernels
def test_sharded_index_lookup_and_leave_one_out(token_folder, tmp_path):
    m = build_index(token_folder, tmp_path / "index", shard_tokens=100, quiet=True)
    assert len(m["shards"]) > 2 and all(s["tokens"] <= 100 for s in m["shards"])
    index = Index(tmp_path / "index", verify=True)
    folder = TokenFolder(token_folder)
    texts = [np.asarray(s.tokens) for s in index.shards]
    assert np.array_equal(np.concatenate(texts), np.concatenate(_index_docs(folder)))  # train only, in order
    val = np.asarray(folder.shards("val")[0].tokens)
    for query, excl in ((val, None), _train_query(index, folder)):
        got = index.lookup(query, excl, max_len=12, topk=3)
        want = [ops.index_lookup_reference(t, None, None, query, _shift(excl, s.offset, len(t)), index.eos_id, 12,
                                               MERGE_TOPK, 0)
                for t, s in zip(texts, index.shards)]
        lens, nxt, cnt = merge_shards(want, 3)
        np.testing.assert_array_equal(got[0], lens)
        np.testing.assert_array_equal(got[1], nxt)
        np.testing.assert_array_equal(got[2], cnt)
    query, excl = _train_query(index, folder)
    lens, _, _ = index.lookup(query, excl, max_len=64, topk=1)
    plain, _, _ = index.lookup(query, None, max_len=64, topk=1)
    pos = np.arange(len(query))
    shard_last = np.array([s.offset + len(s.tokens) - 1 for s in index.shards])
    inner = ~np.isin(pos, shard_last)  # a shard's last token has no next token, so cannot match itself
    assert np.array_equal(plain[inner], (pos - excl[:, 0] + 1)[inner])  # without leave-one-out: itself
    assert (lens < plain).mean() > 0.5  # with it, most positions lose their own document
    s, e = index.doc_ranges()[_doc_key(folder, 20)]  # doc 20 is a copy of doc 7, which still counts
    np.testing.assert_array_equal(lens[s:e - 1], plain[s:e - 1])


@needs_kernels
def test_parallel_build_writes_the_same_shards(token_folder, tmp_path):
    one = build_index(token_folder, tmp_path / "one", shard_tokens=100, quiet=True, workers=1)
    two = build_index(token_folder, tmp_path / "two", shard_tokens=100, quiet=True, workers=3)
    assert two["build"]["workers"] == 3 and one["shards"] == two["shards"]
    for f in sorted((tmp_path / "one").glob("shard-*")):
        assert f.read_bytes() == (tmp_path / "two" / f.name).read_bytes()
    assert build_index(token_folder, tmp_path / "small", max_memory_gb=1e-6, quiet=True, workers=2)["shards"]


def _doc_key(folder, flat_doc):
    sizes = [len(s.docs) for s in folder.shards("train")]
    k = 0
    while flat_doc >= sizes[k]:
        flat_doc -= sizes[k]
        k += 1
    return k, flat_doc


def _train_query(index, folder):
    """The index's own tokens as a query, each position excluding its own document."""
    query = np.concatenate([np.asarray(s.tokens) for s in index.shards]).astype(np.int64)
    excl = np.zeros((len(query), 2), dtype=np.int64)
    for s, e in index.doc_ranges().values():
        excl[s:e] = (s, e)
    return query, excl


def _shift(excl, offset, n):
    if excl is None:
        return None
    loc = np.clip(excl - offset, 0, n)
    loc[loc[:, 0] >= loc[:, 1]] = -1
    return loc


@needs_kernels
def test_decontamination_drops_exactly_the_overlapping_docs(token_folder, tmp_path):
    folder = TokenFolder(token_folder)
    n = 13
    val_grams = set()
    for s in folder.shards("val"):
        for g in ops.doc_ngrams_reference(s.tokens, s.docs[:, 0].astype(np.int64), n):
            val_grams |= g
    want = np.concatenate([ops.docs_with_ngrams_reference(s.tokens, s.docs[:, 0].astype(np.int64), n, val_grams)
                           for s in folder.shards("train")])
    assert want.sum() == 1
    m = build_index(token_folder, tmp_path / "index", decontaminate=n, quiet=True)
    assert m["decontamination"]["dropped_docs"] == 1
    index = Index(tmp_path / "index")
    kept = [d for d, w in zip(_index_docs(folder), want) if not w]
    assert np.array_equal(np.concatenate([np.asarray(s.tokens) for s in index.shards]), np.concatenate(kept))
    assert build_index(token_folder, tmp_path / "i2", decontaminate=4, quiet=True)["decontamination"]["dropped_docs"] >= 2


@needs_kernels
def test_decontamination_against_another_folders_validation(token_folder, tmp_path):
    folder = TokenFolder(token_folder)
    train = _index_docs(folder)
    rng = np.random.default_rng(8)
    other_val = [list(train[9][1:12]) + list(rng.integers(0, 39, 6)), list(rng.integers(0, 39, 20))]
    other = write_token_folder(tmp_path / "other", [[1, 2, 3]], other_val)
    n = 10
    grams = set()
    for s in TokenFolder(other).shards("val"):
        grams |= set().union(*ops.doc_ngrams_reference(s.tokens, s.docs[:, 0].astype(np.int64), n))
    want = np.concatenate([ops.docs_with_ngrams_reference(s.tokens, s.docs[:, 0].astype(np.int64), n, grams)
                           for s in folder.shards("train")])
    assert want[9] and not want[4]  # train[4] shares 15 tokens with the folder's own validation, not the other's
    m = build_index(token_folder, tmp_path / "index", decontaminate=n, decontaminate_against=other, quiet=True)
    assert m["decontamination"]["dropped_docs"] == want.sum()
    assert m["decontamination"]["against"]["path"] == str(other.resolve())
    kept = np.concatenate([d for d, w in zip(train, want) if not w])
    assert np.array_equal(np.concatenate([np.asarray(s.tokens) for s in Index(tmp_path / "index").shards]), kept)
    for tokens, checked in ((other, True), (token_folder, False)):  # what an evaluation on each folder reports
        info = val_features(tmp_path / "index", TokenFolder(tokens), 2, None)[1]
        assert info["decontaminated_against_this_split"] is checked
    with pytest.raises(UserError, match="only with --decontaminate"):
        build_index(token_folder, tmp_path / "i2", decontaminate_against=other, quiet=True)
    foreign = write_token_folder(tmp_path / "foreign", [[1, 2, 3]], [[4, 5, 6]], tokenizer_text='{"other": 1}')
    with pytest.raises(UserError, match="tokenizer"):
        build_index(token_folder, tmp_path / "i3", decontaminate=n, decontaminate_against=foreign, quiet=True)


@needs_kernels
def test_features_match_lookups(token_folder, tmp_path):
    build_index(token_folder, tmp_path / "index", features=True, quiet=True, features_topk=3)
    index = Index(tmp_path / "index", verify=True)
    folder = TokenFolder(token_folder)
    rec = index.manifest["features"]
    assert (rec["version"], rec["max_len"], rec["topk"], rec["record_bytes"]) == (2, 64, 3, 1 + 3 * 2 + 3 * 4)
    stored = StoredFeatures(index.path, folder, topk=3)
    query, excl = _train_query(index, folder)
    lens, nxt, cnt = index.lookup(query, excl, max_len=64, topk=3)
    train = np.concatenate(stored.shards("train"))
    np.testing.assert_array_equal(train["len"], lens)
    np.testing.assert_array_equal(train["next"], np.where(nxt >= 0, nxt, index.vocab_size))
    np.testing.assert_array_equal(train["count"], cnt)
    assert (cnt[:, 0] > 0).any() and (cnt[lens == 0] == 0).all()
    got = unpack(train, 2, index.vocab_size)
    np.testing.assert_array_equal(got[1], nxt[:, :2])
    np.testing.assert_array_equal(got[2], cnt[:, :2])
    val = stored.shards("val")[0]
    want = index.lookup(folder.shards("val")[0].tokens, max_len=64, topk=3)
    assert np.array_equal(val["len"], want[0]) and np.array_equal(val["count"], want[2])
    with pytest.raises(UserError, match="--features-topk 4"):
        StoredFeatures(index.path, folder, topk=4)



@needs_kernels
def test_capped_features_are_the_lookups_at_that_cap(token_folder, tmp_path):
    """--features-max-len L: every stored match is the lookup's at max_len L (train leave-one-out and val); a model
    reads them only with index.max_len = L, and an evaluation at another cap looks up again."""
    cap = 6
    m = build_index(token_folder, tmp_path / "index", features=True, features_topk=3, features_max_len=cap, quiet=True)
    assert m["features"]["max_len"] == cap
    index, folder = Index(tmp_path / "index"), TokenFolder(token_folder)
    stored = StoredFeatures(index.path, folder, topk=3, max_len=cap)
    query, excl = _train_query(index, folder)
    lens, nxt, cnt = index.lookup(query, excl, max_len=cap, topk=3)
    train = np.concatenate(stored.shards("train"))
    np.testing.assert_array_equal(train["len"], lens)
    np.testing.assert_array_equal(train["next"], np.where(nxt >= 0, nxt, index.vocab_size))
    np.testing.assert_array_equal(train["count"], cnt)
    assert lens.max() == cap < index.lookup(query, excl, max_len=64, topk=3)[0].max()  # the cap bites here
    val = folder.shards("val")[0]
    np.testing.assert_array_equal(stored.shards("val")[0], features_module.fresh_features(index, val, FeatureLookup(3, cap), None))
    with pytest.raises(UserError, match="index.max_len 64: .* capped at 6 tokens; set index.max_len = 6"):
        StoredFeatures(index.path, folder, topk=3)
    assert val_features(index.path, folder, 3, None, cap)[1]["lookups"] == "stored features"
    assert val_features(index.path, folder, 3, None, 64)[1]["lookups"] == "looked up now"
    for fold_cap in (2, 64):  # fold features: their (shorter) matches are capped too
        build_index(token_folder, tmp_path / f"folds{fold_cap}", features=True, features_topk=3, features_folds=2,
                    features_max_len=fold_cap, quiet=True)
    fold_len = {c: np.concatenate(StoredFeatures(tmp_path / f"folds{c}", folder, 3, c).shards("train"))["len"]
                for c in (2, 64)}
    assert fold_len[2].max() == 2 < fold_len[64].max()
    np.testing.assert_array_equal(fold_len[2], np.minimum(fold_len[64], 2))
    with pytest.raises(UserError, match="only with --features"):
        build_index(token_folder, tmp_path / "x", features_max_len=8, quiet=True)
    with pytest.raises(UserError, match="--features-max-len 0"):
        build_index(token_folder, tmp_path / "y", features=True, features_max_len=0, quiet=True)


@needs_kernels
def test_generation_lookups_take_the_models_cap(token_folder, tmp_path):
    import torch

    from tscale.infer.engine import IndexLookups

    build_index(token_folder, tmp_path / "index", quiet=True)
    index = Index(tmp_path / "index")
    ids = [int(t) for t in _index_docs(TokenFolder(token_folder))[7][:30]]  # a document with a copy in the index
    for cap in (4, 64):
        got = IndexLookups(index, FeatureLookup(2, cap), torch.device("cpu")).last(ids, 10)
        want = index.lookup(np.asarray(ids), max_len=cap, topk=2)
        np.testing.assert_array_equal(got.match_len[0].numpy(), want[0][-10:])
    assert IndexLookups(index, FeatureLookup(2, 4), torch.device("cpu")).last(ids, 10).match_len.max() == 4


def test_evaluation_cap_is_the_models_own():
    from types import SimpleNamespace

    from tscale.config import IndexConfig
    from tscale.eval.index_eval import lookup_max_len

    plain = SimpleNamespace(path="run/ckpt", index_cfg=None)
    assert (lookup_max_len(plain, None), lookup_max_len(plain, 16)) == (64, 16)
    trained = SimpleNamespace(path="run/ckpt", index_cfg=IndexConfig(path="idx", mixer=True, max_len=16))
    assert lookup_max_len(trained, None) == lookup_max_len(trained, 16) == 16
    with pytest.raises(UserError, match="--index-max-len 32: run/ckpt was trained with index.max_len = 16"):
        lookup_max_len(trained, 32)


@needs_kernels
def test_fold_features_are_lookups_in_an_index_decontaminated_against_the_fold(token_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(features_module, "BATCH_TOKENS", 40)  # many lookup batches of whole documents per fold
    span, topk = 8, 3
    m = build_index(token_folder, tmp_path / "index", features=True, features_folds=2, features_span=span,
                    features_topk=topk, quiet=True)
    folder = TokenFolder(token_folder)
    index = Index(tmp_path / "index", verify=True)
    assert not list((tmp_path / "index").glob(".fold-*"))  # the fold indexes are scratch
    record = m["features"]["train_lookups"]
    assert (record["folds"], record["span"]) == (2, span)
    docs = _index_docs(folder)  # every train document (none dropped from the main index here)
    fold = np.concatenate(assign_folds(folder, 2))
    grams = [ops.doc_ngrams_reference(d, np.array([0]), span)[0] for d in docs]
    stored = np.concatenate(StoredFeatures(index.path, folder, topk=topk).shards("train"))
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])[:-1]])
    eos = index.eos_id
    for k in (0, 1):
        mine = np.flatnonzero(fold == k)
        fold_grams = set().union(*(grams[i] for i in mine))
        kept = [i for i in range(len(docs)) if fold[i] != k and not (grams[i] & fold_grams)]
        assert record["per_fold"][k]["index_tokens"] == sum(len(docs[i]) for i in kept)
        text = np.concatenate([docs[i] for i in kept]).astype(np.int64)
        query = np.concatenate([docs[i] for i in mine]).astype(np.int64)
        lens, nxt, cnt = merge_shards([ops.index_lookup_reference(text, None, None, query, None, eos, 64, MERGE_TOPK, 0)],
                                      topk)
        pos = np.concatenate([np.arange(starts[i], starts[i] + len(docs[i])) for i in mine])
        np.testing.assert_array_equal(stored["len"][pos], lens)
        np.testing.assert_array_equal(stored["next"][pos], np.where(nxt >= 0, nxt, index.vocab_size))
        np.testing.assert_array_equal(stored["count"][pos], cnt)
    inner = np.ones(len(stored), bool)
    inner[starts + np.array([len(d) for d in docs]) - 1] = False  # a document's eos may end a longer match
    assert stored["len"][inner].max() < span  # no fold index shares a span with the documents looked up in it
    build_index(token_folder, tmp_path / "loo", features=True, features_topk=topk, quiet=True)
    plain = np.concatenate(StoredFeatures(tmp_path / "loo", folder, topk=topk).shards("train"))
    assert plain["len"][inner].max() >= span  # leave-one-out still finds train[20], the copy of train[7]
    val = StoredFeatures(index.path, folder, topk=topk).shards("val")[0]
    want = index.lookup(folder.shards("val")[0].tokens, max_len=64, topk=topk)
    assert np.array_equal(val["len"], want[0]) and np.array_equal(val["count"], want[2])
    with pytest.raises(UserError, match="only with --features"):
        build_index(token_folder, tmp_path / "x", features_folds=2, quiet=True)
    with pytest.raises(UserError, match="--features-folds 1"):
        build_index(token_folder, tmp_path / "y", features=True, features_folds=1, quiet=True)

@needs_kernels
def test_real_text_index(shakespeare_jsonl, gpt2_bpe, tmp_path, run_cli):
    tokens = tmp_path / "tokens"
    assert run_cli("tokenize", shakespeare_jsonl, "--tokenizer", gpt2_bpe, "-o", tokens, "-q", "--val-modulus", "5")[0] == 0
    code, out = run_cli("build-index", tokens, "-o", tmp_path / "index", "-q")
    assert code == 0, out
    m = json.loads((tmp_path / "index" / "manifest.json").read_text())
    folder = TokenFolder(tokens)
    assert m["num_tokens"] == folder.num_tokens("train") and 6.0 <= m["bytes_per_token"] < 6.1
    index = Index(tmp_path / "index")
    val = np.asarray(folder.shards("val")[0].tokens[:3000])
    lens, nxt, cnt = index.lookup(val, max_len=16, topk=4)
    assert lens.mean() > 2 and (cnt[:, 0] >= cnt[:, 1]).all()


def test_cli_errors(token_folder, tmp_path, run_cli):
    out = tmp_path / "index"
    out.mkdir()
    code, msg = run_cli("build-index", token_folder, "-o", out)
    assert code == 2 and "already exists" in msg and len(msg.strip().splitlines()) == 1
    (token_folder / "val-00000.bin").unlink()
    code, msg = run_cli("build-index", token_folder, "-o", tmp_path / "i2")
    assert code == 2 and "val-00000.bin" in msg and len(msg.strip().splitlines()) == 1
    code, msg = run_cli("build-index", tmp_path / "nowhere", "-o", tmp_path / "i3")
    assert code == 2 and "nowhere" in msg


@needs_kernels
def test_index_refuses_tokens_of_another_tokenizer(token_folder, tmp_path):
    build_index(token_folder, tmp_path / "index", quiet=True)
    other = write_token_folder(tmp_path / "other", [[1, 2, 3]], [[4, 5]], tokenizer_text='{"other": 1}')
    with pytest.raises(UserError, match="tokenizer sha256"):
        Index(tmp_path / "index").check_tokens(TokenFolder(other))
    (tmp_path / "index" / "shard-00000.sa").unlink()
    with pytest.raises(UserError, match="shard-00000.sa"):
        Index(tmp_path / "index")

