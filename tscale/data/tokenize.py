"""The tokenize stage: text inputs -> a token folder (shards, tokenizer.json, manifest), streamed.

Documents are read lazily, encoded in batches bounded by characters (the Rust side of
`tokenizers` spreads a batch over all cores, while this thread reads the next batch and
writes the previous one), and appended to one ShardWriter per split. Everything is built in
a temporary folder that is renamed to the output only when complete, manifest written last.
"""

import os
import time
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from tscale import terminal
from tscale.data import tokenizer as tk
from tscale.data.shards import TOKENS_FORMAT, TOKENS_VERSION, ShardWriter, token_dtype
from tscale.data.text_input import Document, InputFile, iter_documents, list_inputs
from tscale.errors import UserError
from tscale.fileio import atomic_dir
from tscale.manifest import file_record, write_manifest

DEFAULT_VAL_MODULUS = 20
DEFAULT_SHARD_TOKENS = 1 << 27
# Characters per encode batch, 1 MiB per core within 4..16 MiB: enough documents to keep every
# core busy, while memory stays bounded (~170 bytes per token of the batch being encoded).
BATCH_CHARS = min(16, max(4, os.cpu_count() or 1)) << 20
BATCH_DOCS = 4096
SPLIT_RULE = "crc32(source/doc) % modulus == 0 -> val"


def is_validation(source: str, doc: str, modulus: int = DEFAULT_VAL_MODULUS) -> bool:
    """The split rule of ../shared/data/README.md: validation iff crc32("source/doc") % modulus == 0."""
    return zlib.crc32(f"{source}/{doc}".encode("utf-8")) % modulus == 0


def tokenize_corpus(
    inputs: list[str | os.PathLike],
    out: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    vocab_size: int | None = None,
    val_modulus: int = DEFAULT_VAL_MODULUS,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    quiet: bool = False,
) -> dict:
    """Tokenize `inputs` into the new token folder `out`; return its manifest.

    Give exactly one of `tokenizer` (tokenizer.json or GPT-2 encoder.json + vocab.bpe) and
    `vocab_size` (train a byte-level BPE on the training split). Raises UserError on bad input.
    """
    out = Path(out)
    _check_options(tokenizer, vocab_size, val_modulus, shard_tokens)
    _check_out(out)
    files = list_inputs(inputs)
    progress = _progress(quiet)
    with progress:
        if tokenizer is not None:
            tok = tk.load_tokenizer(tokenizer)
        else:
            tok = _train(files, vocab_size, val_modulus, progress)
        eos = tk.eos_id(tok)
        vocab = tk.vocab_size(tok)
        dtype = token_dtype(vocab)
        with atomic_dir(out) as tmp:
            tk.save_tokenizer(tok, tmp / "tokenizer.json")
            tok.encode_special_tokens = True  # text that spells "<|endoftext|>" is plain text, not eos
            writers = {s: ShardWriter(tmp, s, dtype, shard_tokens) for s in ("train", "val")}
            sources = _write_shards(tok, eos, files, writers, val_modulus, progress)
            splits = {s: w.close() for s, w in writers.items()}
            if splits["train"]["docs"] + splits["val"]["docs"] == 0:
                raise UserError(f"{_names(inputs)}: no documents with text (input is empty)")
            shard_files = writers["train"].files() + writers["val"].files()
            return write_manifest(
                tmp,
                TOKENS_FORMAT,
                TOKENS_VERSION,
                ["tokenizer.json", *shard_files],
                vocab_size=vocab,
                eos_id=eos,
                dtype=dtype.str,
                tokenizer="tokenizer.json",
                sources=sources,
                split_rule={"rule": SPLIT_RULE, "modulus": val_modulus},
                splits=splits,
                inputs=[{"path": str(f.path), **file_record(f.path)} for f in files],
            )


def _check_options(tokenizer, vocab_size, val_modulus: int, shard_tokens: int) -> None:
    if (tokenizer is None) == (vocab_size is None):
        raise UserError("give exactly one of --tokenizer PATH (use a tokenizer) and --vocab-size N (train one)")
    if vocab_size is not None:
        tk.check_vocab_size(vocab_size)
    if val_modulus < 2:
        raise UserError(f"--val-modulus {val_modulus}: must be at least 2 (1 would put every document in validation)")
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens}: must be positive")


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: already exists; choose another --out or delete it")


