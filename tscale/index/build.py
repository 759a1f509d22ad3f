"""The build-index stage: a token folder's training documents -> sharded suffix arrays (tokens/ -> index/).

Only training documents enter the index (optionally minus those sharing an n-gram with
validation, see decontaminate.py). Documents are appended whole, in token-folder order, to
shards of at most `shard_tokens` tokens. The memory setting bounds the whole build: a corpus
that fits one shard is sorted by one SA-IS call (single-threaded); a larger one is cut into
shards small enough that `workers` of them sort at once (one thread each) within the setting.
Everything is written into a folder beside OUT renamed into place when complete, manifest last;
an interrupted build (Ctrl-C, SIGTERM) keeps it, and the same command continues from the finished
index and feature batches (tscale.fileio.resumable_dir).
"""

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tscale.data.shards import TokenFolder
from tscale.errors import UserError
from tscale.fileio import partial_dir, resumable_dir, sha256_file
from tscale.index import features as feats
from tscale.index.decontaminate import contaminated_docs
from tscale.index.distribution import FeatureLookup
from tscale.index.folds import MAX_FOLDS, write_fold_features
from tscale.index.lookup import DOC_COLUMNS, INDEX_FORMAT, INDEX_VERSION, SA_BYTES, Index, tokens_identity
from tscale.manifest import MANIFEST, load_manifest, manifest_fields, write_manifest
from tscale.terminal import console
from tscale.ops import index as ops

MAX_SHARD_TOKENS = (1 << 32) - 1
# Working memory per token while one shard's suffix array is built: the gathered tokens (2-4),
# SA-IS text and array (4 + 4), type bytes and recursion (~2); 64-bit indices above 2^31 tokens.
BUILD_BYTES_32 = 12
BUILD_BYTES_64 = 24
DEFAULT_MAX_MEMORY_GB = 8.0
DEFAULT_FEATURES_SPAN = 32  # the fold indexes' decontamination span, as the evaluation index's headline N


