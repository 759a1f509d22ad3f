"""Training tokens/s of the tscale architecture against gpt2 at 124M, per torch.compile mode.

    python scripts/bench/arch_speed.py TOKENS [--modes default reduce-overhead] [--steps 30] [--warmup 10]
                                       [--attention fa2 fa2_global cudnn cudnn_global] [--fused-loss]
                                       [--logits-loss] [--sdpa-baseline] [--also PRESET ...]
                                       [--rounds 1] [--seq-len 1024] [--out-dir docs/bench]

Both presets (configs/gpt2-124m.toml: AdamW, SDPA; configs/tscale-124m.toml: Muon + AdamW,
the fused attention kernel with its windows, document masks and sink) run the real loop
(`tscale.train.loop.train_run`) on the same token folder, the same batch (32 x 1024) and bf16
autocast, one after the other in this process; the rate is the harmonic mean of the rates
logged after the warm-up steps (compile included in those). TOKENS should be real text
tokenized with the GPT-2 BPE (the document boundaries decide which attention tiles the tscale
kernel skips), e.g. the benchmark corpus of DESIGN.md.

--attention ALT... adds tscale with `train.attention = "ALT"` for each ALT (fa2: torch's
FlashAttention-2 over the batch's document runs; cudnn: cuDNN's attention over them, Hopper and
newer; "_global": in the global layers only) as a preset "tscale_ALT" (--fa2 and --fa2-global
are short for --attention fa2 / fa2_global); --fused-loss tscale with `train.fused_loss = true`
(the head's loss in chunks, tscale/ops/fused_loss.py) as "tscale_fused_loss". The presets take the loss
their config gives a GPU step: since train.loss_kernel became the default, the loss and its gradient in one
pass (tscale/ops/head_loss.py); --logits-loss adds both with `train.loss_kernel = false` (the logits path) as
"gpt2_logits_loss" and "tscale_logits_loss", each before its plain preset. --sdpa-baseline adds
"tscale_sdpa", the baseline of the attention-cost target: the tscale model with every layer global,
no document mask and no sink, its attention torch's causal SDPA (TSCALE_ATTENTION=sdpa). --also
tscale_cudnn_bucket64 adds cuDNN with the batch's run count padded to a multiple of 64
(TSCALE_RUN_BUCKET=64), tscale.ops.doc_runs' earlier bucket, against the default of 8; --also
tscale_eager_step / tscale_cudnn_eager_step add tscale (with cuDNN) with `optim.compile_step = false` (Muon's
eager update; on a GPU the default compiles it); tscale_nosink / tscale_cudnn_nosink with `model.sink = false`
(no null slot, so none of its gating passes); tscale_qkv / tscale_cudnn_qkv with `train.qkv_kernel = true` (the
fused attention-input kernel); tscale_g6 / tscale_cudnn_g6 with `model.global_every = 6` (2 global layers of 12
instead of 3); tscale_cudnn_g12 with one global layer, tscale_cudnn_w64_g12 with it and windows of 64 tokens.
--seq-len T
trains both presets on windows of T tokens (model.seq_len; gpt2's position table grows with it) with
--batch-size scaled by 1024 / T, so that every step holds the same tokens; its metrics end in _T<T>.
--rounds N runs every preset N times, the order reversed every other round (the GPU's clock drifts over
a process), and records the mean.

Merges into docs/bench/architecture.json (part "arch speed", or "arch speed at T <T>" for other lengths):
arch_speed_tokens_per_s_<arch>_<mode>, arch_speed_peak_gib_<arch>_<mode> (peak GPU memory allocated by the
run) and arch_speed_ratio_<mode> = tscale / gpt2 (with --attention ALT also arch_speed_ratio_ALT_<mode>, with
--fused-loss arch_speed_ratio_fused_loss_<mode>). The headline `throughput_ratio` stays the one of the
convergence runs (docs/architecture.md); this measures the same ratio without a training run
around it, so that a change of the step (the optimizer, CUDA graphs) can be timed alone.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics, round_orders  # noqa: E402
from lowprec_train import harmonic_rate  # noqa: E402

import torch  # noqa: E402

from tscale.config import load_config  # noqa: E402
from tscale.train.loop import train_run  # noqa: E402

ALTERNATIVES = ("fa2", "fa2_global", "cudnn", "cudnn_global")  # train.attention's choices besides "auto"
CUDNN = 'train.attention="cudnn"'


@dataclasses.dataclass(frozen=True)
class Preset:
    """A benchmarked setup: its config file, overrides and environment; `also`: chosen with --also; `always`: in
    every run (the two the ratios compare), where every other preset runs only when a flag chooses it."""

    overrides: tuple[str, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    also: bool = False
    config: str = "configs/tscale-124m.toml"
    always: bool = False


GPT2 = "configs/gpt2-124m.toml"
PRESETS = {  # in the order they run
    "gpt2_logits_loss": Preset(("train.loss_kernel=false",), config=GPT2),
    "gpt2": Preset(config=GPT2, always=True),
    "tscale_logits_loss": Preset(("train.loss_kernel=false",)),
    "tscale": Preset(always=True),
    **{f"tscale_{alt}": Preset((f'train.attention="{alt}"',)) for alt in ALTERNATIVES},
    "tscale_fused_loss": Preset(("train.fused_loss=true",)),
    "tscale_sdpa": Preset(("model.window=0", "model.doc_mask=false", "model.sink=false"),
                          {"TSCALE_ATTENTION": "sdpa"}),
    # run counts padded to 64, tscale.ops.doc_runs' earlier bucket
    "tscale_cudnn_bucket64": Preset((CUDNN,), {"TSCALE_RUN_BUCKET": "64"}, also=True),
    "tscale_eager_step": Preset(("optim.compile_step=false",), also=True),
    "tscale_cudnn_eager_step": Preset((CUDNN, "optim.compile_step=false"), also=True),
    "tscale_nosink": Preset(("model.sink=false",), also=True),
    "tscale_cudnn_nosink": Preset((CUDNN, "model.sink=false"), also=True),
    "tscale_qkv": Preset(("train.qkv_kernel=true",), also=True),
    "tscale_cudnn_qkv": Preset((CUDNN, "train.qkv_kernel=true"), also=True),
    "tscale_g6": Preset(("model.global_every=6",), also=True),
    "tscale_cudnn_g6": Preset((CUDNN, "model.global_every=6"), also=True),
    # one global layer of 12, and windows of 64: what the 0.25 attention target at T 4096 would take (docs/architecture.md)
    "tscale_cudnn_g12": Preset((CUDNN, "model.global_every=12"), also=True),
    "tscale_cudnn_w64_g12": Preset((CUDNN, "model.window=64", "model.global_every=12"), also=True),
}
ALSO = tuple(name for name, preset in PRESETS.items() if preset.also)  # --also's presets


def chosen_alternatives(args: argparse.Namespace) -> set[str]:
    """train.attention's choices the flags ask for (--attention, --fa2, --fa2-global)."""
    return {*args.attention, *(["fa2"] if args.fa2 else []), *(["fa2_global"] if args.fa2_global else [])}


