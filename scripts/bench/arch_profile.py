"""Where a training step's GPU time goes, gpt2 against tscale at 124M: kernels per step and the optimizer alone.

    python scripts/bench/arch_profile.py TOKENS [--archs gpt2 tscale] [--warmup 8] [--active 3] [--top 25]
                                         [--seq-len 1024] [--rounds 1] [--products] [--out PATH]

For each preset of arch_speed.py: the real loop (`tscale.train.loop.train_run`, torch.compile in
default mode, so that every kernel is visible to the profiler; CUDA graphs would hide them) runs
`warmup` steps, then torch.profiler records `active` steps. Printed per preset: the GPU time per
step of every kernel, summed over the step (the step's busy time), the `top` kernels by their time
per step, and the same time grouped into matrix products, attention, the optimizer's kernels and
the rest. The optimizer is also timed alone: the model's parameters given random gradients, its
step() timed with CUDA events, so that Muon's Newton-Schulz iterations can be set against AdamW.
--rounds N profiles every preset N times, in the given order and reversed by turns (the GPU's clock drifts
over a process: the first preset ran 8-12% faster), and reports the mean with each round's attention time.
--products also times every matrix product by its operand shapes and strides (aten::mm, addmm, bmm, baddbmm:
calls, GPU ms and TFLOP/s per step), so that two presets' products of one shape can be set side by side.
Writes the tables as JSON to --out (the default: docs/bench/arch_profile.json).

The attention-cost target measured inside the real step: `--archs tscale tscale_sdpa` profiles the
tscale model as configured and the same model with every layer global, no document mask and no
sink, its attention torch's causal SDPA (arch_speed.py's tscale_sdpa preset), and reports
attention_in_step_ratio = the first's attention kernels / the second's (every kernel of either
attention path, its small pre- and post-passes included), with --seq-len for T 4096; every other tscale
preset profiled beside tscale_sdpa gets its own, attention_in_step_ratio_<variant> (e.g. _cudnn). Unlike
scripts/bench/attention_cost.py, which times the recorded calls on their own, this counts only GPU
time and only what the training step itself launches.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arch_speed import PRESETS, preset_config, preset_env  # noqa: E402
from common import REPO, round_orders  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402

from tscale.fileio import write_json_atomic  # noqa: E402
from tscale.model import build_model  # noqa: E402
from tscale.optim import build_optimizer  # noqa: E402
from tscale.train.loop import train_run  # noqa: E402

# substrings of kernel names, by group; the first group that matches wins
GROUPS = {
    "attention": ("attention", "flash", "fmha", "attn", "sdpa", "dot_do_o", "convert_dq", "doc_stats"),
    "matmul": ("gemm", "xmma", "nvjet", "cutlass", "sm90_", "sm80_", "wgmma", "ampere_", "cublas"),
}


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS.items() if any(k in low for k in keys)), "other")


def loop_kernel_ms(cfg, warmup: int, active: int, cuda: bool = True,
                   products: dict | None = None) -> dict[str, float]:
    """Milliseconds per step of every CUDA kernel (cuda=False: CPU operator, self time) over `active` steps of the
    real loop profiled after `warmup` (cfg.train.steps must be at least warmup + active).
    products: a dict to fill with product_table's rows (shapes are recorded then)."""
    activities = [ProfilerActivity.CUDA] if cuda else []
    if not cuda or products is not None:
        activities.append(ProfilerActivity.CPU)
    prof = profile(activities=activities, record_shapes=products is not None,
                   schedule=schedule(wait=warmup - 1, warmup=1, active=active, repeat=1))
    with tempfile.TemporaryDirectory() as tmp, prof:
        train_run(cfg, Path(tmp) / "run", quiet=True, on_step=lambda step, model: prof.step())
    device = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    times: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        spans = is_annotation(event.key, event) if cuda else event.key.startswith("ProfilerStep")
        if event.device_type == device and us > 0 and not spans:
            times[event.key] = times.get(event.key, 0.0) + us / 1e3 / active
    if products is not None:
        products.update(product_table(prof.events(), active, kineto_strides(prof)))
    return times


def kineto_strides(prof) -> dict[int, list]:
    """Operand strides of the profiled operators by correlation id, for a torch whose FunctionEvent lacks them
    (2.11 keeps them on the profiler's own events only, if at all) -> {} where neither has them."""
    strides = {}
    results = getattr(prof.profiler, "kineto_results", None)
    for event in results.events() if results is not None else []:
        read = getattr(event, "strides", None)
        if read is not None and event.name() in PRODUCT_OPS:
            strides[event.correlation_id()] = read()
    return strides


