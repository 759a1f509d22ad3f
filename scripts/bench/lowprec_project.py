"""A projection, not a measurement: what the low-precision recipes would gain on an RTX 4090, from an H200 profile.

    python scripts/bench/lowprec_project.py [PROFILE] [--linear-share 0.64 | --step-profile STEP_JSON]
    PROFILE: the output of scripts/bench/lowprec_profile.py (default docs/bench/lowprec_profile_1p5b_qkv.txt)
    STEP_JSON: the output of scripts/bench/lowprec_step_profile.py (docs/bench/lowprec_step_profile.json)

Each kernel of a recipe's layer step (forward + backward) is put in one class by its name:
a bf16, fp8 or int8 matrix product (compute-bound), or anything else (quantize, scaling,
casts, gradient accumulation: memory-bound). Each class is assumed to reach the same share
of its peak on the 4090 as it did on the H200, so its time is multiplied by the ratio of the
two GPUs' datasheet rates for that class (dense tensor-core peaks with fp32 accumulation;
memory bandwidth for the rest; ../shared/research/perf_anchors.md). The layer's projected
speed-up over bf16 then gives the training step's, by Amdahl's law, with the linear layers'
share of a bf16 step on the 4090: by default projected the same way from the kernel time by
kind of a measured 1.5B bf16 step on the H200 (STEP_JSON: products and attention scaled by the
bf16 rates, the rest by memory bandwidth; the head's product, 5% of the products' FLOPs, taken
out); --linear-share gives it directly instead. (Before the step was profiled the share was
estimated at 0.75 from FLOP rates; the profile measured 0.547 on the H200.)
Prints a table; docs/lowprec.md quotes it.
"""

import argparse
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# dense peaks, TFLOP/s (fp32 accumulation), and memory bandwidth, TB/s
RATES = {"H200": {"bf16": 989.0, "fp8": 1979.0, "int8": 1979.0, "memory": 4.8},
         "RTX 4090": {"bf16": 165.2, "fp8": 330.3, "int8": 660.6, "memory": 1.008}}
HEADER = re.compile(r"^(\S+) M=(\d+) K=(\d+) N=(\d+) (\S+): ([\d.]+) ms of kernels per step")
ROW = re.compile(r"^\s+([\d.]+) ms\s+\d+x\s+(.*)$")


def kernel_class(name: str) -> str:
    """bf16 / fp8 / int8 product, or memory (everything else), from a CUDA kernel's name."""
    if "i8i32" in name or "igemm" in name or name.startswith("_ZN7cutlass"):
        return "int8"  # a mangled CUTLASS name comes from tscale._C_cutlass, whose kernels are all int8 products
    if name.startswith("nvjet_sm90_q") or "e4m3" in name or "f8f8" in name:
        return "fp8"
    if name.startswith(("nvjet", "sm90_xmma_gemm", "ampere_", "sm80_xmma_gemm", "cutlass")):
        return "bf16"
    return "memory"


def parse(text: str) -> dict[str, dict[str, float]]:
    """{recipe: {class: ms}} from a profile; the rows a profile cut off count as memory-bound."""
    out, recipe = {}, None
    for line in text.splitlines():
        if m := HEADER.match(line):
            recipe = m.group(5)
            out[recipe] = {"total": float(m.group(6)), "bf16": 0.0, "fp8": 0.0, "int8": 0.0}
        elif (m := ROW.match(line)) and recipe:
            cls = kernel_class(m.group(2))
            if cls != "memory":
                out[recipe][cls] += float(m.group(1))
    for times in out.values():
        times["memory"] = times.pop("total") - times["bf16"] - times["fp8"] - times["int8"]
    return out


def project(times: dict[str, float], source: str = "H200", target: str = "RTX 4090") -> float:
    """The layer step's time on `target`, ms, from its per-class times on `source`."""
    return sum(ms * RATES[source][cls] / RATES[target][cls] for cls, ms in times.items())


def amdahl(layer_speedup: float, share: float) -> float:
    """A step's speed-up when a share of it runs layer_speedup times faster."""
    return 1.0 / ((1.0 - share) + share / layer_speedup)


# the 1.5B model's linear layers' share of its products' FLOPs (the head's 50,304 x 1,600 product is the rest):
# 48 x 12 x 1600^2 / (48 x 12 x 1600^2 + 50,304 x 1,600)
LINEAR_FRACTION_1P5B = 0.948


def linear_share(kinds: dict[str, float], target: str, linear_fraction: float = LINEAR_FRACTION_1P5B) -> float:
    """The linear layers' share of a bf16 step on `target`, from the step's kernel time by kind on the H200
    (lowprec_step_profile.py): products and attention scale with the bf16 rate, the rest with memory bandwidth."""
    scaled = {kind: ms * (RATES["H200"]["bf16"] / RATES[target]["bf16"] if kind in ("matmul", "attention")
                          else RATES["H200"]["memory"] / RATES[target]["memory"]) for kind, ms in kinds.items()}
    return scaled.get("matmul", 0.0) * linear_fraction / sum(scaled.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path, nargs="?", default=REPO / "docs" / "bench" / "lowprec_profile_1p5b_qkv.txt")
    ap.add_argument("--linear-share", type=float, help="linear layers' share of a bf16 training step on the 4090")
    ap.add_argument("--step-profile", type=Path, default=REPO / "docs" / "bench" / "lowprec_step_profile.json",
                    help="lowprec_step_profile.py's JSON of a 1.5B step, for the share (when --linear-share is not given)")
    args = ap.parse_args()
    recipes = parse(args.profile.read_text())
    if "bf16" not in recipes:
        raise SystemExit(f"{args.profile}: no bf16 block to compare with")
    share = args.linear_share
    if share is None:
        if not args.step_profile.is_file():
            raise SystemExit(f"{args.step_profile}: no step profile; give --linear-share or run lowprec_step_profile.py")
        kinds = json.loads(args.step_profile.read_text())["recipes"]["bf16"]["kind_ms_per_step"]
        share = linear_share(kinds, "RTX 4090")
        print(f"linear layers' share of a bf16 step: H200 {linear_share(kinds, 'H200'):.3f} (measured), "
              f"RTX 4090 {share:.3f} (projected) from {args.step_profile.name}")
    base = {gpu: project(recipes["bf16"], "H200", gpu) for gpu in RATES}
    print(f"PROJECTION from {args.profile.name}; linear layers' share of a step {share:.3f}")
    print("| recipe | H200 layer ms (measured) | layer vs bf16 | 4090 layer ms (projected) | layer vs bf16 | step vs bf16 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, times in recipes.items():
        h200, rtx = project(times, "H200", "H200"), project(times, "H200", "RTX 4090")
        h_speed, r_speed = base["H200"] / h200, base["RTX 4090"] / rtx
        print(f"| {name} | {h200:.3f} | {h_speed:.2f}x | {rtx:.2f} | {r_speed:.2f}x | "
              f"{amdahl(r_speed, share):.2f}x |")


if __name__ == "__main__":
    main()