def shard_tokens_for(max_memory_gb: float) -> int:
    """The largest shard whose suffix-array build fits in `max_memory_gb`."""
    budget = int(max_memory_gb * (1 << 30))
    small = budget // BUILD_BYTES_32
    if small < (1 << 31) - 2:
        return max(1, small)
    return max((1 << 31) - 2, min(MAX_SHARD_TOKENS, budget // BUILD_BYTES_64))


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def build_index(tokens: str | os.PathLike, out: str | os.PathLike, max_memory_gb: float = DEFAULT_MAX_MEMORY_GB,
                decontaminate: int | None = None, features: bool = False, shard_tokens: int | None = None,
                quiet: bool = False, workers: int | None = None, features_topk: int = feats.DEFAULT_TOPK,
                features_folds: int | None = None, features_span: int = DEFAULT_FEATURES_SPAN,
                decontaminate_against: str | os.PathLike | None = None,
                features_max_len: int = feats.FEATURE_MAX_LEN, features_distribution: str = "counts") -> dict:
    """Build the index folder `out` from the token folder `tokens`; return its manifest.

    decontaminate: drop the training documents sharing that many tokens with a validation document
    of `tokens`, or with `decontaminate_against` the validation documents of that token folder
    (same tokenizer): the documents a model will be scored on when the index holds a larger corpus.

    features: also write per-token lookups of every train and val token, with the top
    `features_topk` next tokens and their counts (tscale/index/features.py). Train tokens are
    looked up leave-one-out in this index, or with `features_folds` K, each fold in an index
    of the other folds decontaminated against it at `features_span` tokens (tscale/index/folds.py).
    Every lookup's match is capped at `features_max_len` tokens (a model reads them with index.max_len
    the same); `features_distribution` "backoff" stores the Witten-Bell backoff over shorter matches
    instead of the longest match's counts (tscale/index/distribution.py; index.distribution the same).
    """
    out = Path(out)
    if out.exists():
        raise UserError(f"{out}: already exists; choose another -o or delete it")
    if max_memory_gb <= 0:
        raise UserError(f"--max-memory-gb {max_memory_gb}: must be positive")
    if decontaminate is not None and decontaminate < 1:
        raise UserError(f"--decontaminate {decontaminate}: the span length must be at least 1 token")
    lookup = FeatureLookup(features_topk, features_max_len, features_distribution)
    feats.check_lookup(lookup)
    if features_max_len != feats.FEATURE_MAX_LEN and not features:
        raise UserError(f"--features-max-len {features_max_len}: only with --features (it caps their lookups)")
    if features_distribution != "counts" and not features:
        raise UserError(f"--features-distribution {features_distribution}: only with --features")
    if features_folds is not None:
        if not features:
            raise UserError("--features-folds: only with --features (it says how the training features are looked up)")
        if not 2 <= features_folds <= MAX_FOLDS:
            raise UserError(f"--features-folds {features_folds}: must be between 2 and {MAX_FOLDS}")
        if features_span < 1:
            raise UserError(f"--features-span {features_span}: the span length must be at least 1 token")
    if decontaminate_against is not None and not decontaminate:
        raise UserError(f"--decontaminate-against {decontaminate_against}: only with --decontaminate N "
                        "(the span length)")
    workers = workers or default_workers()
    if workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    folder = TokenFolder(tokens)
    limit = min(shard_tokens or MAX_SHARD_TOKENS, shard_tokens_for(max_memory_gb))
    if folder.num_tokens("train") > limit:  # several shards anyway: size them so `workers` sort at once
        limit = min(limit, shard_tokens_for(max_memory_gb / workers))
    for split in ("train", "val"):
        folder.shards(split)  # open (and check) every shard before starting
    against, against_identity = _validation_folder(folder, decontaminate_against)
    t0 = time.perf_counter()
    dropped = [np.zeros(len(s.docs), bool) for s in folder.shards("train")]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} tokens"),
                        TimeElapsedColumn(), console=console(stderr=True, live=True), disable=quiet)
    key = {"tokens": tokens_identity(folder), "against": against_identity, "decontaminate": decontaminate,
           "shard_tokens_limit": limit, "features": features, "lookup": lookup._asdict() if features else None,
           "features_folds": features_folds, "features_span": features_span}
    with progress, _sigterm_as_interrupt(), _kept_when_interrupted(out), resumable_dir(out, key) as (tmp, resumed):
        if resumed and (tmp / MANIFEST).is_file():  # the index itself was complete: keep it, go on with the features
            if not quiet:
                progress.console.print(f"continuing the interrupted build in {tmp}: its index is complete",
                                       soft_wrap=True)
            manifest = load_manifest(tmp, INDEX_FORMAT, (INDEX_VERSION,), verify=False)
            fields = {**manifest_fields(manifest), "features": None}
            files = _shard_files(fields["shards"])
        else:
            if decontaminate:
                task = progress.add_task(f"decontaminating ({decontaminate}-token spans)", total=folder.num_tokens("train"))
                dropped = contaminated_docs(folder, decontaminate, against, lambda n: progress.advance(task, n))
            fields = write_index(folder, dropped, limit, workers, tmp, progress, "building suffix arrays")
            fields["decontamination"] = _decontamination_record(folder, dropped, decontaminate, against_identity)
            fields["build"].update(max_memory_gb=max_memory_gb, seconds=round(time.perf_counter() - t0, 3))
            files = fields.pop("files")
            manifest = write_manifest(tmp, INDEX_FORMAT, INDEX_VERSION, files, **fields)
        if features:
            splits = ("val",) if features_folds else ("train", "val")
            written = feats.write_features(Index(tmp), folder, tmp, progress, lookup, splits)
            if features_folds:
                train = write_fold_features(folder, tmp, features_folds, features_span, lookup, progress,
                                            lambda drop, dest: write_index(folder, drop, limit, workers, dest, progress,
                                                                           "fold index"))
                written["files"] = train.pop("files") + written["files"]
                written["record"]["train_lookups"] = train
                written["record"]["leave_one_out"] = "train tokens are looked up in their fold's index (train_lookups)"
            fields["features"] = written["record"]
            manifest = write_manifest(tmp, INDEX_FORMAT, INDEX_VERSION, files + written["files"], **fields)
    return manifest


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While building, SIGTERM stops the build as Ctrl-C does (so what is finished is kept), in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _kept_when_interrupted(out: Path) -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        print(f"build-index: interrupted; finished work is kept in {partial_dir(out)}; "
              "run the same command again to continue", file=sys.stderr)
        raise


