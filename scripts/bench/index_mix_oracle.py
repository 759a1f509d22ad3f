"""How much a model gains from mixing in the index's next-token distribution, for several ways of making it.

    python scripts/bench/index_mix_oracle.py TOKENS RUN INDEX [--max-tokens 400000] [--gate length|length-share-count]
                                             [--out FILE.json]

No training: a trained model (RUN, any size; a CPU is enough for a small one) scores the validation
targets of TOKENS as `tscale eval` does (non-overlapping windows of its seq_len), the index is looked up
at every position, and p = (1 - l_b) p_model + l_b p_index is scored with one weight l_b per
match-length bucket (the learned gate's simplest form; --gate length-share-count: per match-length
bucket x share of the top-4 counts on the first token x their sum, as index.gate_stats sees them),
fitted on the first half of the targets and scored on the second. The index distributions compared:

  top4      the longest match's 4 most frequent next tokens, add-1e-5 smoothed (what index.mixer reads)
  top16     the same with 16
  backoff   Witten-Bell interpolation over the contexts that matches capped at 64, 32, 16, 8, 4, 2 and
            1 tokens give (each with its 16 most frequent next tokens): a context seen n times with u
            distinct continuations keeps n / (n + u) of the weight and passes the rest to the next
            shorter one, the shortest to the uniform distribution

An upper bound for nothing, and no model's result: it says which distribution would give a learned
mixer more to work with, on whatever model and index it is given.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO  # noqa: E402

from tscale.data.shards import TokenFolder  # noqa: E402
from tscale.eval.index_eval import bucket_of  # noqa: E402
from tscale.eval.perplexity import windows  # noqa: E402
from tscale.index import Index  # noqa: E402
from tscale.index.mixing import NUM_BUCKETS, bucket_labels  # noqa: E402
from tscale.model.loss import token_losses  # noqa: E402
from tscale.train.checkpoint import load_model  # noqa: E402

CAPS = (64, 32, 16, 8, 4, 2, 1)
DELTA = 1e-5
LAMBDAS = np.linspace(0.0, 0.98, 50)


def model_nats(run: Path, tokens: np.ndarray) -> np.ndarray:
    """nats[j] of target tokens[j] (j >= 1) given the window's context; nats[0] = nan."""
    model, ckpt = load_model(run)
    seq_len = ckpt.model_cfg.seq_len
    nats = np.full(len(tokens), np.nan)
    t = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        for start, end in windows(len(tokens), seq_len):
            x, y = t[start:end - 1][None], t[start + 1:end][None]  # (1, L)
            nats[start + 1:end] = token_losses(model(x), y)[0].double().numpy()
    return nats


def p_top(cnt: np.ndarray, nxt: np.ndarray, y: np.ndarray, k: int, vocab: int) -> np.ndarray:
    """Add-DELTA smoothed top-k counts' probability of y (n,) from the lookup rows (n, >=k)."""
    c, t = cnt[:, :k].astype(np.float64), nxt[:, :k]
    hit = (c * (t == y[:, None])).sum(1)
    return (hit + DELTA) / (c.sum(1) + DELTA * vocab)


def p_backoff(lookups: list, y: np.ndarray, vocab: int) -> np.ndarray:
    """Witten-Bell over the capped contexts, shortest first (lookups: (lens, nxt, cnt) per cap, longest cap first)."""
    p = np.full(len(y), 1.0 / vocab)
    seen_len = np.zeros(len(y), dtype=np.int64)
    for lens, nxt, cnt in reversed(lookups):  # cap 1 first
        c = cnt.astype(np.float64)
        n, u = c.sum(1), (c > 0).sum(1)
        new = (lens > seen_len) & (n > 0)  # a longer context than the last one taken
        hit = (c * (nxt == y[:, None])).sum(1)
        p = np.where(new, (hit + u * p) / np.maximum(n + u, 1e-12), p)
        seen_len = np.where(new, lens, seen_len)
    return p


