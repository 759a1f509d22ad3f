"""Decontamination: which training documents share an n-token span with any validation document.

The validation documents are the token folder's own, or another folder's (the documents a
model will be scored on, when the index is built from a larger corpus). Every n-gram inside a
validation document (its final eos excluded) is hashed to 64 bits; a training document is
dropped when any of its n-grams hashes into that set. A false positive
needs a 64-bit hash collision (about 1e-5 chance over a 40M-token corpus); without the kernels
the exact n-gram sets of tscale/ops/index.py are used instead.
"""

from collections.abc import Callable

import numpy as np

from tscale.data.shards import Shard, TokenFolder
from tscale.ops import index as ops
from tscale.ops.backend import kernels_available


def _docs(shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(shard.tokens, dtype=np.int64), shard.docs[:, 0].astype(np.int64)


def contaminated_docs(folder: TokenFolder, n: int, against: TokenFolder | None = None,
                      on_shard: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Per train shard of `folder`, a bool (D,) array: True for documents sharing an n-gram with a
    validation document of `against` (default: of `folder` itself). on_shard(tokens) after each train shard."""
    return docs_sharing_ngrams(folder, [_docs(s) for s in (against or folder).shards("val")], n, on_shard)


def docs_sharing_ngrams(folder: TokenFolder, probe: list[tuple[np.ndarray, np.ndarray]], n: int,
                        on_shard: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Per train shard, a bool (D,) array: True for documents sharing an n-gram with a document of `probe`.

    probe: (tokens, document starts) pairs, documents back to back, each ending in eos.
    """
    if kernels_available():
        hashes = [ops.ngram_hashes(t, st, n) for t, st in probe]
        table = np.unique(np.concatenate(hashes)) if hashes else np.zeros(0, np.int64)

        def shard_docs(s: Shard) -> np.ndarray:
            return ops.docs_with_ngrams(*_docs(s), n, table)
    else:
        grams: set[tuple] = set()
        for t, st in probe:
            for g in ops.doc_ngrams_reference(t, st, n):
                grams |= g

        def shard_docs(s: Shard) -> np.ndarray:
            return ops.docs_with_ngrams_reference(*_docs(s), n, grams)
    out = []
    for s in folder.shards("train"):
        out.append(shard_docs(s))
        if on_shard is not None:
            on_shard(len(s.tokens))
    return out