def selected_presets(args: argparse.Namespace) -> list[str]:
    """The presets to run, in PRESETS' order: those always run, and those the flags choose."""
    chosen = {f"tscale_{alt}" for alt in chosen_alternatives(args)} | set(args.also)
    if args.fused_loss:
        chosen.add("tscale_fused_loss")
    if args.logits_loss:
        chosen |= {"gpt2_logits_loss", "tscale_logits_loss"}
    if args.sdpa_baseline:
        chosen.add("tscale_sdpa")
    return [name for name, preset in PRESETS.items() if preset.always or name in chosen]


def preset_config(name: str, overrides: list[str]):
    """The preset's config with its overrides, then `overrides`."""
    preset = PRESETS[name]
    return load_config(REPO / preset.config, [*preset.overrides, *overrides])


@contextlib.contextmanager
def preset_env(arch: str):
    """The preset's environment while it runs, the previous one restored after."""
    env = PRESETS[arch].env
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def rate(arch: str, tokens: Path, mode: str, steps: int, warmup: int, batch: int,
         seq_len: int) -> tuple[float, float]:
    """(tokens/s after `warmup` steps, peak GiB of GPU memory allocated) of one preset in one compile mode."""
    torch.cuda.reset_peak_memory_stats()
    cfg = preset_config(arch, [f"model.seq_len={seq_len}",
        f"train.steps={warmup + steps}", f"train.batch_size={batch}", "train.grad_accum=1", "train.eval_every=0",
        "train.ckpt_every=0", "train.log_every=5", "train.compile=true", f'train.compile_mode="{mode}"',
        f'data.tokens="{tokens.resolve()}"'])
    with tempfile.TemporaryDirectory() as tmp, preset_env(arch):
        train_run(cfg, Path(tmp) / "run", quiet=True)
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    return harmonic_rate(records, warmup), torch.cuda.max_memory_allocated() / 2**30


