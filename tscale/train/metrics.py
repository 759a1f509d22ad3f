"""Training metrics: metrics.jsonl records and the live progress line on stderr."""

import json
import os
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from tscale.fileio import write_text_atomic
from tscale.terminal import console


class MetricsLog:
    """Appends one JSON object per line to run/metrics.jsonl, flushed at once."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is not None and path.exists():
            self._truncate_after(resume_step)
        self._file = open(path, "a", encoding="utf-8")

    def _truncate_after(self, step: int) -> None:
        """Drop records of steps a resumed run will redo, so every step appears once."""
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = []
        for line in lines:
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                break
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class NullLog:
    """What ranks other than 0 log to: nothing."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def read_metrics(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class ProgressLine:
    """A rich progress bar with loss, lr, tok/s, MFU and ETA; plain log lines when not on a terminal."""

    def __init__(self, total_steps: int, start_step: int, quiet: bool = False):
        self.console = console(stderr=True, quiet=quiet, live=True)
        self.live = self.console.is_terminal
        self.progress = Progress(
            TextColumn("step {task.completed}/{task.total}"), BarColumn(bar_width=24),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, disable=not self.live,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, stats="")
        self.t0 = time.time()

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def update(self, step: int, record: dict) -> None:
        stats = f"loss {record['loss']:.4f}  lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s"
        if record.get("mfu") is not None:
            stats += f"  mfu {100 * record['mfu']:.1f}%"
        self.progress.update(self.task, completed=step, stats=stats)
        if not self.live:
            self.note(f"step {step}: {stats}")

    def note(self, text: str) -> None:
        """One line as given (the console reads no markup), not wrapped: a log keeps one line a record."""
        self.console.print(text, soft_wrap=True)