def _names(inputs) -> str:
    return ", ".join(str(p) for p in inputs)


def _train(files: list[InputFile], vocab_size: int, modulus: int, progress: Progress) -> Tokenizer:
    task = progress.add_task("training BPE", stats="")
    seen = {"docs": 0, "chars": 0}

    def texts() -> Iterator[str]:
        for d in iter_documents(files):
            if d.text and not is_validation(d.source, d.doc, modulus):
                seen["docs"] += 1
                seen["chars"] += len(d.text)
                progress.update(task, stats=f"{seen['docs']:,} docs, {seen['chars'] / 1e6:,.1f} M chars read")
                yield d.text

    tok = tk.train_tokenizer(texts(), vocab_size)
    progress.update(task, stats=f"{seen['docs']:,} docs, vocabulary {tok.get_vocab_size():,}")
    _finish(progress, task)
    if seen["docs"] == 0:
        raise UserError(
            f"{_names([f.path for f in files])}: no training documents with text to train the tokenizer on "
            f"(input empty, or every document fell in validation)"
        )
    return tok


def _write_shards(tok: Tokenizer, eos: int, files, writers: dict, modulus: int, progress: Progress) -> list[str]:
    """Encode all documents and append them to the writers; return the sources in first-seen order."""
    source_index: dict[str, int] = {}
    task = progress.add_task("tokenizing", stats="")
    start, counts = time.monotonic(), {"docs": 0, "tokens": 0, "bytes": 0}
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
    dtype = writers["train"].dtype

    def encode(texts: list[str]) -> list[np.ndarray]:
        """Ids of each text plus eos, as compact arrays (the Encoding objects are dropped at once)."""
        out = []
        for enc in encode_batch(texts, add_special_tokens=False):
            ids = enc.ids
            arr = np.empty(len(ids) + 1, dtype=dtype)
            arr[:-1] = ids
            arr[-1] = eos
            out.append(arr)
        return out

    def write(batch: list[Document], encoded: list[np.ndarray]) -> None:
        for d, ids in zip(batch, encoded):
            split = "val" if is_validation(d.source, d.doc, modulus) else "train"
            nbytes = len(d.text.encode("utf-8"))
            writers[split].add(ids, source_index.setdefault(d.source, len(source_index)), nbytes)
            counts["docs"] += 1
            counts["tokens"] += len(ids)
            counts["bytes"] += nbytes
        rate = counts["bytes"] / 1e6 / max(time.monotonic() - start, 1e-9)
        progress.update(
            task, stats=f"{counts['docs']:,} docs, {counts['tokens']:,} tokens, {counts['bytes'] / 1e6:,.1f} MB, {rate:,.1f} MB/s"
        )

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for batch in _batches(iter_documents(files)):
            future = pool.submit(encode, [d.text for d in batch])
            if pending is not None:
                write(pending[0], pending[1].result())
            pending = (batch, future)
        if pending is not None:
            write(pending[0], pending[1].result())
    _finish(progress, task)
    return list(source_index)


def _batches(docs: Iterable[Document]) -> Iterator[list[Document]]:
    """Group non-empty documents into batches of at most BATCH_CHARS characters (or one larger document)."""
    batch, chars = [], 0
    for d in docs:
        if not d.text:
            continue
        if batch and (chars + len(d.text) > BATCH_CHARS or len(batch) >= BATCH_DOCS):
            yield batch
            batch, chars = [], 0
        batch.append(d)
        chars += len(d.text)
    if batch:
        yield batch


def _finish(progress: Progress, task) -> None:
    progress.update(task, total=1, completed=1)
    progress.stop_task(task)


def _progress(quiet: bool) -> Progress:
    console = terminal.console(stderr=True, live=True)
    return Progress(
        SpinnerColumn(finished_text="[green]✓"),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
        transient=False,
    )
