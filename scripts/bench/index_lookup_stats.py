"""What an index tells about a token folder's validation text, before any model: per match length, how often.

    python scripts/bench/index_lookup_stats.py TOKENS INDEX [INDEX ...] [--max-len 64 16 ...] [--out FILE.json]

Every validation token of TOKENS is looked up in each INDEX (streaming, top-4 next tokens), with
the match capped at each --max-len (default 64, what features are built with). Per match-length
bucket (those of `tscale eval --index`, always of the match at 64 tokens, so that the caps are
compared on the same positions): the share of positions and how often the index's most frequent
next token is the token that follows (top-1 accuracy); overall also whether it is among the top 4;
per source: its share, top-1 accuracy and mean match length. Comparing a raw index with
decontaminated ones, indexes of different sizes, or caps, shows what a model that mixes in the
index could gain from each.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from tscale.data.shards import TokenFolder
from tscale.index import Index
from tscale.index.features import FEATURE_MAX_LEN
from tscale.index.mixing import BUCKET_EDGES, bucket_labels


def val_stream(folder: TokenFolder) -> tuple[np.ndarray, np.ndarray]:
    """The validation tokens (N,) of every shard back to back, and each token's source id (N,)."""
    tokens, sources = [], []
    for shard in folder.shards("val"):
        toks = np.asarray(shard.tokens, dtype=np.int64)
        lengths = shard.doc_lengths  # (D,) tokens per document
        src = np.repeat(shard.docs[:, 1].astype(np.int64), lengths)  # (N,)
        tokens.append(toks)
        sources.append(src)
    return np.concatenate(tokens), np.concatenate(sources)


def lookup_stats(index: Index, tokens: np.ndarray, sources: np.ndarray, source_names: list[str],
                 max_len: int = FEATURE_MAX_LEN, bucket_len: np.ndarray | None = None,
                 looked: tuple | None = None) -> dict:
    """Shares and top-1 accuracies of one index on the stream (position t predicts token t + 1), matches capped at
    max_len; bucketed by bucket_len (N,) (another cap's match lengths) where given, else by this cap's.
    looked: (index.lookup's result for the stream at max_len with topk 4, its seconds), a lookup already made."""
    if looked is None:
        looked = timed_lookup(index, tokens, max_len)
    (match_len, next_tokens, _), seconds = looked
    length, target, source = match_len[:-1], tokens[1:], sources[:-1]
    right = next_tokens[:-1, 0] == target  # (N - 1,)
    top4 = (next_tokens[:-1] == target[:, None]).any(axis=1)  # (N - 1,)
    bucket = np.searchsorted(np.asarray(BUCKET_EDGES), length if bucket_len is None else bucket_len[:-1],
                             side="right")  # (N - 1,), as length_bucket
    by_len = {}
    for b, label in enumerate(bucket_labels()):
        m = bucket == b
        by_len[label] = {"share": float(m.mean()), "top1": float(right[m].mean()) if m.any() else None}
    by_source = {}
    for s in np.unique(source):
        m = source == s
        by_source[source_names[s]] = {"share": float(m.mean()), "top1": float(right[m].mean()),
                                      "mean_match_len": float(length[m].mean())}
    return {"index": str(index.path), "index_tokens": index.num_tokens, "max_len": max_len,
            "decontamination": index.manifest.get("decontamination"), "lookup_s": round(seconds, 2),
            "top1": float(right.mean()), "top4": float(top4.mean()), "mean_match_len": float(length.mean()),
            "by_match_len": by_len, "by_source": by_source}


def timed_lookup(index: Index, tokens: np.ndarray, max_len: int) -> tuple[tuple, float]:
    """(index.lookup of the stream with matches capped at max_len, top-4; the seconds it took)."""
    t0 = time.perf_counter()
    result = index.lookup(tokens, max_len=max_len, topk=4)
    return result, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder whose validation split is looked up")
    ap.add_argument("indexes", type=Path, nargs="+", help="index folders (same tokenizer)")
    ap.add_argument("--max-len", type=int, nargs="+", default=[FEATURE_MAX_LEN], help="match caps to compare")
    ap.add_argument("--out", type=Path, help="also write the results here (JSON)")
    args = ap.parse_args()
    folder = TokenFolder(args.tokens)
    tokens, sources = val_stream(folder)
    results = []
    for path in args.indexes:
        index = Index(path)
        index.check_tokens(folder)
        at64 = timed_lookup(index, tokens, FEATURE_MAX_LEN)  # its match lengths (N,) are every cap's buckets
        for cap in args.max_len:
            r = lookup_stats(index, tokens, sources, folder.manifest["sources"], cap, at64[0][0],
                             at64 if cap == FEATURE_MAX_LEN else None)
            results.append(r)
            cells = "  ".join(f"{k} {v['share']:.3f}/{v['top1'] if v['top1'] is None else round(v['top1'], 3)}"
                              for k, v in r["by_match_len"].items())
            print(f"{path} (max_len {cap}): {r['index_tokens']:,} tokens, top-1 {r['top1']:.4f}, top-4 {r['top4']:.4f}, "
                  f"mean match {r['mean_match_len']:.2f}; share/top-1 by match length at 64: {cells}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"tokens": str(args.tokens), "val_tokens": len(tokens), "results": results},
                                       indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
