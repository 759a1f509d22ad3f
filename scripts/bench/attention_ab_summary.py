"""One summary of an attention_ab.sh call: kernel time per call by tree and mask, and each tree's model attention ratio.

    python scripts/bench/attention_ab_summary.py OUT_DIR [--out OUT_DIR/ab_summary.json]

Reads what scripts/device/attention_ab.sh (or sm90_backward.sh) leaves in OUT_DIR: profile-<tree>-<round>.json
(attention_profile.py: GPU milliseconds per kernel and call, by mask) and model-<tree>/results.json (architecture.py
attention: per window length, the step's attention time through tscale's path and through SDPA). Writes, per tree,
each mask's mean over the rounds of the whole call and of its main forward and main backward kernels, in
microseconds, and the model's ratios; prints a table.
A call returns a limited number of files, so this one file carries what a record of the comparison needs.
"""

import argparse
import json
import re
import statistics
from pathlib import Path

from tscale.fileio import write_json_atomic

PROFILE = re.compile(r"profile-(?P<tree>.+)-(?P<round>\d+)\.json")
# The main forward and backward kernels of every family: sm_80 (attention_fwd_kernel, attention_bwd_kernel) and
# Hopper (attention_fwd_sm90_kernel, attention_fwd_sm90_ws_kernel and its persistent form, attention_bwd_sm90_kernel).
MAIN_KERNELS = {"fwd_us": re.compile(r"attention_fwd(_sm90)?(_ws)?(_persistent)?_kernel<"),
                "bwd_us": re.compile(r"attention_bwd(_sm90)?_kernel<")}


def kernel_summary(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per mask: the call's kernel time and its main forward and backward kernels', microseconds, mean of rounds."""
    out = {}
    for mask in rounds[0]:
        calls = [r[mask] for r in rounds if mask in r]
        row = {"call_us": statistics.mean(sum(c.values()) for c in calls) * 1e3}
        for key, pattern in MAIN_KERNELS.items():
            row[key] = statistics.mean(sum(ms for name, ms in c.items() if pattern.search(name)) for c in calls) * 1e3
        out[mask] = {k: round(v, 1) for k, v in row.items()}
    return out


def model_ratios(results: Path) -> dict[str, float]:
    """attention_ratio_T<T> (tscale / SDPA) for every window length architecture.py attention recorded."""
    costs = json.loads(results.read_text()).get("attention", {}) if results.is_file() else {}
    return {f"attention_ratio_T{T}": round(c["tscale_s"] / c["sdpa_s"], 3) for T, c in costs.items()}


def summarize(out_dir: Path) -> dict:
    """{tree: {"rounds": n, "masks": kernel_summary, "model": model_ratios}} for every tree profiled in out_dir."""
    by_tree: dict[str, list[dict]] = {}
    meta = {}
    for path in sorted(out_dir.glob("profile-*.json")):
        m = PROFILE.fullmatch(path.name)
        if not m:
            continue
        record = json.loads(path.read_text())
        by_tree.setdefault(m["tree"], []).append(record["profiles"])
        meta = {k: record[k] for k in ("gpu", "torch") if k in record}
    if not by_tree:
        raise SystemExit(f"{out_dir}: no profile-<tree>-<round>.json (run scripts/device/attention_ab.sh first)")
    trees = {tree: {"rounds": len(rounds), "masks": kernel_summary(rounds),
                    "model": model_ratios(out_dir / f"model-{tree}" / "results.json")}
             for tree, rounds in by_tree.items()}
    return {**meta, "trees": trees}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path, help="attention_ab.sh's OUT_DIR")
    ap.add_argument("--out", type=Path, help="summary JSON (default OUT_DIR/ab_summary.json)")
    args = ap.parse_args()
    summary = summarize(args.out_dir)
    for tree, s in summary["trees"].items():
        cells = [f"{mask} {row['call_us']:.1f} (fwd {row['fwd_us']:.1f}, bwd {row['bwd_us']:.1f})"
                 for mask, row in s["masks"].items()]
        print(f"{tree} ({s['rounds']} rounds): " + "; ".join(cells) + f"; model {s['model']}")
    out = args.out or args.out_dir / "ab_summary.json"
    write_json_atomic(out, summary)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
