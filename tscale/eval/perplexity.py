"""Validation loss, perplexity and bits per byte of a checkpoint on a token folder, by source.

Every val shard is cut into non-overlapping windows of seq_len + 1 tokens (stride seq_len, the
last one shorter), so every val token except each shard's first is scored exactly once, with
as much context as its window gives. A target token's loss counts for the source of the
document it belongs to (its eos included). Bits per byte = nats / ln 2 / UTF-8 bytes of the
documents' text; with --max-tokens, a document scored in part counts that part of its bytes.
For comparison, a unigram model (add-one smoothed token frequencies of the TRAIN split) is
scored on the same targets: a trained model must beat `unigram_loss`.

With the token index (`--index DIR`, repeatable; tscale/eval/index_eval.py), the split is
scored once per index: a model trained with the index is fed that index's lookups, and every
model's loss is also broken down by match-length bucket. The record's top-level numbers are
then those of the first index; "indexes" holds one full record per index. A model trained with
the index is also scored with its lookups switched off ("without_index": the network alone, in
the first index's buckets), so its own perplexity stands beside the baseline's.
"""

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from tscale.data.loader import WindowFeatures
from tscale.data.shards import Shard, TokenFolder
from tscale.errors import UserError
from tscale.eval.index_eval import bucket_of, bucket_summary, check_index_use, lookup_max_len, val_features
from tscale.index.mixing import NUM_BUCKETS, IndexFeatures

COUNT_CHUNK = 1 << 24  # tokens per bincount pass over the train shards


