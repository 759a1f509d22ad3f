"""Where each profiled kernel's warps wait, from an Nsight Compute report's raw metrics (`ncu --page raw --csv`).

For every kernel launch in the CSV: its time, the tensor pipe's and the memory levels' busy shares, and the largest
warp stall reasons (cycles a warp spends stalled for that reason per instruction it issues), so one line per kernel
says what bounds it. Run: python scripts/bench/ncu_stalls.py RAW.csv [--match REGEX] [--top N]
"""

import argparse
import csv
import re
import sys

THROUGHPUTS = {
    "time_us": "gpu__time_duration.sum",
    "tensor%": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "mma%": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue%": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "dram%": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2%": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "warps": "sm__warps_active.avg.per_cycle_active",
    "regs": "launch__registers_per_thread",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarise(rows: list[dict], match: str, top: int) -> list[str]:
    """One line per kernel launch whose name matches `match`: throughputs, then the `top` stall reasons."""
    lines = []
    for row in rows:
        name = row.get("Kernel Name", "")
        if not re.search(match, name):
            continue
        parts = [f"{row.get('ID', '?'):>3} {name[:60]}"]
        for label, metric in THROUGHPUTS.items():
            value = number(row.get(metric, ""))
            if value is not None:
                parts.append(f"{label} {value:.1f}" if label != "time_us" else f"{value / 1000:.1f} us")
        stalls = sorted(((number(v) or 0.0, m.group(1)) for k, v in row.items() if k and (m := STALL.match(k))),
                        reverse=True)
        parts.append("stalls/issue: " + ", ".join(f"{reason} {value:.2f}" for value, reason in stalls[:top]))
        lines.append(" | ".join(parts))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv_path")
    ap.add_argument("--match", default="attention")
    ap.add_argument("--top", type=int, default=7)
    args = ap.parse_args()
    with open(args.csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # drop the units row
    if not rows:
        sys.exit(f"ncu_stalls: no kernel rows in {args.csv_path}")
    print("\n".join(summarise(rows, args.match, args.top)))


if __name__ == "__main__":
    main()
