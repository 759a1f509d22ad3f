"""Benchmark: how the token index's build time, size and lookup latency grow with the corpus (10^7, 10^8 tokens).

For each size N, the first N training tokens of a token folder are sorted as one shard (SA-IS,
one thread), the token-pair table is built, and validation tokens of the same folder are streamed
through the lookup (max_len 64, top-4, max_support 64, all threads; median of --repeats runs,
min and max kept). Sizes larger than the folder's training split are skipped. Optionally the
whole folder is also built by the build-index stage with several shards sorted at once
(--parallel-shard-tokens), against one worker, to measure the parallel build. Writes
docs/bench/index_scaling.json; docs/index.md turns the numbers into the 10^12-token projection.
"""

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_record  # noqa: E402

from tscale.data.shards import TokenFolder  # noqa: E402
from tscale.index import build_index  # noqa: E402
from tscale.ops import index as ops  # noqa: E402


def train_prefix(folder: TokenFolder, n: int) -> np.ndarray | None:
    parts, have = [], 0
    for shard in folder.shards("train"):
        take = min(len(shard.tokens), n - have)
        parts.append(np.asarray(shard.tokens[:take]))
        have += take
        if have == n:
            return np.concatenate(parts)
    return None


def measure(tokens: np.ndarray, vocab: int, eos: int, query: np.ndarray, repeats: int) -> dict:
    t0 = time.perf_counter()
    sa = ops.suffix_array(tokens)
    sort_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tables = ops.lookup_tables(tokens, sa, vocab)
    tables_s = time.perf_counter() - t0
    threads = torch.get_num_threads()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        lens = ops.index_lookup(tokens, sa, tables, query, None, eos, 64, 4, 64)[0]
        rates.append(len(query) / (time.perf_counter() - t0) / threads)
    return {
        "tokens": len(tokens),
        "sort_s": round(sort_s, 3),
        "sort_tokens_per_s_per_core": round(len(tokens) / sort_s),
        "pair_table_s": round(tables_s, 3),
        "pairs": len(tables.pair_next),
        "disk_bytes_per_token": round((tokens.nbytes + sa.nbytes) / len(tokens), 4),
        "pair_table_bytes_per_token": round(tables.nbytes / len(tokens), 4),
        "lookup_tokens_per_s_per_core": round(float(np.median(rates))),
        "lookup_tokens_per_s_per_core_min": round(min(rates)),
        "lookup_tokens_per_s_per_core_max": round(max(rates)),
        "lookup_us_per_token_per_core": round(1e6 / float(np.median(rates)), 3),
        "mean_match_len": round(float(lens.mean()), 3),
    }


def parallel_build(tokens: Path, work: Path, shard_tokens: int, workers: int) -> dict:
    out = {}
    for w in (1, workers):
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.perf_counter()
        m = build_index(tokens, work, shard_tokens=shard_tokens, workers=w, max_memory_gb=64, quiet=True)
        out[f"workers_{w}"] = {"shards": len(m["shards"]), "stage_s": round(time.perf_counter() - t0, 3),
                               "sort_phase_s": m["build"]["suffix_array_seconds"],
                               "sort_tokens_per_s_per_core": round(m["num_tokens"] / m["build"]["suffix_array_seconds"] / w)}
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder (for 10^8: mix + code-slice, GPT-2 BPE)")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e7, 1e8])
    ap.add_argument("--query-tokens", type=int, default=500_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel-shard-tokens", type=int, help="also build the folder in shards of this size, 1 vs all workers")
    ap.add_argument("--work", type=Path, default=REPO / ".cache" / "bench-index-scaling")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    folder = TokenFolder(args.tokens, verify=False)
    query = np.asarray(folder.shards("val")[0].tokens[: args.query_tokens]).astype(np.int64)
    metrics, rows = {}, {}
    for size in args.sizes:
        tokens = train_prefix(folder, int(size))
        if tokens is None:
            print(f"skipping {size:.2g}: the folder has {folder.num_tokens('train'):,} training tokens")
            continue
        row = measure(tokens, folder.vocab_size, folder.eos_id, query, args.repeats)
        rows[f"{size:.2g}"] = row
        print(f"{size:.2g}: {row}", flush=True)
        del tokens
    for key, row in rows.items():
        for name in ("sort_tokens_per_s_per_core", "lookup_tokens_per_s_per_core", "lookup_us_per_token_per_core",
                     "disk_bytes_per_token", "pair_table_bytes_per_token"):
            metrics[f"{name}@{key}"] = row[name]
    extra = {"sizes": rows}
    if args.parallel_shard_tokens:
        extra["parallel_build"] = parallel_build(args.tokens, args.work, args.parallel_shard_tokens, torch.get_num_threads())
        print(extra["parallel_build"], flush=True)
    notes = (f"CPU, {torch.get_num_threads()} threads shared with other processes; expect +-30% between runs. "
             "Per size: one shard of the first N training tokens; lookup streams validation tokens of the same folder. "
             "Details: " + repr(extra))
    print(write_record("index_scaling", metrics, notes, args.out).read_text())


if __name__ == "__main__":
    main()