def fit_and_score(pm: np.ndarray, pi: np.ndarray, cells: np.ndarray, half: int) -> tuple[float, np.ndarray]:
    """Mean nats on [half:] of the mixture with one weight per gate cell (cell 0: no match, weight 0) fitted on
    [:half]; the weight of every target."""
    weight = np.zeros(len(pm))
    for cell in np.unique(cells[cells > 0]):
        fit, mine = np.flatnonzero(cells[:half] == cell), np.flatnonzero(cells == cell)
        if len(fit):
            losses = [-np.log((1 - lam) * pm[fit] + lam * pi[fit]).mean() for lam in LAMBDAS]
            weight[mine] = LAMBDAS[int(np.argmin(losses))]
    mixed = -np.log((1 - weight) * pm + weight * pi)
    return float(mixed[half:].mean()), weight


def gate_cells(buckets: np.ndarray, cnt: np.ndarray, gate: str) -> np.ndarray:
    """The gate's cell of every target: its match-length bucket, with --gate length-share-count also the top-4
    counts' share on the first token (5 buckets) and their sum (5 buckets); 0 where nothing matched."""
    if gate == "length":
        return buckets
    c = cnt[:, :4].astype(np.float64)
    total = c.sum(1)
    share = np.digitize(np.where(total > 0, c[:, 0] / np.maximum(total, 1), 0), [0.3, 0.5, 0.8, 0.999])
    counts = np.digitize(total, [2, 4, 16, 64])
    return np.where(buckets > 0, buckets * 100 + share * 10 + counts, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path)
    ap.add_argument("run", type=Path, help="run folder or checkpoint")
    ap.add_argument("index", type=Path)
    ap.add_argument("--max-tokens", type=int, default=400_000, help="validation tokens scored (from the start)")
    ap.add_argument("--gate", choices=["length", "length-share-count"], default="length",
                    help="what the mixture's weight may depend on")
    ap.add_argument("--out", type=Path, default=None, help="JSON with every number (default: print only)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    folder = TokenFolder(args.tokens)
    tokens = np.concatenate([s.tokens for s in folder.shards("val")])[: args.max_tokens].astype(np.int64)
    index = Index(args.index)
    vocab = index.vocab_size
    nats = model_nats(args.run, tokens)
    lookups = [index.lookup(tokens, None, max_len=cap, topk=16) for cap in CAPS]
    j = np.arange(1, len(tokens))  # targets; the lookup at j - 1 predicts token j
    y = tokens[j]
    lens, nxt, cnt = (a[j - 1] for a in lookups[0])
    pm = np.exp(-nats[j])
    buckets = bucket_of(lens)
    dists = {"top4": p_top(cnt, nxt, y, 4, vocab), "top16": p_top(cnt, nxt, y, 16, vocab),
             "backoff": p_backoff([tuple(a[j - 1] for a in lk) for lk in lookups], y, vocab)}
    half = len(y) // 2
    base = float(-np.log(pm[half:]).mean())
    result = {"tokens": int(len(y)), "scored": int(len(y) - half), "gate": args.gate, "model_ppl": math.exp(base),
              "mixtures": {}}
    print(f"{len(y) - half:,} scored targets; model alone: ppl {math.exp(base):.3f}")
    labels = bucket_labels()
    share = {labels[b]: float((buckets[half:] == b).mean()) for b in range(NUM_BUCKETS)}
    cells = gate_cells(buckets, cnt, args.gate)
    for name, pi in dists.items():
        loss, weight = fit_and_score(pm, pi, cells, half)
        by_bucket = {}
        for b in range(1, NUM_BUCKETS):
            sel = half + np.flatnonzero(buckets[half:] == b)
            if len(sel):
                w = weight[sel]
                by_bucket[labels[b]] = {"model_nats": float(-np.log(pm[sel]).mean()),
                                        "mixed_nats": float(-np.log((1 - w) * pm[sel] + w * pi[sel]).mean()),
                                        "mean_weight": float(w.mean())}
        result["mixtures"][name] = {"ppl": math.exp(loss), "ppl_reduction": 1 - math.exp(loss - base),
                                    "buckets": by_bucket}
        print(f"{name:8s} ppl {math.exp(loss):.3f} ({100 * (1 - math.exp(loss - base)):.1f}% lower); mean weight "
              + ", ".join(f"{k}: {v['mean_weight']:.2f}" for k, v in by_bucket.items()))
    result["bucket_share"] = share
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), **result}, indent=1) + "\n")
        print(f"-> {args.out}")


if __name__ == "__main__":
    main()
