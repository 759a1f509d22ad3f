"""Token-index ops (suffix array, streaming longest-match lookup, n-gram overlap): numpy references and the dispatch to tscale._C.

suffix_array(tokens (n,) uint16|uint32) -> (n,) uint32: suffix starts in lexicographic order
lookup_tables(text, sa, vocab_size) -> LookupTables: first-token and token-pair ranges of the suffix array, and
    each suffix's third token in suffix-array order (see csrc/index/inline_tokens.cpp)
index_lookup(text, sa, tables, query, excl, eos, max_len, topk, max_support)
    -> len (N,) int32, next (N, topk) int64, count (N, topk) int64; see csrc/index/lookup.cpp
index_lookup_levels(text, sa, tables, query, excl, eos, caps, topk, max_support)
    -> len (C, N), next (C, N, topk), count (C, N, topk): index_lookup at each cap of `caps` in one pass
    (index_lookup is its one-cap case)
index_backoff(lens (C, N), next (C, N, k), count (C, N, k), vocab, topk, scale)
    -> next (N, topk) int64, weight (N, topk) int64: Witten-Bell over C capped lookups; see csrc/index/backoff.cpp
ngram_hashes(tokens, starts, n) -> int64 hashes of the n-grams inside each document
docs_with_ngrams(tokens, starts, n, sorted_hashes) -> bool (D,)

The references are brute force (quadratic or worse): they define the results and are what the
tests compare the kernels against, on small inputs. Arrays are numpy on both sides.
"""

from typing import NamedTuple

import numpy as np
import torch

from tscale.ops.backend import kernels_available

NO_RANGE = -1
INLINE_END = 0xFFFF  # index_inline_tokens' mark for a position past the shard's end (never a token id)


def _signed_view(tokens: np.ndarray) -> torch.Tensor:
    """A zero-copy int16/int32 tensor over uint16/uint32 token ids (the kernels read them unsigned)."""
    tokens = np.ascontiguousarray(tokens)
    if tokens.dtype.itemsize == 2:
        return torch.from_numpy(tokens.view(np.int16))
    return torch.from_numpy(tokens.astype(np.uint32, copy=False).view(np.int32))


# ---- suffix array -------------------------------------------------------------------------

def suffix_array_reference(tokens: np.ndarray) -> np.ndarray:
    toks = [int(t) for t in tokens]
    return np.array(sorted(range(len(toks)), key=lambda i: toks[i:]), dtype=np.uint32)


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    if not kernels_available():
        return suffix_array_reference(tokens)
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.uint32)
    return torch.ops.tscale.suffix_array(_signed_view(tokens)).numpy().view(np.uint32)


# ---- lookup -------------------------------------------------------------------------------

def first_table(text: np.ndarray, vocab_size: int) -> np.ndarray:
    """(V + 1,) int64: suffixes starting with token a occupy sa[first[a] : first[a + 1]]."""
    counts = np.bincount(np.asarray(text), minlength=vocab_size)[:vocab_size]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class LookupTables(NamedTuple):
    """Where the suffix array's blocks start: by first token, and by first two tokens (see index_pairs)."""

    first: np.ndarray  # (V + 1,) int64
    pair_off: np.ndarray  # (V + 1,) int64: pairs (a, *) are rows pair_off[a] : pair_off[a + 1]
    pair_next: np.ndarray  # (B,) int32: their second tokens, ascending within a
    pair_start: np.ndarray  # (B,) uint32: where each pair's block starts in the suffix array
    inline_tokens: np.ndarray  # (n,) uint16, or (0,): each suffix's token at offset 2 (index_inline_tokens)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self)


def pair_table_reference(text: np.ndarray, sa: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pair_off, pair_next, pair_start) by reading every suffix's first two tokens in suffix-array order."""
    text = np.asarray(text, dtype=np.int64)
    sa = np.asarray(sa, dtype=np.int64)
    rows = np.flatnonzero(sa + 1 < len(text))  # the last suffix has no second token
    a, b = text[sa[rows]], text[sa[rows] + 1]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    off = np.concatenate([[0], np.cumsum(np.bincount(a[new], minlength=vocab_size)[:vocab_size])]).astype(np.int64)
    return off, b[new].astype(np.int32), rows[new].astype(np.uint32)


def inline_tokens_reference(text: np.ndarray, sa: np.ndarray) -> np.ndarray:
    """(n,) uint16: text[sa[j] + 2], INLINE_END where that is past the end."""
    padded = np.append(np.asarray(text, dtype=np.int64), [INLINE_END, INLINE_END])
    return padded[np.asarray(sa, dtype=np.int64) + 2].astype(np.uint16)


