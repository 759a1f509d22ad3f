"""Training features looked up the way evaluation is: K folds, each in an index decontaminated against it.

Leave-one-out removes a training token's own document from its lookup, but near-copies of
that document (shared license headers, mirrored pages) still answer, while the
decontaminated evaluation index holds no document sharing an N-token span with validation.
A model trained on leave-one-out features then trusts matches more than the evaluation
index deserves. Here the training documents are split into K folds (a seeded random fold
per document); fold k's tokens are looked up in an index of the other folds' documents minus
every document that shares an N-token span with a document of fold k, so each training
token meets an index decontaminated against its own document, as a validation token does.
The K fold indexes are built one at a time in a scratch folder and deleted after use; the
features go straight into the memory-mapped feature files. After each fold the files are
flushed and FOLDS_DONE records the folds finished, so an interrupted build continues with the
next fold (tscale/index/build.py keeps the folder); the record goes when all are written.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.progress import Progress

from tscale.data.shards import TokenFolder
from tscale.fileio import write_text_atomic
from tscale.index import features as feats
from tscale.index.decontaminate import docs_sharing_ngrams
from tscale.index.distribution import FeatureLookup
from tscale.index.lookup import INDEX_FORMAT, INDEX_VERSION, Index
from tscale.manifest import write_manifest

FOLD_SEED = 20261130
MAX_FOLDS = 64
FOLDS_DONE = ".folds-done.json"  # in the folder being built: the folds whose features are written


def assign_folds(folder: TokenFolder, folds: int, seed: int = FOLD_SEED) -> list[np.ndarray]:
    """Per train shard, each document's fold (D,) int64 in [0, folds), from one seeded draw over all documents."""
    sizes = [len(s.docs) for s in folder.shards("train")]
    draw = np.random.default_rng(seed).integers(0, folds, sum(sizes))
    return np.split(draw, np.cumsum(sizes)[:-1])


def _doc_spans(folder: TokenFolder, keep: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per train shard, (tokens of the kept documents back to back, their starts there)."""
    out = []
    for shard, mask in zip(folder.shards("train"), keep):
        starts, ends = shard.docs[:, 0].astype(np.int64), shard.doc_ends.astype(np.int64)
        idx = np.flatnonzero(mask)
        if len(idx) == 0:
            continue
        pos = _positions(starts[idx], ends[idx])
        out.append((np.asarray(shard.tokens)[pos], np.concatenate([[0], np.cumsum(ends[idx] - starts[idx])[:-1]])))
    return out


def _positions(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The token positions of the documents [starts[i], ends[i]), in order."""
    lengths = ends - starts
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + offsets


def fold_dropped(folder: TokenFolder, fold_of: list[np.ndarray], k: int, span: int) -> list[np.ndarray]:
    """Per train shard, the documents left out of fold k's index: fold k's own and those sharing a span with them."""
    mine = [f == k for f in fold_of]
    shared = docs_sharing_ngrams(folder, _doc_spans(folder, mine), span)
    return [m | s for m, s in zip(mine, shared)]


def write_fold_features(folder: TokenFolder, out: Path, folds: int, span: int, lookup: FeatureLookup,
                        progress: Progress | None, build: Callable[[list[np.ndarray], Path], dict]) -> dict:
    """Write the train features of `folder` into `out`, fold by fold; the record of how (with "files").

    build(dropped, dest) writes an index of the train documents not dropped into dest and
    returns its manifest fields (tscale.index.build.write_index). Every document is in one
    fold, so every record is written once. folds (2..MAX_FOLDS) and span (>= 1) are checked by
    the caller (tscale.index.build.build_index).
    """
    dtype = feats.feature_dtype(folder.dtype, lookup.topk)
    names = folder.manifest["splits"]["train"]["shards"]
    shards = folder.shards("train")
    marker = out / FOLDS_DONE
    state = _finished(marker, folds, span, [out / feats.feature_name(n) for n in names], shards, dtype)
    outputs = [np.memmap(out / feats.feature_name(n), dtype=dtype, mode="r+" if state else "w+", shape=(len(s.tokens),))
               for n, s in zip(names, shards)]
    fold_of = assign_folds(folder, folds)
    done, sizes = (set(state["done"]), state["per_fold"]) if state else (set(), [])
    task = progress.add_task("fold features", total=folder.num_tokens("train")) if progress else None
    for k in range(folds):
        if k in done:
            if progress:
                progress.advance(task, folder.doc_tokens("train", [f == k for f in fold_of]))
            continue
        dropped = fold_dropped(folder, fold_of, k, span)
        scratch = out / f".fold-{k}"
        shutil.rmtree(scratch, ignore_errors=True)  # left by a build that was killed
        scratch.mkdir()
        try:
            fields = build(dropped, scratch)
            write_manifest(scratch, INDEX_FORMAT, INDEX_VERSION, fields.pop("files"), **fields)
            index = Index(scratch)
            sizes.append({"fold": k, "index_tokens": fields["num_tokens"], "index_docs": fields["num_docs"],
                          "fold_docs": int(sum(int((f == k).sum()) for f in fold_of))})
            for rec, shard, f in zip(outputs, shards, fold_of):
                n = _look_up_fold(index, shard, f == k, rec, dtype, folder.vocab_size, lookup)
                if progress:
                    progress.advance(task, n)
            del index
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for rec in outputs:
            rec.flush()
        done.add(k)
        write_text_atomic(marker, json.dumps({"folds": folds, "span": span, "seed": FOLD_SEED, "done": sorted(done),
                                              "per_fold": sizes}))
    del outputs
    marker.unlink(missing_ok=True)
    return {"method": "folds", "folds": folds, "span": span, "seed": FOLD_SEED, "per_fold": sizes,
            "files": [feats.feature_name(n) for n in names]}


def _finished(marker: Path, folds: int, span: int, paths: list[Path], shards, dtype: np.dtype) -> dict | None:
    """What an interrupted write of the same folds left (marker's record), when its feature files are all there."""
    try:
        state = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    same = (state.get("folds"), state.get("span"), state.get("seed")) == (folds, span, FOLD_SEED)
    whole = all(p.is_file() and p.stat().st_size == len(s.tokens) * dtype.itemsize for p, s in zip(paths, shards))
    return state if same and whole else None


def _look_up_fold(index: Index, shard, mine: np.ndarray, rec: np.ndarray, dtype: np.dtype, vocab_size: int,
                  lookup: FeatureLookup) -> int:
    """Fill rec at the tokens of the documents `mine` of `shard` with their lookups in `index`; tokens done."""
    starts, ends = shard.docs[:, 0].astype(np.int64), shard.doc_ends.astype(np.int64)
    idx = np.flatnonzero(mine)
    starts, ends = starts[idx], ends[idx]  # fold k's documents, in shard order
    done = 0
    d0 = 0
    while d0 < len(idx):  # batches of whole documents: contexts restart after each document's eos
        d1 = max(d0 + 1, int(np.searchsorted(ends, starts[d0] + feats.BATCH_TOKENS, side="right")))
        pos = _positions(starts[d0:d1], ends[d0:d1])
        looked = lookup(index, np.asarray(shard.tokens)[pos])
        rec[pos] = feats.pack(*looked, dtype, vocab_size)
        done += len(pos)
        d0 = d1
    return done
