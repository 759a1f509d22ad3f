"""Shared pieces of the benchmark programs: environment facts and the docs/bench/NAME.json record."""

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from tscale.fileio import write_json_atomic

REPO = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """TSCALE_COMMIT if set (a tree copied without its history), else HEAD of this checkout (+ "-dirty")."""
    if os.environ.get("TSCALE_COMMIT"):
        return os.environ["TSCALE_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def measurement_stamp() -> str:
    """Where and when a part is measured: "date, gpu, torch x, commit y" of this machine and checkout."""
    return f"{datetime.date.today().isoformat()}, {gpu_name()}, torch {torch.__version__}, commit {git_commit()}"


def write_record(name: str, metrics: dict, notes: str, out_dir: Path, header: dict | None = None) -> Path:
    """docs/bench/NAME.json in the schema of DESIGN.md; a re-run replaces it.

    header: the date, commit, gpu and torch to keep (a record re-assembled from parts measured
    earlier, whose first part was not measured now); by default this machine's and checkout's. Its
    "command" (the earlier parts' commands, "; "-separated) is kept, this one's appended.
    """
    command = " ".join(["python", *sys.argv])
    earlier = (header or {}).get("command", "").split("; ")
    record = {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "gpu": gpu_name(),
        "torch": torch.__version__,
        **{k: header[k] for k in ("date", "commit", "gpu", "torch") if header and k in header},
        "command": "; ".join([c for c in earlier if c and c != command] + [command]),
        "metrics": metrics,
        "notes": notes,
    }
    path = out_dir / f"{name}.json"
    write_json_atomic(path, record)
    return path


def time_per_call(fn, device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Seconds per call of fn after `warmup` calls: CUDA events on a GPU, wall time on the CPU."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def merge_metrics(name: str, metrics: dict, part_note: str, out_dir: Path, drop_prefixes: tuple[str, ...] = (),
                  stamp: str | None = None, command: str | None = None) -> Path:
    """Add one part's metrics to docs/bench/NAME.json, keeping the others; a new record if there is none.

    drop_prefixes: the record's metrics whose names start with one of these go first (a part
    whose set of keys changes from run to run, so an earlier run's leave no stale values).

    The record's date, commit, gpu and torch stay those of its first part; this part's own go
    into its paragraph of the notes, which replaces the paragraph of an earlier run of the same
    part (the same words up to the first ":").

    stamp / command: where the part was measured and how ("date, gpu, torch x, commit y" and its
    command line), for a part measured elsewhere (scripts/bench/merge_record.py); by default this
    machine and this process's.
    """
    path = out_dir / f"{name}.json"
    if not path.is_file():
        return write_record(name, metrics, part_note, out_dir)
    record = json.loads(path.read_text())
    head = part_note.split(":", 1)[0]
    stamp = stamp or measurement_stamp()
    kept = [p for p in record.get("notes", "").split("\n\n") if p and not p.startswith(head + ":")]
    body = part_note.split(":", 1)[1].strip() if ":" in part_note else part_note
    record["notes"] = "\n\n".join([*kept, f"{head}: ({stamp}) {body}"])
    kept_metrics = {k: v for k, v in record.get("metrics", {}).items() if not k.startswith(drop_prefixes)}
    record["metrics"] = {**kept_metrics, **metrics}
    command = command or " ".join(["python", *sys.argv])
    record["command"] = "; ".join([c for c in record.get("command", "").split("; ") if c and c != command] + [command])
    write_json_atomic(path, record)
    return path


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The order of a benchmark's presets in each round: as given, then reversed, alternating, so that a clock
    drifting over the process (the first preset's products ran 8-12% faster than the later ones' on the H200)
    touches every preset alike."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]