def lookup_tables(text: np.ndarray, sa: np.ndarray, vocab_size: int) -> LookupTables:
    """The tables index_lookup searches with; the inline tokens only for uint16 ids below INLINE_END (else empty)."""
    first = first_table(text, vocab_size)
    no_inline = np.zeros(0, np.uint16)
    if not kernels_available():
        return LookupTables(first, *pair_table_reference(text, sa, vocab_size), no_inline)
    if len(text) == 0:
        return LookupTables(first, np.zeros(vocab_size + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.uint32),
                            no_inline)
    off, nxt, start = torch.ops.tscale.index_pairs(_signed_view(text), _sa_view(sa), torch.from_numpy(first))
    inline = no_inline
    if np.asarray(text).dtype == np.uint16 and vocab_size <= INLINE_END:
        inline = torch.ops.tscale.index_inline_tokens(_signed_view(text), _sa_view(sa)).numpy().view(np.uint16)
    return LookupTables(first, off.numpy(), nxt.numpy(), start.numpy().view(np.uint32), inline)


def _sa_view(sa: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(sa).view(np.int32))


def _context_starts(query: np.ndarray, eos: int) -> np.ndarray:
    """Per position, the first position its context may reach back to (just after the last eos before it)."""
    n = len(query)
    start = np.zeros(n, dtype=np.int64)
    if eos >= 0 and n > 1:
        after = np.flatnonzero(query[:-1] == eos) + 1  # positions right after an eos
        marks = np.zeros(n, dtype=np.int64)
        marks[after] = after
        start = np.maximum.accumulate(marks)
    return start


def _top(tokens: np.ndarray, topk: int) -> tuple[list[int], list[int]]:
    vals, cnts = np.unique(tokens, return_counts=True)
    order = sorted(range(len(vals)), key=lambda j: (-cnts[j], vals[j]))[:topk]
    nxt = [int(vals[j]) for j in order] + [-1] * (topk - len(order))
    cnt = [int(cnts[j]) for j in order] + [0] * (topk - len(order))
    return nxt, cnt


def index_lookup_reference(text, sa, tables, query, excl, eos, max_len, topk, max_support):
    """Brute force by scanning every start position; `sa`, `tables` and `max_support` are unused (exact counts)."""
    text = np.asarray(text, dtype=np.int64)
    query = np.asarray(query, dtype=np.int64)
    n, big = len(text), len(query)
    lens = np.zeros(big, dtype=np.int32)
    nexts = np.full((big, topk), -1, dtype=np.int64)
    counts = np.zeros((big, topk), dtype=np.int64)
    ctx = _context_starts(query, eos)
    starts = np.arange(n)
    for i in range(big):
        es, ee = (excl[i] if excl is not None and len(excl) else (NO_RANGE, NO_RANGE))
        for length in range(min(max_len, i - ctx[i] + 1), 0, -1):
            pat = query[i - length + 1: i + 1]
            cand = starts[~((starts + length >= es) & (starts < ee)) & (starts + length < n)]
            for k in range(length):
                cand = cand[text[cand + k] == pat[k]]
            if len(cand):
                lens[i] = length
                nxt, cnt = _top(text[cand + length], topk)
                nexts[i], counts[i] = nxt, cnt
                break
    return lens, nexts, counts


def index_lookup(text, sa, tables: LookupTables, query, excl, eos: int, max_len: int, topk: int, max_support: int):
    if max_len < 1:
        raise ValueError(f"index_lookup: max_len must be >= 1, got {max_len}")
    lens, nxt, cnt = index_lookup_levels(text, sa, tables, query, excl, eos, [max_len], topk, max_support)
    return lens[0], nxt[0], cnt[0]


def index_lookup_levels_reference(text, sa, tables, query, excl, eos: int, caps, topk: int, max_support: int):
    """index_lookup_reference at each cap, stacked (C, ...)."""
    levels = [index_lookup_reference(text, sa, tables, query, excl, eos, cap, topk, max_support) for cap in caps]
    return tuple(np.stack([lv[j] for lv in levels]) for j in range(3))


