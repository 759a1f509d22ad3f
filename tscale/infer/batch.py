"""Batch generation files: read prompts JSONL, check every line, write completions JSONL atomically.

Input: one JSON object per line, {"prompt": str} plus any of "max_new_tokens", "temperature",
"top_k", "top_p", "stop" (a string or a list of strings) and "seed" that override the command's
options for that line; blank lines are skipped. Without a "seed" of its own, line i (counting
prompts from 0) uses seed + i, so repeated prompts differ and a re-run gives the same output.
Output: one line per prompt, {"prompt", "completion", "finish_reason", "tokens"}, written to a
temporary file and renamed into place when all are done; an existing output is never replaced.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tscale.errors import UserError
from tscale.fileio import atomic_path
from tscale.infer.engine import Completion, Engine, GenerationParams

KEYS = ("prompt", "max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed")


@dataclass
class Request:
    where: str  # file:line, for messages
    prompt: str
    params: GenerationParams


def check_new_output(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.exists():
        raise UserError(f"{out}: already exists; choose another --out or delete it")
    return out


def read_requests(path: str | os.PathLike, defaults: GenerationParams) -> list[Request]:
    """Parse and check every line of a prompts file; UserError names file:line and the problem."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such prompts file")
    requests: list[Request] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            requests.append(Request(where, *_parse(rec, where, defaults, len(requests))))
    if not requests:
        raise UserError(f"{path}: no prompts (expected one JSON object per line with a \"prompt\")")
    return requests


def _parse(rec, where: str, defaults: GenerationParams, index: int) -> tuple[str, GenerationParams]:
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object like {{\"prompt\": \"...\"}}")
    unknown = sorted(set(rec) - set(KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    prompt = rec.get("prompt")
    if not isinstance(prompt, str):
        raise UserError(f"{where}: \"prompt\" must be a string")

    def get(key, types, default):
        if key not in rec:
            return default
        value = rec[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise UserError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
        return value

    s = defaults.sampling
    sampling = dataclasses.replace(
        s, temperature=float(get("temperature", (int, float), s.temperature)),
        top_k=get("top_k", int, s.top_k), top_p=float(get("top_p", (int, float), s.top_p)))
    stop = rec.get("stop", defaults.stop)
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) for x in stop):
        raise UserError(f"{where}: 'stop' must be a string or a list of strings")
    seed = rec["seed"] if "seed" in rec else (None if defaults.seed is None else defaults.seed + index)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise UserError(f"{where}: 'seed' must be an integer")
    params = GenerationParams(max_new_tokens=get("max_new_tokens", int, defaults.max_new_tokens),
                              sampling=sampling, stop=tuple(stop), seed=seed)
    return prompt, params.check(where)


def write_completions(engine: Engine, requests: list[Request], out: str | os.PathLike,
                      on_done: Callable[[int, Completion], None] | None = None) -> list[Completion]:
    """Generate every request, in order, into `out` (atomically). Prompts are checked before any work."""
    out = check_new_output(out)
    prompt_ids = [engine.encode_prompt(r.prompt, r.where) for r in requests]
    done: list[Completion] = []
    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for i, (r, ids) in enumerate(zip(requests, prompt_ids)):
            c = engine.generate(r.prompt, r.params, ids)
            rec = {"prompt": c.prompt, "completion": c.text, "finish_reason": c.finish_reason, "tokens": c.tokens}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            done.append(c)
            if on_done is not None:
                on_done(i, c)
        f.flush()
    return done
