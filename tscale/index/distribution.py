"""What a position's lookup says about the next token: the longest match's counts, or Witten-Bell backoff.

Two distributions, chosen by index.distribution and recorded with the features:

  counts   the top-k next tokens of the longest match (capped at max_len) and how often each
           followed it; a mixer smooths them add-delta (tscale/index/mixing.py).
  backoff  the longest match and the matches capped at 32, 16, 8, 4, 2 and 1 token (those below
           max_len) are each looked up with their LEVEL_TOPK most frequent next tokens, and
           Witten-Bell interpolation combines them: starting from the uniform distribution, each
           longer context seen n times with u distinct next tokens keeps n / (n + u) of the mass
           for its own counts and passes u / (n + u) to the shorter ones (csrc/index/backoff.cpp).
           The features keep the k most probable tokens with their probabilities in units of
           1 / WEIGHT_SCALE, in the field that holds counts otherwise; the mass they leave spreads
           evenly over the other tokens. Tokens the longest match never saw get what shorter
           contexts say of them instead of add-delta's almost nothing: on the code slice's
           decontaminated index a fitted mixture saves about 18% more nats with it than with the
           longest match's top 4 (docs/index.md, section 16). One pass looks every cap up
           (Index.lookup_levels): a shorter cap searches only where the match is longer than it.

The match length a model sees (its buckets, the gate's length terms) is the longest match's in both.
"""

from typing import NamedTuple

import numpy as np

from tscale.index.lookup import DEFAULT_MAX_SUPPORT, Index
from tscale.ops import index as ops

DISTRIBUTIONS: tuple[str, ...] = ("counts", "backoff")
BACKOFF_CAPS = (32, 16, 8, 4, 2, 1)  # the shorter contexts, below the features' max_len
LEVEL_TOPK = 16  # next tokens looked up per backoff level
WEIGHT_SCALE = 1 << 30  # backoff probabilities are stored as floor(p * WEIGHT_SCALE)
CHUNK = 1 << 18  # positions combined at once: bounds the per-level arrays (about 470 MB for 7 levels)


def backoff_caps(max_len: int) -> tuple[int, ...]:
    """The match caps of the backoff levels, longest first: max_len and the BACKOFF_CAPS below it."""
    return (max_len, *(c for c in BACKOFF_CAPS if c < max_len))


class FeatureLookup(NamedTuple):
    """How features are looked up: k next tokens per position, matches capped at max_len, which distribution."""

    topk: int = 4
    max_len: int = 64
    distribution: str = "counts"
    max_support: int = DEFAULT_MAX_SUPPORT

    def record(self) -> dict:
        """The features manifest's fields that say how the distribution was made."""
        if self.distribution == "counts":
            return {"distribution": "counts"}
        return {"distribution": "backoff", "backoff_caps": list(backoff_caps(self.max_len)), "level_topk": LEVEL_TOPK,
                "weight_scale": WEIGHT_SCALE}

    def __call__(self, index: Index, tokens: np.ndarray, exclude_ranges: np.ndarray | None = None):
        """match_len (N,) int32, next_tokens (N, topk) int64 (-1 = none), counts or weights (N, topk) int64."""
        if self.distribution == "counts":
            return index.lookup(tokens, exclude_ranges, max_len=self.max_len, topk=self.topk,
                                max_support=self.max_support)
        tokens = np.asarray(tokens)
        n = len(tokens)
        lens = np.zeros(n, np.int32)
        nxt = np.full((n, self.topk), -1, np.int64)
        weight = np.zeros((n, self.topk), np.int64)
        for s in range(0, n, CHUNK):
            e = min(n, s + CHUNK)
            lens[s:e], nxt[s:e], weight[s:e] = self._backoff(index, tokens, exclude_ranges, s, e)
        return lens, nxt, weight

    def _backoff(self, index: Index, tokens: np.ndarray, excl: np.ndarray | None, s: int, e: int):
        """Positions [s, e): each level looked up with the max_len - 1 tokens before s as warm-up."""
        w = max(0, s - (self.max_len - 1))
        part = tokens[w:e]
        part_excl = None if excl is None or not len(excl) else excl[w:e]
        levels = index.lookup_levels(part, part_excl, backoff_caps(self.max_len), LEVEL_TOPK, self.max_support)
        lens, nxt, cnt = (a[:, s - w:] for a in levels)  # (C, n[, LEVEL_TOPK])
        top, weight = ops.index_backoff(lens, nxt, cnt, index.vocab_size, self.topk, WEIGHT_SCALE)
        return lens[0], top, weight