def index_lookup_levels(text, sa, tables: LookupTables, query, excl, eos: int, caps, topk: int, max_support: int):
    caps = [int(c) for c in caps]
    if not caps or caps[-1] < 1 or any(a <= b for a, b in zip(caps, caps[1:])):
        raise ValueError(f"index_lookup_levels: caps must be >= 1 and strictly descending, got {caps}")
    query = np.ascontiguousarray(query, dtype=np.int64)
    excl = np.zeros((0, 2), dtype=np.int64) if excl is None else np.ascontiguousarray(excl, dtype=np.int64)
    if not kernels_available():
        return index_lookup_levels_reference(text, sa, tables, query, excl, eos, caps, topk, max_support)
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (tables.first, tables.pair_off, tables.pair_next)]
    out = torch.ops.tscale.index_lookup_levels(
        _signed_view(text), _sa_view(sa), *t, _sa_view(tables.pair_start), _signed_view(tables.inline_tokens),
        torch.from_numpy(query), torch.from_numpy(excl), eos, caps, topk, max_support)
    return tuple(t.numpy() for t in out)


# ---- backoff over capped lookups ----------------------------------------------------------

def index_backoff_reference(lens, nxt, cnt, vocab: int, topk: int, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """Position by position, the sums of csrc/index/backoff.cpp in the same order (levels longest cap first)."""
    levels, n, k = nxt.shape
    out_next = np.full((n, topk), -1, dtype=np.int64)
    out_weight = np.zeros((n, topk), dtype=np.int64)
    for i in range(n):
        taken, seen = [], 0
        for c in range(levels - 1, -1, -1):
            valid = [(int(t), int(w)) for t, w in zip(nxt[c, i], cnt[c, i]) if 0 <= t < vocab and w > 0]
            if lens[c, i] > seen and valid:
                taken.append((c, valid))
                seen = int(lens[c, i])
        mult, dense = 1.0, {}
        for c, valid in reversed(taken):
            total = float(sum(w for _, w in valid))
            coef = mult / (total + len(valid))
            for t, w in valid:
                dense[t] = dense.get(t, 0.0) + coef * float(w)
            mult *= len(valid) / (total + len(valid))
        uniform = mult / vocab
        order = sorted(dense, key=lambda t: (-dense[t], t))[:topk]
        weights = [int(np.floor((dense[t] + uniform) * float(scale))) for t in order]
        kept = [(t, w) for t, w in zip(order, weights) if w >= 1]
        for j, (t, w) in enumerate(kept):
            out_next[i, j], out_weight[i, j] = t, w
    return out_next, out_weight


def index_backoff(lens: np.ndarray, nxt: np.ndarray, cnt: np.ndarray, vocab: int, topk: int,
                  scale: int) -> tuple[np.ndarray, np.ndarray]:
    lens = np.ascontiguousarray(lens, dtype=np.int32)
    nxt = np.ascontiguousarray(nxt, dtype=np.int64)
    cnt = np.ascontiguousarray(cnt, dtype=np.int64)
    if not kernels_available():
        return index_backoff_reference(lens, nxt, cnt, vocab, topk, scale)
    out = torch.ops.tscale.index_backoff(torch.from_numpy(lens), torch.from_numpy(nxt), torch.from_numpy(cnt),
                                         vocab, topk, scale)
    return tuple(t.numpy() for t in out)


# ---- n-gram overlap (decontamination) -----------------------------------------------------

def doc_ngrams_reference(tokens: np.ndarray, starts: np.ndarray, n: int) -> list[set[tuple]]:
    """Per document, the set of its n-grams (its final eos excluded)."""
    ends = np.append(starts[1:], len(tokens)) - 1
    out = []
    for s, e in zip(starts, ends):
        doc = [int(t) for t in tokens[s:e]]
        out.append({tuple(doc[i:i + n]) for i in range(len(doc) - n + 1)})
    return out


def docs_with_ngrams_reference(tokens, starts, n: int, ngrams: set[tuple]) -> np.ndarray:
    return np.array([bool(d & ngrams) for d in doc_ngrams_reference(tokens, starts, n)], dtype=bool)


def ngram_hashes(tokens: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
    return torch.ops.tscale.ngram_hashes(t, torch.from_numpy(np.ascontiguousarray(starts, dtype=np.int64)), n).numpy()


def docs_with_ngrams(tokens: np.ndarray, starts: np.ndarray, n: int, sorted_hashes: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
    s = torch.from_numpy(np.ascontiguousarray(starts, dtype=np.int64))
    h = torch.from_numpy(np.ascontiguousarray(sorted_hashes, dtype=np.int64))
    return torch.ops.tscale.docs_with_ngrams(t, s, n, h).numpy()
