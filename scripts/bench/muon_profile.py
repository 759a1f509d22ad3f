"""Where the Muon + AdamW step of the tscale 124M model spends its GPU time: kernels by kind, eager and compiled.

    python scripts/bench/muon_profile.py [--config configs/tscale-124m.toml] [--steps 20] [--out FILE.json]

The preset's model on the GPU with random gradients (as arch_profile.py times the optimizer); for each
variant, step() timed with CUDA events (`steps` calls after 3) and profiled (5 calls): GPU time per step
by kernel, grouped as arch_profile.py groups kernels (matrix products and the rest) with torch's
multi-tensor (_foreach) kernels apart, and the host's time to issue one step. Variants: `eager`
(tscale.optim.muon as it is), `compiled_ns` (its Newton-Schulz iteration through torch.compile, so the
casts and the normalisation around the products fuse) and `compiled_step` (optim.compile_step: the whole
Muon update through torch.compile, momentum, stacking, Newton-Schulz and the parameter update). All start
from the same parameters and gradients; each variant's first update is compared with the eager one and with
the definition (the eager step with its Newton-Schulz products in float32): the largest |difference| over the
largest |update| of any matrix, and the difference's norm over the update's, the largest over the matrices
(--variants picks some).
"""

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arch_profile import group_of  # noqa: E402
from common import REPO, git_commit, gpu_name  # noqa: E402

from tscale.fileio import write_json_atomic  # noqa: E402

import tscale.optim.muon as muon  # noqa: E402
from tscale.config import load_config  # noqa: E402
from tscale.model import build_model  # noqa: E402
from tscale.optim import build_optimizer  # noqa: E402

VARIANTS = ("eager", "compiled_ns", "compiled_step")


def kind_of(name: str) -> str:
    """arch_profile's kernel groups, with torch's multi-tensor (_foreach) kernels as a group of their own."""
    return "foreach" if "multi_tensor_apply" in name else group_of(name)


def setup(config: Path, seed: int = 0, overrides: tuple[str, ...] = ()):
    cfg = load_config(config, ["model.vocab_size=50257", "model.eos_id=50256", *overrides])
    torch.manual_seed(seed)
    model = build_model(cfg.model).cuda()
    opt = build_optimizer(model, cfg.optim, torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, device="cuda", generator=g) * 1e-3
    for group in opt.param_groups:
        group["lr"] = cfg.optim.lr
    return model, opt


def first_update(model, opt) -> list[torch.Tensor]:
    """Take one optimizer step; each parameter's change, as float32."""
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    return [(p.detach() - b).float() for p, b in zip(model.parameters(), before)]


def measure(opt, steps: int) -> dict:
    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = 0.0
    start.record()
    for _ in range(steps):
        t = time.perf_counter()
        opt.step()
        host += time.perf_counter() - t
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) / steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            opt.step()
        torch.cuda.synchronize()
    kernels: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.device_time / 1000.0 / 5
    by_kind: dict[str, float] = defaultdict(float)
    for name, ms in kernels.items():
        by_kind[kind_of(name)] += ms
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {"step_ms": round(wall, 3), "host_ms_per_step": round(host / steps * 1e3, 3),
            "kernel_ms": round(sum(kernels.values()), 3), "kernel_ms_by_kind": {k: round(v, 3) for k, v in by_kind.items()},
            "launches_per_step": round(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 5),
            "top_kernels_ms": [[n[:100], round(ms, 3)] for n, ms in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "tscale-124m.toml")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("muon_profile: needs a CUDA GPU")
    record = {"benchmark": "muon_profile", "date": time.strftime("%Y-%m-%d"), "commit": git_commit(),
              "gpu": gpu_name(), "torch": torch.__version__,
              "command": f"python scripts/bench/muon_profile.py --config {args.config} --variants {' '.join(args.variants)}",
              "metrics": {}, "notes": f"Muon + AdamW step of {args.config} on random gradients: CUDA events over "
                                      f"{args.steps} calls after 3, kernels profiled over 5 calls."}
    eager_ns = muon.orthogonalize
    results = {}
    ns_dtype = muon.ns_dtype_for
    muon.ns_dtype_for = lambda t: torch.float32  # the definition: Newton-Schulz in float32
    definition = first_update(*setup(args.config, overrides=("optim.compile_step=false",)))
    muon.ns_dtype_for = ns_dtype
    for variant in args.variants:
        muon.orthogonalize = torch.compile(eager_ns, dynamic=False) if variant == "compiled_ns" else eager_ns
        model, opt = setup(args.config, overrides=(f"optim.compile_step={str(variant == 'compiled_step').lower()}",))
        results[variant] = first_update(model, opt)
        r = measure(opt, args.steps)
        suffix = "" if variant == "eager" else f"_{variant}"
        record["metrics"].update({f"optimizer_step_ms{suffix}": r["step_ms"], f"optimizer_kernel_ms{suffix}": r["kernel_ms"],
                                  f"optimizer_launches_per_step{suffix}": r["launches_per_step"],
                                  **{f"optimizer_{kind}_kernel_ms{suffix}": ms for kind, ms in r["kernel_ms_by_kind"].items()}})
        print(f"{variant}: step {r['step_ms']:.3f} ms (host {r['host_ms_per_step']:.3f}), kernels {r['kernel_ms']:.3f} "
              f"ms {r['kernel_ms_by_kind']}, {r['launches_per_step']} launches")
        for name, ms in r["top_kernels_ms"]:
            print(f"    {ms:8.3f}  {name}")
    for variant in results:
        for against, ref in (("eager", results.get("eager")), ("definition", definition)):
            if ref is None or variant == against:
                continue
            diff = max(float((a - b).abs().max() / (b.abs().max() + 1e-12)) for a, b in zip(results[variant], ref))
            norm = max(float((a - b).norm() / (b.norm() + 1e-12)) for a, b in zip(results[variant], ref))
            suffix = "" if against == "eager" else "_vs_definition"
            record["metrics"][f"{variant}_max_rel_diff_first_update{suffix}"] = diff
            record["metrics"][f"{variant}_norm_rel_diff_first_update{suffix}"] = norm
            print(f"{variant} against {against}, first update: max relative difference {diff:.2e}, "
                  f"norm relative difference {norm:.2e}")
    muon.orthogonalize = eager_ns
    if args.out:
        write_json_atomic(args.out, record)


if __name__ == "__main__":
    main()