def is_annotation(key: str, event=None) -> bool:
    """Whether a profiled entry is a span around kernels rather than a kernel: the profiler's steps, and with CPU
    activity recorded, the GPU-side mirrors of record_function ranges (a compiled graph's call, an optimizer's
    step), whose time the kernels inside them already count."""
    return (key.startswith(("ProfilerStep", "## Call CompiledFxGraph", "Optimizer.step#", "Optimizer.zero_grad#"))
            or bool(getattr(event, "is_user_annotation", False)))


PRODUCT_OPS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}


def product_table(events, active: int, strides_by_id: dict | None = None) -> dict[str, list[float]]:
    """Every matrix-product call of the profiled steps grouped by operator, operand shapes and strides (the strides
    decide which operand cuBLAS reads transposed; from strides_by_id, by event id, where the events lack them;
    left out of the key where neither has them) -> {key: [calls per step, GPU ms per step, TFLOP/s]}."""
    rows: dict[str, list[float]] = {}
    for event in events:
        operands = PRODUCT_OPS.get(event.name)
        if operands is None or event.device_type != torch.autograd.DeviceType.CPU:
            continue
        shapes = event.input_shapes
        strides = getattr(event, "structured_input_strides", None) or (strides_by_id or {}).get(event.id) or []
        a, b = (shapes[i] for i in operands)
        flop = 2.0 * a[-2] * a[-1] * b[-1] * (a[0] if len(a) == 3 else 1)
        key = f"{event.name} {[shapes[i] for i in operands]}"
        if len(strides) > max(operands):
            key += f" strides {[list(strides[i]) for i in operands]}"
        row = rows.setdefault(key, [0.0, 0.0, 0.0])
        row[0] += 1 / active
        row[1] += event.device_time_total / 1e3 / active
        row[2] += flop / active
    return {key: [round(calls, 2), round(ms, 4), round(flop / ms / 1e9, 1) if ms else 0.0]
            for key, (calls, ms, flop) in rows.items()}


def kernel_table(arch: str, tokens: Path, warmup: int, active: int, batch: int,
                 seq_len: int = 1024, products: dict | None = None) -> dict[str, float]:
    """GPU milliseconds per step of every kernel name over `active` profiled steps of the real loop
    (products: filled with product_table's rows)."""
    cfg = preset_config(arch, [f"model.seq_len={seq_len}",
        f"train.steps={warmup + active + 1}", f"train.batch_size={batch}", "train.grad_accum=1", "train.eval_every=0",
        "train.ckpt_every=0", "train.log_every=1000", "train.compile=true", 'train.compile_mode="default"',
        f'data.tokens="{tokens.resolve()}"'])
    with preset_env(arch):
        return loop_kernel_ms(cfg, warmup, active, products=products)


def mean_table(tables: list[dict[str, float]]) -> dict[str, float]:
    """Kernel milliseconds per step averaged over rounds (a kernel missing from a round counts 0 there)."""
    names = {name for table in tables for name in table}
    return {name: sum(table.get(name, 0.0) for table in tables) / len(tables) for name in names}


