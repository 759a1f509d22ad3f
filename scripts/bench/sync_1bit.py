"""1-bit Adam against uncompressed DDP over a 1 Gbit/s link: step time (2 and 4 hosts) and validation loss.

    python scripts/bench/sync_1bit.py --tokens TOKENS [--worlds 2 4] [--quality-steps 300] [--out-dir docs/bench]

Speed: each "host" is a network namespace with a veth to a bridge, capped at 1 Gbit/s by a tbf
qdisc on both ends (scripts/bench/netns_1gbit.sh, needs root); one `tscale train` process per
host, Gloo over 10.77.0.x. The step time of a run is the median of its per-step times from
metrics.jsonl (log_every 1, no evaluation, no checkpoints), after the fp32 warm-up for 1-bit
runs. Quality: the same model and batch, 2 processes on loopback (the loss does not depend on
the link), `--quality-steps` steps uncompressed and with 1-bit Adam (fp32 for the first
`--quality-warmup` of them, 30% by default), validation loss at the last step. All processes share this machine's cores, so compute is
small on purpose (a short sequence, batch 1) and the numbers vary with the load: the script
prints the load average and repeats the speed runs `--repeats` times. Each process's intra-op
pool gets half of its emulated host's cores (`--threads`): with all of them, Gloo's threads and
the exchange's callbacks had no core left, and 4 processes on 16 cores took 0.84 s a 1-bit step
instead of 0.34 s (docs/BENCHMARKS.md).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_record  # noqa: E402

NETNS = REPO / "scripts" / "bench" / "netns_1gbit.sh"
MODEL = ['model.arch="gpt2"', "model.n_layer=9", "model.d_model=640", "model.n_head=10", "model.seq_len=64",
         "train.batch_size=1", "optim.lr=6e-4", "optim.warmup_steps=20", "train.ckpt_every=0",
         'train.device="cpu"']
ONEBIT = ['dist.compression="onebit"', 'dist.onebit_what="momentum"', "dist.chunk=2048"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, tokens: Path, out: Path, overrides: list[str], netns: bool, threads: int,
           dtype: str) -> list[dict]:
    """One `tscale train` per rank (in namespaces ts1b-h<rank> when `netns`); rank 0's metrics records.

    `dtype` is the compute precision (CPU autocast); weights, gradients and the exchange are float32.
    """
    port = free_port() if not netns else 29577
    sets = [a for s in [*MODEL, f'train.dtype="{dtype}"', *overrides] for a in ("--set", s)]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
               "MASTER_ADDR": "10.77.0.1" if netns else "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": str(threads), "GLOO_SOCKET_IFNAME": "eth0" if netns else "lo"}
        cmd = [sys.executable, "-m", "tscale", "train", "--tokens", str(tokens), "-o", str(out), "--quiet", *sets]
        if netns:
            cmd = [str(NETNS), "exec", str(rank), *cmd]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a rank failed:\n" + "\n".join(e[-2000:] for e in errors if e))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def step_times(records: list[dict], skip: int) -> list[float]:
    """Seconds per step for the steps after `skip`, from consecutive elapsed_s (log_every 1)."""
    steps = [(r["step"], r["elapsed_s"]) for r in records if "elapsed_s" in r]
    return [t1 - t0 for (s0, t0), (s1, t1) in zip(steps, steps[1:]) if s0 >= skip]


def load() -> float:
    return os.getloadavg()[0]


def speed(args, world: int, work: Path) -> dict:
    subprocess.run([str(NETNS), "up", str(world), "1gbit"], check=True)
    try:
        threads = args.threads or max(1, (os.cpu_count() or 1) // world // 2)
        out = {"none": [], "onebit": []}
        for rep in range(args.repeats):
            for mode in ("none", "onebit"):
                run = work / f"speed-w{world}-{mode}-{rep}"
                before = load()
                if mode == "none":
                    recs = launch(world, args.tokens, run, [f"train.steps={args.speed_steps_fp32}", "train.log_every=1",
                                                            "train.eval_every=0"], True, threads, args.dtype)
                    times = step_times(recs, 2)
                else:
                    warm = 3
                    recs = launch(world, args.tokens, run, [*ONEBIT, f"dist.onebit_warmup_steps={warm}",
                                                            f"train.steps={args.speed_steps_1bit}", "train.log_every=1",
                                                            "train.eval_every=0"], True, threads, args.dtype)
                    times = step_times(recs, warm + 2)
                comm = [r for r in recs if "comm_bytes" in r][-1]
                med = statistics.median(times)
                out[mode].append({"threads": threads, "median_s": med, "min_s": min(times), "max_s": max(times),
                                  "n": len(times), "load_before": before, "load_after": load(),
                                  "bytes_ratio": comm["comm_bytes"] / comm["comm_bytes_fp32"]})
                print(f"world {world} {mode} rep {rep}: median step {med:.3f} s (min {min(times):.3f}, "
                      f"max {max(times):.3f}, n {len(times)}), load {before:.1f}->{load():.1f}", flush=True)
        return out
    finally:
        subprocess.run([str(NETNS), "down"], check=False)


def quality(args, work: Path) -> dict:
    warm = round(args.quality_steps * args.quality_warmup)
    common = [f"train.steps={args.quality_steps}", "train.log_every=10", f"train.eval_every={args.quality_steps}",
              f"train.eval_batches={args.eval_batches}"]
    out = {}
    for mode, extra in (("none", []), ("onebit", [*ONEBIT, f"dist.onebit_warmup_steps={warm}"])):
        t = time.time()
        recs = launch(2, args.tokens, work / f"quality-{mode}", [*common, *extra], False, max(1, (os.cpu_count() or 1) // 2),
                      args.dtype)
        out[mode] = {"val_loss": [r["val_loss"] for r in recs if "val_loss" in r][-1],
                     "final_train_loss": [r["loss"] for r in recs if "loss" in r][-1], "wall_s": time.time() - t}
        if mode == "onebit":
            comm = [r for r in recs if "comm_bytes" in r]
            out[mode]["bytes_ratio_compressed"] = comm[-1]["comm_bytes"] / comm[-1]["comm_bytes_fp32"]
            out[mode]["bytes_ratio_run"] = sum(r["comm_bytes"] for r in comm) / sum(r["comm_bytes_fp32"] for r in comm)
        print(f"quality {mode}: {out[mode]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=Path, required=True, help="token folder (mix.jsonl.xz, BPE 8192)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--speed-steps-fp32", type=int, default=12)
    ap.add_argument("--speed-steps-1bit", type=int, default=25)
    ap.add_argument("--quality-steps", type=int, default=300)
    ap.add_argument("--quality-warmup", type=float, default=0.3, help="share of the quality run before compression")
    ap.add_argument("--eval-batches", type=int, default=200)
    ap.add_argument("--threads", type=int, help="intra-op threads per process (default: half of each emulated host's "
                    "cores, cores / world / 2; the other half runs Gloo and the exchange's callbacks)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="compute precision (CPU autocast) of every run; the exchanged values are float32 either way")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--speed-from", type=Path, help="take the speed results from an earlier --raw file")
    ap.add_argument("--out-dir", type=Path, default=REPO / "docs" / "bench")
    ap.add_argument("--raw", type=Path, help="also write the raw results here (JSON)")
    args = ap.parse_args()
    import torch

    from tscale.config import load_config
    from tscale.model import build_model

    cfg = load_config(None, [*MODEL, "model.vocab_size=8192"])
    n_params = sum(p.numel() for p in build_model(cfg.model).parameters())
    print(f"model: {n_params:,} parameters; load average {load():.2f}; torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sync1bit-") as tmp:
        work = Path(tmp)
        if args.speed_from:
            earlier = json.loads(args.speed_from.read_text())["speed"]
            runs = {int(w): r for w, r in earlier.items()}
            args.worlds = sorted(runs)
        else:
            runs = {w: speed(args, w, work) for w in args.worlds}
        results = {"params": n_params, "speed": runs}
        if not args.skip_quality:
            results["quality"] = quality(args, work)
    if args.raw:
        args.raw.write_text(json.dumps(results, indent=1))
    if args.speed_from:
        print("speed results from", args.speed_from)
    metrics = {"params": n_params}
    for w in args.worlds:
        none = statistics.median(r["median_s"] for r in results["speed"][w]["none"])
        onebit = statistics.median(r["median_s"] for r in results["speed"][w]["onebit"])
        metrics[f"step_s_fp32_1gbit_{w}proc"] = none
        metrics[f"step_s_1bit_1gbit_{w}proc"] = onebit
        metrics[f"step_speedup_1gbit_{w}proc"] = none / onebit
        metrics["bytes_ratio_vs_fp32"] = results["speed"][w]["onebit"][0]["bytes_ratio"]
    if "quality" in results:
        q = results["quality"]
        metrics["val_loss_fp32"] = q["none"]["val_loss"]
        metrics["val_loss_1bit"] = q["onebit"]["val_loss"]
        metrics["val_loss_rel_diff"] = (q["onebit"]["val_loss"] - q["none"]["val_loss"]) / q["none"]["val_loss"]
        metrics["bytes_ratio_whole_run_with_warmup"] = q["onebit"]["bytes_ratio_run"]
    notes = (f"{n_params:,}-parameter gpt2 (9 x 640, vocab 8192, seq 64, batch 1 per process), CPU, {args.dtype} "
             f"compute, float32 weights and exchange, Gloo, {os.cpu_count()} cores; "
             f"speed: one process per network namespace, veths capped at 1 Gbit/s (tbf), "
             f"{results['speed'][args.worlds[-1]]['none'][0].get('threads', '?')} intra-op threads per process at "
             f"{args.worlds[-1]} processes, median step time, "
             f"{len(results['speed'][args.worlds[0]]['none'])} repeats (spread in docs/BENCHMARKS.md); quality: 2 processes on loopback, "
             f"{args.quality_steps} steps, 1-bit after {round(args.quality_steps * args.quality_warmup)} fp32 steps")
    print(json.dumps(metrics, indent=1))
    print(write_record("sync_1bit", metrics, notes, args.out_dir))


if __name__ == "__main__":
    main()