def windows(n_tokens: int, seq_len: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the windows of a shard of n_tokens: inputs [start, end-1), targets [start+1, end)."""
    for start in range(0, n_tokens - 1, seq_len):
        yield start, min(start + seq_len + 1, n_tokens)


def unigram_log_probs(folder: TokenFolder) -> np.ndarray:
    """log p (V,) float64 of each id under add-one smoothed counts of the train split."""
    counts = np.zeros(folder.vocab_size, dtype=np.int64)
    for shard in folder.shards("train"):
        for i in range(0, len(shard.tokens), COUNT_CHUNK):
            counts += np.bincount(shard.tokens[i:i + COUNT_CHUNK], minlength=folder.vocab_size)
    return np.log((counts + 1.0) / (counts.sum() + folder.vocab_size))


def check_same_tokenizer(ckpt_tokenizer: Path, folder: TokenFolder, model_vocab: int) -> None:
    """UserError unless the checkpoint was trained with the token folder's tokenizer."""
    a, b = Path(ckpt_tokenizer).read_bytes(), folder.tokenizer_path.read_bytes()
    if a != b:
        try:
            same = json.loads(a) == json.loads(b)
        except (json.JSONDecodeError, UnicodeDecodeError):
            same = False
        if not same:
            raise UserError(
                f"{folder.path}: made with another tokenizer than the checkpoint ({folder.tokenizer_path} differs "
                f"from {ckpt_tokenizer}); tokenize the text again with --tokenizer {ckpt_tokenizer}")
    if folder.vocab_size > model_vocab:
        raise UserError(f"{folder.path}: vocab_size {folder.vocab_size} exceeds the model's {model_vocab}")


class _Tally:
    """Running sums: nats and tokens per source, scored targets per document, unigram nats."""

    def __init__(self, folder: TokenFolder, logp_unigram: np.ndarray):
        n_src = len(folder.sources)
        self.nats = np.zeros(n_src, dtype=np.float64)
        self.tokens = np.zeros(n_src, dtype=np.int64)
        self.unigram_nats = 0.0
        self.bucket_nats = np.zeros(NUM_BUCKETS, dtype=np.float64)
        self.bucket_tokens = np.zeros(NUM_BUCKETS, dtype=np.int64)
        self.logp = logp_unigram
        self.scored = {}  # shard index -> (D,) int64 scored targets per document
        self.starts = {}  # shard index -> (D,) int64 document starts

    def add(self, k: int, shard: Shard, start: int, targets: np.ndarray, nats: np.ndarray,
            match_len: np.ndarray | None = None) -> None:
        """Targets (n,) at positions start+1.. of shard k, with their losses nats (n,) [and contexts' match lengths (n,)]."""
        if match_len is not None:
            b = bucket_of(match_len)
            self.bucket_nats += np.bincount(b, weights=nats, minlength=NUM_BUCKETS)
            self.bucket_tokens += np.bincount(b, minlength=NUM_BUCKETS)
        pos = np.arange(start + 1, start + 1 + len(targets), dtype=np.int64)
        if k not in self.starts:
            self.starts[k] = shard.docs[:, 0].astype(np.int64)
        doc = np.searchsorted(self.starts[k], pos, side="right") - 1  # (n,)
        src = shard.docs[doc, 1].astype(np.int64)  # (n,)
        self.nats += np.bincount(src, weights=nats, minlength=len(self.nats))
        self.tokens += np.bincount(src, minlength=len(self.tokens))
        scored = self.scored.setdefault(k, np.zeros(len(shard.docs), dtype=np.int64))
        scored += np.bincount(doc, minlength=len(shard.docs))
        self.unigram_nats -= float(self.logp[targets.astype(np.int64)].sum())

    def text_bytes(self, shards: list[Shard]) -> np.ndarray:
        """(S,) bytes per source: each document's bytes times the fraction of its scorable tokens scored."""
        out = np.zeros(len(self.nats), dtype=np.float64)
        for k, scored in self.scored.items():
            docs = shards[k].docs
            ntok = shards[k].doc_lengths  # (D,)
            ntok[0] -= 1  # a shard's first token is never a target
            frac = np.where(scored >= ntok, 1.0, scored / np.maximum(ntok, 1))
            out += np.bincount(docs[:, 1].astype(np.int64), weights=docs[:, 2] * frac, minlength=len(out))
        return out


@torch.no_grad()
def evaluate(model: nn.Module, folder: TokenFolder, device: torch.device | str = "cpu", batch_size: int = 8,
             max_tokens: int | None = None, on_progress: Callable[[int, int], None] | None = None,
             features: WindowFeatures | None = None, hide_lookups: bool = False) -> dict:
    """Score the val split; the dict has val_tokens, val_loss, perplexity, bits_per_byte, unigram_loss, by_source.

    features: the val split's index lookups; fed to a model built with the index, and used by
    any model for the by_match_len / below_16 breakdown added to the dict.
    hide_lookups: a model built with the index is fed "no match anywhere" instead (the network
    alone: the mixture's gate is exactly 0 there), still broken down by the lookups' buckets.
    """
    device = torch.device(device)
    seq_len = model.cfg.seq_len
    shards = folder.shards("val")
    total = sum(max(len(s.tokens) - 1, 0) for s in shards)
    if max_tokens is not None:
        total = min(total, max_tokens)
    if total <= 0:
        raise UserError(f"{folder.path}: no val tokens to evaluate on (the val split is empty)")
    tally = _Tally(folder, unigram_log_probs(folder))
    feed = getattr(model, "index", None) is not None
    if feed and features is None:
        raise ValueError("this model was built with the token index: evaluate it with features")
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else contextlib.nullcontext
    batch: list[tuple[int, int, int]] = []  # (shard index, start, end) of full windows
    done = 0

    def run(items: list[tuple[int, int, int]]) -> None:
        nonlocal done
        rows = [np.asarray(shards[k].tokens[s:e], dtype=np.int64) for k, s, e in items]
        w = torch.from_numpy(np.stack(rows)).to(device)  # (B, L+1)
        x, y = w[:, :-1], w[:, 1:].contiguous()  # (B, L) each
        feats = features.gather([(k, s) for k, s, _ in items], x.shape[1]) if features is not None else None
        fed = (IndexFeatures.empty(*x.shape, features.topk) if hide_lookups else feats).to(device) if feed else None
        with autocast():  # on a CPU the logits are made a chunk of tokens at a time
            nats = model(x, index=fed, targets=y)  # (B, L)
        nats = nats.double().cpu().numpy()
        lens = feats.match_len.numpy() if feats is not None else [None] * len(rows)  # (B, L)
        for (k, s, e), row, row_nats, row_lens in zip(items, rows, nats, lens):
            tally.add(k, shards[k], s, row[1:], row_nats, row_lens)
            done += e - s - 1
        if on_progress is not None:
            on_progress(done, total)

    budget = total
    for k, shard in enumerate(shards):
        for s, e in windows(len(shard.tokens), seq_len):
            if budget <= 0:
                break
            e = min(e, s + 1 + budget)
            budget -= e - s - 1
            if e - s == seq_len + 1:
                batch.append((k, s, e))
                if len(batch) == batch_size:
                    run(batch)
                    batch = []
            else:
                run([(k, s, e)])  # a shorter window: alone, so no padding is needed
    if batch:
        run(batch)
    summary = _summary(folder, tally, tally.text_bytes(shards), total)
    if features is not None:
        assert int(tally.bucket_tokens.sum()) == total
        summary.update(bucket_summary(tally.bucket_nats, tally.bucket_tokens))
    return summary


def _summary(folder: TokenFolder, t: _Tally, text_bytes: np.ndarray, total: int) -> dict:
    def stats(nats: float, tokens: int, nbytes: float) -> dict:
        loss = nats / tokens
        bpb = nats / math.log(2) / nbytes if nbytes > 0 else None
        return {"tokens": int(tokens), "loss": loss, "perplexity": math.exp(loss), "bits_per_byte": bpb}

    overall = stats(float(t.nats.sum()), int(t.tokens.sum()), float(text_bytes.sum()))
    assert overall["tokens"] == total
    by_source = {folder.sources[i]: stats(float(t.nats[i]), int(t.tokens[i]), float(text_bytes[i]))
                 for i in range(len(folder.sources)) if t.tokens[i] > 0}
    return {"val_tokens": overall["tokens"], "val_loss": overall["loss"], "perplexity": overall["perplexity"],
            "bits_per_byte": overall["bits_per_byte"], "text_bytes": float(text_bytes.sum()),
            "unigram_loss": t.unigram_nats / total, "by_source": by_source}


def run_dir_of(ckpt: str | os.PathLike) -> Path | None:
    """The run folder of CKPT: itself when it is a run folder, run/ for run/ckpt/step-N, else None."""
    path = Path(ckpt)
    if (path / "ckpt").is_dir() and not (path / "manifest.json").is_file():
        return path
    parent = path.resolve().parent
    return parent.parent if parent.name == "ckpt" else None


def evaluate_checkpoint(ckpt: str | os.PathLike, tokens_dir: str | os.PathLike, device: torch.device | str = "cpu",
                        batch_size: int = 8, max_tokens: int | None = None,
                        on_progress: Callable[[int, int], None] | None = None, precision: str = "bf16",
                        indexes: list[str | os.PathLike] = (), index_max_len: int | None = None,
                        quantize_head: bool = False) -> dict:
    """Load CKPT (checkpoint or run folder), check the tokenizer, score the val split: the eval.json record.

    precision: "bf16" (as trained) or a low-precision inference mode of tscale.precision.INFER_MODES;
    quantize_head: that mode for the head too.
    indexes: index folders to score against, one pass each (see the module docstring).
    index_max_len: the lookups' match cap for a model trained without the index (its match-length
    buckets); a model trained with the index takes its own index.max_len, and another value is refused.
    """
    from tscale.train.checkpoint import load_model

    if batch_size < 1:
        raise UserError(f"--batch-size {batch_size}: must be at least 1")
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens {max_tokens}: must be at least 1")
    folder = TokenFolder(tokens_dir)
    model, ck = load_model(ckpt, device, precision, quantize_head=quantize_head)
    check_same_tokenizer(ck.tokenizer_path, folder, model.cfg.vocab_size)
    uses_index = ck.index_cfg is not None
    indexes = list(indexes)
    check_index_use(ck.path, uses_index, indexes)
    head = {"checkpoint": str(ck.path), "step": ck.step, "tokens_dir": str(folder.path), "max_tokens": max_tokens,
            "precision": precision, "quantize_head": quantize_head, "model_uses_index": uses_index}
    if not indexes:
        return {**head, **evaluate(model, folder, device, batch_size, max_tokens, on_progress)}
    topk = ck.index_cfg.topk if uses_index else 1
    distribution = ck.index_cfg.distribution if uses_index else "counts"
    max_len = lookup_max_len(ck, index_max_len)
    entries, hidden = [], None
    for path in indexes:
        features, info = val_features(path, folder, topk, max_tokens, max_len, distribution)
        entries.append({**info, **evaluate(model, folder, device, batch_size, max_tokens, on_progress, features)})
        if uses_index and hidden is None:  # the same model with its lookups switched off, in the first index's buckets
            hidden = {**info, "lookups": "hidden",
                      **evaluate(model, folder, device, batch_size, max_tokens, on_progress, features, hide_lookups=True)}
    first = {k: v for k, v in entries[0].items()
             if k not in ("index", "lookups", "index_tokens", "max_len", "distribution", "decontamination")}
    return {**head, **first, "indexes": entries, **({"without_index": hidden} if hidden else {})}
