"""Benchmark: greedy generation with drafts from the token index against plain decoding (docs/bench/infer_draft.json).

    python scripts/bench/draft_speed.py CKPT TOKENS INDEX [--prompts 24] [--prompt-tokens 64] [--new-tokens 128]
        [--draft-tokens 4 8 16] [--min-match 2 4 8] [--dominance 1 4] [--rounds 3] [--device cpu] [--out docs/bench]

Prompts: the first --prompt-tokens tokens of the first --prompts validation documents of TOKENS
long enough to hold them (an index holds training documents only, so no prompt's document is in
INDEX). Each prompt is continued greedily for --new-tokens tokens (fewer where the model's
context ends), once plainly and once per (draft tokens, min match, dominance) with drafts from INDEX
(`tscale infer --draft-index`), in --rounds interleaved rounds; the median round counts. Every
drafted continuation is compared with the plain one: greedy drafting must not change a token.
An untimed round first warms every engine (the index builds its token-pair table on its first
lookup; a GPU picks its kernels for each pass width). Reported per setting: tokens/s (the prompt's forward pass included), forward passes per token,
the share of draft tokens kept, and the speed-up over plain decoding in the same run.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402

from tscale.data.shards import TokenFolder  # noqa: E402
from tscale.devices import resolve_device  # noqa: E402
from tscale.index import Index  # noqa: E402
from tscale.infer import Engine, SamplingParams  # noqa: E402
from tscale.infer.draft import DraftStats, IndexDrafter  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PART_KEYS = ("plain_", "draft_", "tokens_generated", "prompts")  # this part's metrics: a re-run replaces them all


def val_prompts(tokens: Path, count: int, length: int, eos: int) -> list[list[int]]:
    """The first `length` tokens of the first `count` validation documents holding more than that many (no eos)."""
    out = []
    for shard in TokenFolder(tokens).shards("val"):
        ends = [*shard.docs[1:, 0].tolist(), len(shard.tokens)]
        for start, end in zip(shard.docs[:, 0].tolist(), ends):
            ids = shard.tokens[start:end].astype("int64").tolist()
            if len(ids) > length + 1 and eos not in ids[:length]:
                out.append(ids[:length])
                if len(out) == count:
                    return out
    if not out:
        sys.exit(f"{tokens}: no validation document longer than --prompt-tokens {length}")
    return out


def run(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]], DraftStats]:
    """Seconds, continuations and summed draft statistics of greedy generation from every prompt."""
    stats, outs = DraftStats(), []
    t0 = time.perf_counter()
    for ids in prompts:
        outs.append(list(engine.token_stream(ids, new_tokens, GREEDY, None, stats)))
    return time.perf_counter() - t0, outs, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path, help="checkpoint or run folder")
    ap.add_argument("tokens", type=Path, help="token folder of the model's tokenizer (its val split gives the prompts)")
    ap.add_argument("index", type=Path, help="index of the model's tokenizer to draft from")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--min-match", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--dominance", type=float, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    torch.manual_seed(0)
    device = resolve_device(args.device, "--device")
    plain = Engine.from_checkpoint(args.ckpt, device)
    index = Index(args.index)
    prompts = val_prompts(args.tokens, args.prompts, args.prompt_tokens, plain.eos)
    settings = [(t, m, r) for t in args.draft_tokens for m in args.min_match for r in args.dominance]
    engines = {s: Engine(plain.model, plain.tokenizer, device, drafter=IndexDrafter(index, *s)) for s in settings}
    for eng in (plain, *engines.values()):  # an untimed round: the index's pair table, the GPU's kernels for each width
        run(eng, prompts, args.new_tokens)
    times: dict = {"plain": [], **{s: [] for s in settings}}
    stats: dict = {}
    reference = None
    for r in range(args.rounds):
        seconds, outs, _ = run(plain, prompts, args.new_tokens)
        times["plain"].append(seconds)
        reference = outs
        for s, eng in engines.items():
            seconds, outs, st = run(eng, prompts, args.new_tokens)
            times[s].append(seconds)
            changed = sum(a != b for a, b in zip(outs, reference))
            stats[s] = (st, changed)
        print(f"round {r + 1}/{args.rounds}: plain {times['plain'][-1]:.1f} s", flush=True)
    generated = sum(len(o) for o in reference)
    plain_rate = generated / statistics.median(times["plain"])
    metrics = {"plain_tokens_per_s": round(plain_rate, 1), "tokens_generated": generated, "prompts": len(prompts)}
    print(f"plain: {plain_rate:,.1f} tokens/s ({generated} tokens from {len(prompts)} prompts)")
    for (t, m, r), (st, changed) in stats.items():
        rate = generated / statistics.median(times[(t, m, r)])
        key = f"t{t}_m{m}_r{r:g}"
        metrics.update({f"draft_tokens_per_s_{key}": round(rate, 1), f"draft_speedup_{key}": round(rate / plain_rate, 3),
                        f"draft_passes_per_token_{key}": round(st.passes / generated, 3),
                        f"draft_kept_share_{key}": round(st.accepted / st.drafted, 3) if st.drafted else 0.0,
                        f"draft_changed_continuations_{key}": changed})
        print(f"draft {t:>2} tokens, min match {m}, dominance {r:g}: {rate:,.1f} tokens/s ({rate / plain_rate:.2f}x), "
              f"{st.passes / generated:.2f} passes/token, {st.accepted}/{st.drafted} draft tokens kept, "
              f"{changed} continuations changed", flush=True)
    cfg = plain.model.cfg
    notes = (f"draft speed (draft_speed.py): {cfg.arch} {cfg.n_layer}x{cfg.d_model}, vocabulary {cfg.vocab_size}, "
             f"context {cfg.seq_len}, checkpoint {args.ckpt}; drafts from {args.index} "
             f"({index.manifest['num_tokens']:,} tokens); {len(prompts)} prompts of {args.prompt_tokens} tokens from the "
             f"validation documents of {args.tokens}, greedy, {args.new_tokens} new tokens each, device {device}, "
             f"median of {args.rounds} interleaved rounds.")
    print(f"-> {merge_metrics('infer_draft', metrics, notes, args.out, drop_prefixes=PART_KEYS)}")


if __name__ == "__main__":
    main()
