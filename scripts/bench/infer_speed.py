"""Benchmark: generation speed and weight memory of one checkpoint in each `--precision` mode (docs/bench/lowprec.json).

    python scripts/bench/infer_speed.py CKPT [--prompts 4] [--prompt-tokens 64] [--new-tokens 64] [--rounds 3]
                                        [--device auto] [--label NAME] [--out-dir docs/bench] [--with-head]

Every mode's engine is loaded once (`tscale infer`'s own Engine.from_checkpoint), then each round continues the same
--prompts prompts (seeded random ids) greedily for --new-tokens tokens in every mode, the modes' order turning from
round to round; an untimed round first warms them all. Per mode, the median round's decoding rate (tokens after the
first, over their time) and time to the first token (the prompt's forward pass), and the bytes of the model's
weights and buffers. Merges into docs/bench/lowprec.json (part "generation <label>"): gen_<label>_tokens_per_s_<mode>,
gen_<label>_first_token_ms_<mode>, gen_<label>_weight_mb_<mode> and gen_<label>_speedup_<mode> (decoding rate over
the as-trained one's); with --with-head each low-precision mode again with the head converted (mode+head, suffix _head).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402
from precision_modes import metric_key, modes_to_run, precision_of  # noqa: E402

from tscale.devices import resolve_device  # noqa: E402
from tscale.infer import Engine, SamplingParams  # noqa: E402
from tscale.precision import INFER_MODES  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def model_bytes(engine: Engine) -> int:
    tensors = [*engine.model.parameters(), *engine.model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def timed(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(decoded tokens per second after each first token, mean seconds to the first token) over `prompts`."""
    first, rest, tokens = 0.0, 0.0, 0
    for ids in prompts:
        t0 = time.perf_counter()
        stream = engine.token_stream(ids, new_tokens, GREEDY, None)
        next(stream)
        t1 = time.perf_counter()
        tokens += sum(1 for _ in stream)
        first, rest = first + t1 - t0, rest + time.perf_counter() - t1
    return tokens / rest, first / len(prompts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path, help="checkpoint folder, or a run folder for its newest checkpoint")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=list(INFER_MODES), choices=INFER_MODES)
    ap.add_argument("--with-head", action="store_true",
                    help="also time each low-precision mode with the head converted (--quantize-head): mode+head")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--label", default="ckpt", help="name of this checkpoint and device in the metric names")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    args = ap.parse_args()
    device = resolve_device(args.device)
    modes = modes_to_run(args.modes, args.with_head)
    engines = {}
    for m in modes:
        precision, quantize_head = precision_of(m)
        engines[m] = Engine.from_checkpoint(args.ckpt, device, precision, quantize_head=quantize_head)
    vocab = engines["bf16"].tokenizer.get_vocab_size()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
    for m in modes:  # warm-up: allocations, kernel choices
        timed(engines[m], prompts[:1], 4)
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[r % len(modes):] + modes[:r % len(modes)]:
            runs[m].append(timed(engines[m], prompts, args.new_tokens))
            print(f"round {r + 1} {m:11s} {runs[m][-1][0]:8.1f} tokens/s  first token {1e3 * runs[m][-1][1]:7.1f} ms",
                  flush=True)
    metrics, label = {}, args.label
    base = statistics.median(rate for rate, _ in runs["bf16"])
    for m in modes:
        key = metric_key(m)
        rate = statistics.median(rate for rate, _ in runs[m])
        mib = model_bytes(engines[m]) / 2**20
        metrics[f"gen_{label}_tokens_per_s_{key}"] = round(rate, 2)
        metrics[f"gen_{label}_first_token_ms_{key}"] = round(1e3 * statistics.median(f for _, f in runs[m]), 2)
        metrics[f"gen_{label}_weight_mb_{key}"] = round(mib, 1)
        if m != "bf16":
            metrics[f"gen_{label}_speedup_{key}"] = round(rate / base, 4)
        print(f"{m:11s} {rate:8.1f} tokens/s ({rate / base:.2f}x)  {mib:8.1f} MiB")
    note = (f"generation {label} (infer_speed.py): checkpoint {args.ckpt}, device {device}, {args.prompts} random "
            f"prompts of {args.prompt_tokens} tokens continued greedily for {args.new_tokens} tokens, "
            f"{args.rounds} rounds (the median counts); tokens_per_s = decoding after the first token, first_token_ms = "
            f"the prompt's pass, weight_mb = the model's parameters and buffers, speedup = over bf16 (as trained)")
    print(f"-> {merge_metrics('lowprec', metrics, note, args.out_dir)}")


if __name__ == "__main__":
    main()