def write_index(folder: TokenFolder, dropped: list[np.ndarray], limit: int, workers: int, dest: Path, progress: Progress,
                description: str) -> dict:
    """Sort and write the kept training documents' shards into `dest`; the manifest fields (with "files")."""
    total_in = folder.doc_tokens("train", [~d for d in dropped])
    task = progress.add_task(description, total=total_in)
    shards = []
    t1 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        pending = []
        for n, (toks, docs) in enumerate(_assemble(folder, dropped, limit)):
            pending.append((n, toks, docs, pool.submit(ops.suffix_array, toks)))
            while len(pending) >= workers or (pending and pending[0][3].done()):
                shards.append(_write_shard(dest, *pending.pop(0)))
                progress.advance(task, shards[-1]["tokens"])
        while pending:
            shards.append(_write_shard(dest, *pending.pop(0)))
            progress.advance(task, shards[-1]["tokens"])
    sort_s = time.perf_counter() - t1
    files = _shard_files(shards)
    progress.update(task, completed=total_in)
    total = sum(s["tokens"] for s in shards)
    disk = sum((dest / f).stat().st_size for f in files)
    return dict(
        files=files, tokens=tokens_identity(folder), vocab_size=folder.vocab_size, eos_id=folder.eos_id,
        dtype=folder.dtype.str, sa_bytes=SA_BYTES, shards=shards, num_tokens=total,
        num_docs=sum(s["docs"] for s in shards), bytes_per_token=round(disk / total, 4) if total else None,
        decontamination=None,
        build={"shard_tokens_limit": limit, "suffix_array_seconds": round(sort_s, 3),
               "workers": min(workers, len(shards)) if shards else 1},
        features=None,
    )


def _shard_files(shards: list[dict]) -> list[str]:
    """The files of the index shards the manifest's "shards" lists."""
    return [f"{s['name']}.{ext}" for s in shards for ext in ("tok", "sa", "docs")]


def _write_shard(tmp: Path, n: int, toks: np.ndarray, docs: np.ndarray, sa_future) -> dict:
    name = f"shard-{n:05d}"
    toks.tofile(tmp / f"{name}.tok")
    sa_future.result().astype("<u4", copy=False).tofile(tmp / f"{name}.sa")
    docs.astype("<u8").tofile(tmp / f"{name}.docs")
    return {"name": name, "tokens": len(toks), "docs": len(docs)}


def _assemble(folder: TokenFolder, dropped: list[np.ndarray], limit: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (tokens, docs (D, 3)) per index shard: kept training documents, whole, in order."""
    parts: list[np.ndarray] = []
    rows: list[tuple[int, int, int]] = []
    size = 0
    for k, (shard, drop) in enumerate(zip(folder.shards("train"), dropped)):
        starts, ends = shard.docs[:, 0].astype(np.int64), shard.doc_ends
        for d in np.flatnonzero(~drop):
            s, e = int(starts[d]), int(ends[d])
            if e - s > limit:
                raise UserError(f"{shard.path}: document {d} has {e - s:,} tokens, more than a shard may hold "
                                f"({limit:,}); raise --max-memory-gb")
            if size + e - s > limit:
                yield np.concatenate(parts), np.array(rows, dtype=np.uint64).reshape(-1, DOC_COLUMNS)
                parts, rows, size = [], [], 0
            parts.append(shard.tokens[s:e])
            rows.append((size, k, int(d)))
            size += e - s
    if rows:
        yield np.concatenate(parts), np.array(rows, dtype=np.uint64).reshape(-1, DOC_COLUMNS)


def _validation_folder(folder: TokenFolder, path: str | os.PathLike | None) -> tuple[TokenFolder | None, dict | None]:
    """The token folder whose validation documents --decontaminate-against names, checked, and its identity
    (tokens_identity, for the manifest); (None, None): `folder`'s own."""
    if path is None:
        return None, None
    other = TokenFolder(path)
    other.shards("val")
    identity = tokens_identity(other)
    mine, theirs = sha256_file(folder.tokenizer_path), identity["tokenizer_sha256"]
    if mine != theirs:
        raise UserError(f"--decontaminate-against {path}: its tokenizer (sha256 {theirs[:12]}…) differs from that of "
                        f"{folder.path} ({mine[:12]}…); tokenize both with the same tokenizer")
    return other, identity


def _decontamination_record(folder: TokenFolder, dropped: list[np.ndarray], n: int | None,
                            against: dict | None = None) -> dict | None:
    if not n:
        return None
    record = {"ngram": n, "method": "64-bit hashes of every n-gram of the validation documents",
              "dropped_docs": int(sum(int(d.sum()) for d in dropped)),
              "dropped_tokens": folder.doc_tokens("train", dropped)}
    if against is not None:  # another folder's validation documents (default: the indexed folder's own)
        record["against"] = against
    return record