def speed_note(args: argparse.Namespace, batch: int) -> str:
    """The record's paragraph for this run: one part per window length, so runs at 1024 and 4096 keep both."""
    part = ("arch speed (arch_speed.py)" if args.seq_len == 1024
            else f"arch speed at T {args.seq_len} (arch_speed.py --seq-len {args.seq_len})")
    chosen = chosen_alternatives(args)
    return (f"{part}: configs/gpt2-124m.toml and configs/tscale-124m.toml"
            f"{''.join(f' (also with train.attention = {alt})' for alt in ALTERNATIVES if alt in chosen)}"
            f"{' (also with train.fused_loss = true)' if args.fused_loss else ''}"
            f"{' (both also with train.loss_kernel = false)' if args.logits_loss else ''}"
            f"{' (also tscale_sdpa: every layer global, no document mask or sink, causal SDPA)' if args.sdpa_baseline else ''}"
            f"{''.join(f' (also {preset})' for preset in args.also)}"
            f" on {args.tokens.name}, "
            f"batch {batch} x {args.seq_len}, bf16 autocast, torch.compile in modes {', '.join(args.modes)}, "
            f"{args.steps} timed steps after {args.warmup}, one process, one preset after the other"
            f"{f', {args.rounds} rounds (order reversed every other round), the mean recorded' if args.rounds > 1 else ''}")


def build_parser() -> argparse.ArgumentParser:
    """The command line of main."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder (tscale tokenize, GPT-2 BPE)")
    ap.add_argument("--modes", nargs="+", default=["default", "reduce-overhead"],
                    choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=10, help="steps before timing (compile included)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--attention", nargs="+", default=[], choices=ALTERNATIVES,
                    help="also tscale with each of these train.attention choices")
    ap.add_argument("--fa2", action="store_true", help="short for --attention fa2")
    ap.add_argument("--fa2-global", action="store_true", help="short for --attention fa2_global")
    ap.add_argument("--fused-loss", action="store_true", help="also tscale with train.fused_loss = true")
    ap.add_argument("--logits-loss", action="store_true", help="also both presets with train.loss_kernel = false")
    ap.add_argument("--sdpa-baseline", action="store_true",
                    help="also tscale_sdpa: every layer global, no document mask or sink, causal SDPA")
    ap.add_argument("--also", nargs="+", default=[], choices=ALSO,
                    help="also these presets (tscale_cudnn_bucket64: cuDNN with run counts padded to 64; "
                         "*eager_step: with optim.compile_step = false; *nosink: with model.sink = false; *qkv: with "
                         "train.qkv_kernel = true; *_g6 / *_g12: 2 / 1 global layers of 12; *_w64: windows of 64)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every preset this many times, the order reversed every other round; record the mean")
    ap.add_argument("--seq-len", type=int, default=1024,
                    help="tokens per window; the batch shrinks by the same factor (--batch-size is for 1024)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("arch_speed.py: needs a CUDA GPU (it times the compiled GPU step)")
    if not (args.tokens / "manifest.json").is_file():
        raise SystemExit(f"{args.tokens}: not a token folder (no manifest.json); make one with `tscale tokenize`")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: must be at least 1")
    if args.seq_len < 64 or (args.batch_size * 1024) % args.seq_len:
        raise SystemExit(f"--seq-len {args.seq_len}: must be at least 64 and divide --batch-size x 1024 "
                         f"({args.batch_size * 1024} tokens a step)")
    batch = args.batch_size * 1024 // args.seq_len
    suffix = "" if args.seq_len == 1024 else f"_T{args.seq_len}"
    metrics = {}
    archs = selected_presets(args)
    for mode in args.modes:
        key = mode.replace("-", "_") + suffix
        runs: dict[str, list[float]] = {arch: [] for arch in archs}
        for order in round_orders(archs, args.rounds):
            for arch in order:
                tokens_per_s, peak = rate(arch, args.tokens, mode, args.steps, args.warmup, batch, args.seq_len)
                runs[arch].append(tokens_per_s)
                print(f"{arch} ({mode}): {tokens_per_s:,.0f} tokens/s, peak {peak:.2f} GiB", flush=True)
                metrics[f"arch_speed_peak_gib_{arch}_{key}"] = round(peak, 2)
                torch.cuda.empty_cache()
        rates = {arch: sum(r) / len(r) for arch, r in runs.items()}  # the mean over rounds
        for arch in archs:
            metrics[f"arch_speed_tokens_per_s_{arch}_{key}"] = round(rates[arch])
        metrics[f"arch_speed_ratio_{key}"] = round(rates["tscale"] / rates["gpt2"], 4)
        for arch in archs:
            if arch.startswith("tscale_"):
                variant = arch.removeprefix("tscale_")
                baseline = "gpt2_logits_loss" if variant == "logits_loss" else "gpt2"  # the same loss on both sides
                metrics[f"arch_speed_ratio_{variant}_{key}"] = round(rates[arch] / rates[baseline], 4)
        if args.logits_loss:
            for arch in ("gpt2", "tscale"):
                gain = rates[arch] / rates[f"{arch}_logits_loss"]
                metrics[f"arch_speed_loss_kernel_gain_{arch}_{key}"] = round(gain, 4)
        print(f"tscale / gpt2 ({mode}): {metrics[f'arch_speed_ratio_{key}']:.3f}", flush=True)
    note = speed_note(args, batch)
    print(f"-> {merge_metrics('architecture', metrics, note, args.out_dir)}")


if __name__ == "__main__":
    main()