def mean_products(rounds: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """product_table rows averaged over rounds: calls and ms per step, TFLOP/s from the mean time."""
    keys = {key for rows in rounds for key in rows}
    mean = {}
    for key in keys:
        calls = sum(rows.get(key, [0, 0, 0])[0] for rows in rounds) / len(rounds)
        ms = sum(rows.get(key, [0, 0, 0])[1] for rows in rounds) / len(rounds)
        flop_per_ms = [rows[key][2] * rows[key][1] for rows in rounds if key in rows]  # TFLOP/s * ms = GFLOP
        tflops = sum(flop_per_ms) / len(rounds) / ms if ms else 0.0
        mean[key] = [round(calls, 2), round(ms, 4), round(tflops, 1)]
    return mean


def optimizer_ms(arch: str, steps: int = 20) -> float:
    """Milliseconds of one optimizer.step() of the preset's model on random gradients (CUDA events)."""
    cfg = preset_config(arch, [])
    cfg.model.vocab_size = 50257
    cfg.model.eos_id = 50256
    model = build_model(cfg.model).cuda()
    opt = build_optimizer(model, cfg.optim, torch.device("cuda"))
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    for _ in range(3):
        opt.step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        opt.step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokens", type=Path, help="token folder (tscale tokenize, GPT-2 BPE)")
    ap.add_argument("--archs", nargs="+", default=["gpt2", "tscale"], choices=list(PRESETS))
    ap.add_argument("--warmup", type=int, default=8, help="steps before profiling (compile included)")
    ap.add_argument("--active", type=int, default=3, help="profiled steps")
    ap.add_argument("--batch-size", type=int, default=32, help="sequences of 1024 tokens a step")
    ap.add_argument("--seq-len", type=int, default=1024,
                    help="tokens per sequence; the batch shrinks by the same factor, so a step keeps its tokens")
    ap.add_argument("--rounds", type=int, default=1,
                    help="profile every preset this many times, the order reversed every other round; report the mean")
    ap.add_argument("--top", type=int, default=25, help="kernels printed per preset")
    ap.add_argument("--products", action="store_true",
                    help="also time every matrix product by its operand shapes and strides (the profiler records "
                         "shapes), the mean over rounds")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "arch_profile.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("arch_profile.py: needs a CUDA GPU")
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: must be at least 1")
    report = {}
    tables: dict[str, list[dict[str, float]]] = {arch: [] for arch in args.archs}
    rounds_attention: dict[str, list[float]] = {arch: [] for arch in args.archs}  # attention ms per step, per round
    products: dict[str, list[dict]] = {arch: [] for arch in args.archs}  # product_table per round
    for r, order in enumerate(round_orders(args.archs, args.rounds)):
        for arch in order:
            rows = {} if args.products else None
            table = kernel_table(arch, args.tokens, args.warmup, args.active, args.batch_size * 1024 // args.seq_len,
                                 args.seq_len, rows)
            tables[arch].append(table)
            if rows is not None:
                products[arch].append(rows)
            torch.cuda.empty_cache()
            attention = sum(ms for name, ms in table.items() if group_of(name) == "attention")
            rounds_attention[arch].append(attention)
            print(f"round {r + 1} {arch}: {sum(table.values()):.2f} ms of kernels, attention {attention:.2f}", flush=True)
    for arch in args.archs:
        times = mean_table(tables[arch])
        groups: dict[str, float] = {}
        for name, ms in times.items():
            groups[group_of(name)] = groups.get(group_of(name), 0.0) + ms
        opt = optimizer_ms(arch)
        torch.cuda.empty_cache()
        busy = sum(times.values())
        print(f"== {arch}: {busy:.2f} ms of kernels per step; optimizer step alone {opt:.2f} ms; "
              + ", ".join(f"{g} {ms:.2f}" for g, ms in sorted(groups.items(), key=lambda kv: -kv[1])), flush=True)
        top = sorted(times.items(), key=lambda kv: -kv[1])[:args.top]
        for name, ms in top:
            print(f"  {ms:8.3f} ms  {group_of(name):9s} {name[:110]}", flush=True)
        report[arch] = {"kernel_ms_per_step": round(busy, 3), "optimizer_step_ms": round(opt, 3),
                        "group_ms_per_step": {g: round(ms, 3) for g, ms in groups.items()},
                        "attention_ms_per_round": [round(ms, 3) for ms in rounds_attention[arch]],
                        "top_kernels_ms_per_step": [[name, round(ms, 4)] for name, ms in top]}
        if products[arch]:
            rows = mean_products(products[arch])
            print(f"  matrix products: {sum(r[1] for r in rows.values()):.2f} ms per step", flush=True)
            for key, (calls, ms, tflops) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
                print(f"  {ms:8.3f} ms  {calls:5.1f} calls  {tflops:6.1f} TFLOP/s  {key}", flush=True)
            report[arch]["products"] = rows
    if "tscale_sdpa" in report:  # the attention-cost target, measured inside the step, for every tscale preset
        sdpa = report["tscale_sdpa"]["group_ms_per_step"].get("attention", 0.0)
        for arch in (a for a in args.archs if a.startswith("tscale") and a != "tscale_sdpa"):
            ours = report[arch]["group_ms_per_step"].get("attention", 0.0)
            key = "attention_in_step_ratio" + ("" if arch == "tscale" else "_" + arch.removeprefix("tscale_"))
            report[key] = round(ours / sdpa, 4) if sdpa else None
            print(f"attention in a training step, T {args.seq_len}: {arch} {ours:.2f} ms, every layer causal SDPA "
                  f"{sdpa:.2f} ms, ratio {report[key]}", flush=True)
    report["seq_len"] = args.seq_len
    write_json_atomic(args.out, report)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
