"""Time to the first compiled training step, with every block traced (the default) or one block traced once.

    python scripts/bench/compile_time.py [--archs gpt2 tscale] [--layers 12 24 48] [--d-model 64]
        [--device cpu|cuda] [--compile-mode default] [--out-dir docs/bench]

For each architecture, depth and form (`full`: torch.compile traces the whole step;
`once`: train.compile_block_once, tscale/model/block_region.py) a fresh process builds the
model (seq_len 128, batch 4 on the CPU / 8 x 1024 on a GPU, bf16 autocast on a GPU) and times
its compiled forward + backward of the training loss (train.fused_loss's form): the first call
(tracing, compilation and one step) and the median of the next five. The compile caches are
off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), so every process compiles from nothing, as a first
run does. The loss of the first step must be the same in both forms. Merges the part
"compile (compile_time.py)" into OUT/compile.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, merge_metrics  # noqa: E402


def one_run(arch: str, layers: int, d_model: int, once: bool, device: str, mode: str) -> dict:
    """In this process: {first_s, step_s, loss} of the compiled step of one model."""
    import torch

    from tscale.config import ModelConfig
    from tscale.model import build_model

    torch.manual_seed(0)
    gpu = device == "cuda"
    seq, batch = (1024, 8) if gpu else (128, 4)
    shape = {"head_dim": 64} if arch == "tscale" else {}
    model = build_model(ModelConfig(arch=arch, n_layer=layers, n_head=max(1, d_model // 64), d_model=d_model,
                                    seq_len=seq, vocab_size=50257, eos_id=50256, **shape)).to(device)
    model.compile_block_once = once
    idx = torch.randint(0, 50256, (batch, seq), device=device)  # (B, T)
    step = torch.compile(lambda i: model(i, loss_targets=i), mode=None if mode == "default" else mode)

    def run() -> float:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
            loss = step(idx)
        loss.backward()
        if gpu:
            torch.cuda.synchronize()
        return loss.item()

    t0 = time.perf_counter()
    loss = run()
    first = time.perf_counter() - t0
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"first_s": first, "step_s": statistics.median(times), "loss": loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=["gpt2", "tscale"], choices=["gpt2", "tscale"])
    ap.add_argument("--layers", nargs="+", type=int, default=[12, 24, 48])
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead"])
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    ap.add_argument("--child", nargs=3, metavar=("ARCH", "LAYERS", "FORM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        arch, layers, form = args.child
        print(json.dumps(one_run(arch, int(layers), args.d_model, form == "once", args.device, args.compile_mode)))
        return
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    metrics, rows = {}, []
    for arch in args.archs:
        for layers in args.layers:
            got = {}
            for form in ("full", "once"):
                cmd = [sys.executable, __file__, "--child", arch, str(layers), form, "--d-model", str(args.d_model),
                       "--device", args.device, "--compile-mode", args.compile_mode]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"compile_time: {arch} {layers} layers {form} failed:\n{out.stderr[-3000:]}")
                got[form] = json.loads(out.stdout.strip().splitlines()[-1])
                key = f"{arch}_{layers}_{form}"
                metrics[f"first_step_s_{key}"] = round(got[form]["first_s"], 2)
                metrics[f"step_ms_{key}"] = round(got[form]["step_s"] * 1e3, 2)
            if abs(got["full"]["loss"] - got["once"]["loss"]) > 1e-3 * abs(got["full"]["loss"]):
                sys.exit(f"compile_time: {arch} {layers} layers: first losses differ, {got['full']['loss']} "
                         f"(full) against {got['once']['loss']} (once)")
            ratio = got["full"]["first_s"] / got["once"]["first_s"]
            metrics[f"first_step_speedup_{arch}_{layers}"] = round(ratio, 2)
            rows.append(f"{arch} {layers} layers: first step {got['full']['first_s']:.1f} s (full) / "
                        f"{got['once']['first_s']:.1f} s (once), {ratio:.2f}x; later steps "
                        f"{got['full']['step_s'] * 1e3:.1f} / {got['once']['step_s'] * 1e3:.1f} ms")
            print(rows[-1], flush=True)
    notes = (f"compile (compile_time.py): d_model {args.d_model}, {args.device}, compile mode {args.compile_mode}, "
             f"caches off, a fresh process per run; first_step_s = tracing + compilation + one forward + backward, "
             f"step_ms = the median of the next five; full = the whole step traced, once = "
             f"train.compile_block_once")
    print(merge_metrics("compile", metrics, notes, args.out_dir))


if __name__ == "__main__":
    main()
