"""The architecture record: metrics and notes from WORK/results.json, merged with a previous part's record.

The two device calls of issue 3 each measure part of the record (convergence and throughput in
one, attention cost in the other); each call's report keeps the metrics and the notes lines of
the other part from the architecture.json already in the output folder, and replaces its own.
Notes are lines tagged "[convergence]", "[throughput]", "[attention]", "[kernel]".
"""

import json
from pathlib import Path
from typing import Callable

import curves

METRIC_TARGETS = {  # the metrics: key -> (target, whether a value meets it)
    "convergence_tokens_ratio": ("<= 0.5", lambda v: v <= 0.5),
    "convergence_time_ratio": ("<= 0.6", lambda v: v <= 0.6),
    "attention_time_ratio_1024": ("<= 0.5", lambda v: v <= 0.5),
    "attention_time_ratio_4096": ("<= 0.25", lambda v: v <= 0.25),
    "throughput_ratio": (">= 1.2", lambda v: v >= 1.2),
    "kernel_vs_flex_speedup": (">= 1.3", lambda v: v >= 1.3),  # targets of scripts/bench/attention_kernel.py
    "causal_vs_sdpa_time_ratio": ("<= 1.25", lambda v: v <= 1.25),
}
KERNEL_KEYS = ("kernel_vs_flex_speedup", "causal_vs_sdpa_time_ratio")
# attention measurements by the model's op ("attention", the headline) and by the train.attention alternatives
ATTENTION_PARTS = ("attention", "attention_fa2", "attention_fa2_global", "attention_cudnn", "attention_cudnn_global")

WARMUP_STEPS_SKIPPED = 20  # log intervals of the first steps are left out of tokens/s (first-step allocations)


def _run_summary(entry: dict) -> dict:
    """Numbers of one convergence run read back from its metrics.jsonl."""
    records = curves.read_records(Path(entry["run"]) / "metrics.jsonl")
    per_step = curves.tokens_per_step(records)
    times = curves.train_time_curve(records, compile_in_first=True)
    return {"records": records, "per_step": per_step, "val": curves.val_curve(records), "times": times,
            "tokens_per_s": curves.steady_tokens_per_s(records, WARMUP_STEPS_SKIPPED * per_step),
            "train_s": times[-1][1], "tokens": times[-1][0]}


def _time_at(times: list, tokens: float) -> float:
    """Training seconds at `tokens`, extrapolated at the last interval's rate past the last log record."""
    if tokens <= times[-1][0]:
        return curves.interpolate(times, tokens)
    (x0, y0), (x1, y1) = times[-2], times[-1]
    return y1 + (tokens - x1) * (y1 - y0) / (x1 - x0)


UNNAMED_SEQ_LEN = 1024  # the window length of runs and records that name none (all before --seq-len existed)


def run_seq_len(entry: dict) -> int:
    """The window length a convergence run trained at (its model.seq_len override, else UNNAMED_SEQ_LEN)."""
    return next((int(o.split("=", 1)[1]) for o in entry.get("overrides", []) if o.startswith("model.seq_len=")),
                UNNAMED_SEQ_LEN)


def _changed(entry: dict) -> str:
    """The optimizer settings a run changed from its preset and the variant's settings (--tscale-set), as
    ' + --set ...' text."""
    variant = entry.get("variant", [])
    mine = [o for o in entry["overrides"] if o.startswith("optim.") and o not in variant] + list(variant)
    return "".join(f" + --set {o}" for o in mine)


def _embedding(entry: dict) -> str:
    """How a run's input table relates to its head, read from its parameter counts: an untied table is a
    head-sized block of parameters outside the matrix products (the head lies inside them)."""
    head = entry["matmul_params"] - entry["block_params"]
    outside_products = entry["params"] - entry["matmul_params"]
    if outside_products > head / 2:
        return "untied: the extra input table is a lookup, no FLOPs"
    return "embedding tied to the head"


def convergence_part(results: dict) -> tuple[dict, dict]:
    """(metrics, notes by tag) of the convergence and throughput part; empty when its runs are missing."""
    gpt2, tscale = results.get("gpt2"), results.get("tscale")
    if not gpt2 or not tscale:
        return {}, {}
    g, t = _run_summary(gpt2), _run_summary(tscale)
    if not g["val"] or not t["val"]:
        return {}, {"convergence": "a convergence run ended before its first evaluation: nothing to compare"}
    budget, target = g["tokens"], gpt2["final_val_loss"]
    complete = gpt2["steps"] == gpt2["planned_steps"]
    m = {
        "gpt2_budget_tokens": round(budget), "gpt2_final_val_loss": round(target, 4),
        "convergence_seq_len": run_seq_len(gpt2),
        "gpt2_train_s": round(g["train_s"], 1),
        "gpt2_tokens_per_s": round(g["tokens_per_s"]), "tscale_tokens_per_s": round(t["tokens_per_s"]),
        "throughput_ratio": round(t["tokens_per_s"] / g["tokens_per_s"], 3),
        "tscale_schedule_tokens": tscale["planned_steps"] * t["per_step"],
        "tscale_last_tokens": t["val"][-1][0] if t["val"] else 0, "tscale_last_val_loss": round(t["val"][-1][1], 4),
        "gpt2_params": gpt2["params"], "gpt2_block_params": gpt2["block_params"],
        "gpt2_matmul_params": gpt2["matmul_params"], "tscale_params": tscale["params"],
        "tscale_block_params": tscale["block_params"], "tscale_matmul_params": tscale["matmul_params"],
        "gpt2_run_wall_s": round(gpt2["wall_s"], 1), "tscale_run_wall_s": round(tscale["wall_s"], 1),
    }
    crossed = curves.crossing(t["val"], target)
    if crossed is not None and complete:
        seconds = _time_at(t["times"], crossed)
        m.update(convergence_tokens_ratio=round(crossed / budget, 4),
                 convergence_time_ratio=round(seconds / g["train_s"], 4),
                 tscale_crossing_tokens=round(crossed), tscale_crossing_train_s=round(seconds, 1))
        outcome = (f"tscale reached it after {crossed / 1e6:.2f}M tokens ({crossed / budget:.3f} B) and "
                   f"{seconds:.1f} s of training ({seconds / g['train_s']:.3f} of gpt2's {g['train_s']:.1f} s)")
    elif not complete:
        outcome = (f"gpt2 stopped at step {gpt2['steps']} of {gpt2['planned_steps']} ({gpt2['ended']}): "
                   f"no convergence ratios")
    else:
        outcome = (f"tscale did NOT reach it: last evaluation {t['val'][-1][1]:.4f} after {t['val'][-1][0] / 1e6:.2f}M "
                   f"tokens (run ended: {tscale['ended']}); convergence ratios left out")
    eval_every = t["val"][1][0] - t["val"][0][0] if len(t["val"]) > 1 else t["val"][0][0]
    notes = {
        "convergence": (
            f"gpt2 ({gpt2['config']}{_changed(gpt2)}) trained B = {budget / 1e6:.2f}M tokens "
            f"({gpt2['steps']} steps of {g['per_step']:,} tokens) on mix + code-slice, GPT-2 BPE, one pass, "
            f"final val loss {target:.4f} on fixed validation windows; tscale ({tscale['config']}{_changed(tscale)}, schedule over "
            f"{m['tscale_schedule_tokens'] / 1e6:.2f}M tokens = {m['tscale_schedule_tokens'] / budget:.2f} B) "
            f"scored on the same windows every {eval_every / 1e6:.2f}M tokens, the crossing interpolated "
            f"linearly between evaluations. {outcome}. "
            f"Training time = the loop's steps only (compile, evaluation, checkpoints left out). "
            f"Parameters matched inside the blocks: gpt2 {gpt2['block_params'] / 1e6:.2f}M, tscale "
            f"{tscale['block_params'] / 1e6:.2f}M; matrix-product parameters per token (head included) "
            f"{gpt2['matmul_params'] / 1e6:.2f}M vs {tscale['matmul_params'] / 1e6:.2f}M; all parameters "
            f"{gpt2['params'] / 1e6:.2f}M ({_embedding(gpt2)}) vs {tscale['params'] / 1e6:.2f}M ({_embedding(tscale)})."),
        "throughput": (
            f"training tokens/s of the same two runs (same loop, bf16 autocast, torch.compile, "
            f"{g['per_step']:,} tokens a step) after their first {WARMUP_STEPS_SKIPPED} steps: tscale "
            f"{t['tokens_per_s']:,.0f}, gpt2 {g['tokens_per_s']:,.0f}."),
    }
    return m, notes


def attention_part(results: dict, key: str = "attention") -> tuple[dict, dict]:
    """Metrics and note of one attention measurement: key "attention" (the default op) or "attention_<alt>" for
    train.attention = "<alt>" (fa2, fa2_global, cudnn, cudnn_global; their metrics are named <key>_*, beside the
    headline's)."""
    att = results.get(key)
    if not att:
        return {}, {}
    m, pieces = {}, []
    for seq_len, c in att.items():
        m[f"{key}_time_ratio_{seq_len}"] = round(c["tscale_s"] / c["sdpa_s"], 4)
        m[f"{key}_ms_tscale_{seq_len}"] = round(1e3 * c["tscale_s"], 3)
        m[f"{key}_ms_sdpa_{seq_len}"] = round(1e3 * c["sdpa_s"], 3)
        if "tscale_per_call_s" in c:
            m[f"{key}_per_call_time_ratio_{seq_len}"] = round(c["tscale_per_call_s"] / c["sdpa_per_call_s"], 4)
            m[f"{key}_per_call_ms_tscale_{seq_len}"] = round(1e3 * c["tscale_per_call_s"], 3)
            m[f"{key}_per_call_ms_sdpa_{seq_len}"] = round(1e3 * c["sdpa_per_call_s"], 3)
        layers = ", ".join(f"{n} x {'global' if w == '0' else 'window ' + w}" for w, n in c["windows"].items())
        pieces.append(f"T={seq_len}: B={c['batch_size']}, {layers}, {c['docs_per_row']:.2f} documents per row")
    first = next(iter(att.values()))
    stamp = f"({first['stamp']}) " if "stamp" in first else ""
    note = (f"{stamp}forward + backward of every attention call of one training step ({first['shape'][1]} heads x "
            f"{first['shape'][3]}, q/k/v in {first['dtype']} as the model makes them, sink {first['sink']}), inputs "
            f"recorded from the tscale model's own forward over a run's first real batch (document ids from its "
            f"real boundaries); path: {first['path']}; baseline: F.scaled_dot_product_attention(is_causal=True) "
            f"on the same q, k, v in {first.get('sdpa_dtype', first['dtype'])} in every layer; both "
            f"torch.compile'd, CUDA events. "
            + ("Headline: all calls of the step timed together (every forward in layer order, then one backward "
               "through all of them, as a training step runs them); *_per_call_*: each call's forward + backward "
               "timed alone, summed. " if "tscale_per_call_s" in first else "Each call timed alone, summed. ")
            + "; ".join(pieces) + ".")
    return m, {key: note}


def kernel_part(out_dir: Path) -> tuple[dict, dict]:
    path = out_dir / "attention_kernel.json"
    if not path.is_file():
        return {}, {"kernel": f"{path.name} absent: kernel_vs_flex_speedup and causal_vs_sdpa_time_ratio left out "
                              f"(scripts/bench/attention_kernel.py writes them)."}
    record = json.loads(path.read_text())
    m = {k: record["metrics"][k] for k in KERNEL_KEYS if k in record.get("metrics", {})}
    return m, {"kernel": f"{', '.join(m) or 'no kernel metric'} merged from {path.name} "
                         f"({record.get('date')}, commit {str(record.get('commit'))[:12]}, {record.get('gpu')})."}


def _previous(out_dir: Path) -> tuple[dict, dict, list[str], dict]:
    """The record as it stands: (metrics, the [tag] notes by tag, its other paragraphs, its header).

    The other paragraphs are those that merge_metrics adds for parts measured by other scripts
    (arch_speed.py, arch_profile.py): kept as they are, after the tagged block."""
    path = out_dir / "architecture.json"
    if not path.is_file():
        return {}, {}, [], {}
    record = json.loads(path.read_text())
    notes, others = {}, []
    for paragraph in record.get("notes", "").split("\n\n"):
        if not paragraph.startswith("["):
            others += [paragraph] if paragraph.strip() else []
            continue
        for line in paragraph.splitlines():
            if line.startswith("[") and "]" in line:
                tag, text = line[1:].split("]", 1)
                notes[tag] = text.strip()
    header = {k: record[k] for k in ("date", "commit", "gpu", "torch", "command") if k in record}
    return record.get("metrics", {}), notes, others, header


def _attention_part_of(key: str) -> str | None:
    """The attention measurement a metric key belongs to: the longest of ATTENTION_PARTS it starts with."""
    parts = [p for p in ATTENTION_PARTS if key.startswith(p + "_")]
    return max(parts, key=len) if parts else None


def _owned(part: str) -> Callable[[str], bool]:
    """Which metric keys a part writes (and so replaces when it is measured again)."""
    if part in ATTENTION_PARTS:
        return lambda k: _attention_part_of(k) == part
    if part == "kernel":
        return lambda k: k in KERNEL_KEYS
    return lambda k: not k.startswith("attention_") and k not in KERNEL_KEYS


def build_report(results: dict, out_dir: Path, scale) -> tuple[dict, str, str, dict | None]:
    """(metrics, notes, markdown table, header): this call's parts replace the previous record's, the rest is
    kept. header: the previous record's date, commit, gpu and torch when this call has no convergence part
    (the record's first; else this machine's are used), and always its command, which the record keeps."""
    metrics, notes, others, header = _previous(out_dir)
    parts = [("convergence", convergence_part(results)), *((p, attention_part(results, p)) for p in ATTENTION_PARTS),
             ("kernel", kernel_part(out_dir))]
    for part, (m, n) in parts:
        if not n:
            continue
        owned = _owned(part)
        metrics = {k: v for k, v in metrics.items() if not owned(k)}
        metrics.update(m)
        notes.update(n)
    notes["run"] = ("scripts/bench/issue3_gpu.sh 1 (convergence, throughput), then 2 (attention; the ablation is "
                    "docs/bench/ablation.json); protocol in docs/architecture.md.")
    order = ["convergence", "throughput", *ATTENTION_PARTS, "kernel", "run"]
    text = "\n".join(f"[{tag}] {notes[tag]}" for tag in order + sorted(set(notes) - set(order)) if tag in notes)
    keep_header = header if header and "convergence" not in results else {"command": header.get("command", "")}
    return metrics, "\n\n".join([text, *others]), markdown_table(metrics), keep_header


def screen_target(results: dict, record: Path | None, seq_len: int = UNNAMED_SEQ_LEN) -> dict | None:
    """What tscale variants are screened against: gpt2's run of this work folder, else the recorded one of the
    same protocol (an architecture.json's gpt2_final_val_loss, gpt2_train_s, gpt2_budget_tokens); either only when
    it trained at `seq_len` (a record without convergence_seq_len is of UNNAMED_SEQ_LEN); None if neither."""
    gpt2 = results.get("gpt2")
    if gpt2 and gpt2.get("final_val_loss") is not None and run_seq_len(gpt2) == seq_len:
        g = _run_summary(gpt2)
        return {"final_val_loss": gpt2["final_val_loss"], "train_s": g["train_s"], "budget_tokens": g["tokens"],
                "source": "gpt2's run in this work folder"}
    if record is None or not record.is_file():
        return None
    saved = json.loads(record.read_text())
    m = saved.get("metrics", {})
    if not all(k in m for k in ("gpt2_final_val_loss", "gpt2_train_s", "gpt2_budget_tokens")):
        return None
    if m.get("convergence_seq_len", UNNAMED_SEQ_LEN) != seq_len:
        return None
    return {"final_val_loss": m["gpt2_final_val_loss"], "train_s": m["gpt2_train_s"],
            "budget_tokens": m["gpt2_budget_tokens"],
            "source": f"gpt2's recorded run ({record.name}, {saved.get('date')}, commit {str(saved.get('commit'))[:7]})"}


def screen_report(results: dict, target: dict, names: list[str]) -> tuple[list[dict], str]:
    """Each named tscale run against the target: (rows, markdown table). A row: the run's settings, where its
    validation loss crossed the target (tokens, training seconds, both as a fraction of gpt2's), its rate and its
    last evaluation; crossing None when it never got there."""
    rows = []
    for name in names:
        entry = results.get(name)
        if not entry:
            rows.append({"name": name, "settings": None, "ended": "no result"})
            continue
        t = _run_summary(entry)
        crossed = curves.crossing(t["val"], target["final_val_loss"]) if t["val"] else None
        seconds = _time_at(t["times"], crossed) if crossed is not None else None
        rows.append({
            "name": name, "settings": entry.get("variant", []), "ended": entry.get("ended"),
            "crossing_tokens": round(crossed) if crossed is not None else None,
            "tokens_ratio": round(crossed / target["budget_tokens"], 4) if crossed is not None else None,
            "crossing_train_s": round(seconds, 1) if seconds is not None else None,
            "time_ratio": round(seconds / target["train_s"], 4) if seconds is not None else None,
            "tokens_per_s": round(t["tokens_per_s"]),
            "last_tokens": t["val"][-1][0] if t["val"] else 0,
            "last_val_loss": round(t["val"][-1][1], 4) if t["val"] else None,
        })
    lines = [f"Target: val loss {target['final_val_loss']:.4f} after {target['budget_tokens'] / 1e6:.2f}M tokens and "
             f"{target['train_s']:.1f} s of training ({target['source']}).", "",
             "| run | settings | tokens to the target (of B) | training s (of gpt2's) | tokens/s | last val loss |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        settings = " ".join(r["settings"]) if r["settings"] else ("(none)" if r["settings"] is not None else "")
        if r.get("crossing_tokens") is not None:
            reached = (f"{r['crossing_tokens'] / 1e6:.2f}M ({r['tokens_ratio']:.3f})",
                       f"{r['crossing_train_s']:.1f} ({r['time_ratio']:.3f})")
        else:
            reached = (f"not reached ({r['ended']})", "")
        last = f"{r['last_val_loss']} at {r['last_tokens'] / 1e6:.2f}M" if r.get("last_val_loss") is not None else ""
        lines.append(f"| {r['name']} | {settings} | {reached[0]} | {reached[1]} | {r.get('tokens_per_s', '')} | "
                     f"{last} |")
    return rows, "\n".join(lines)


def markdown_table(metrics: dict) -> str:
    lines = ["| metric | value | target | met |", "|---|---:|---|---|"]
    for key, (target, test) in METRIC_TARGETS.items():
        if key in metrics:
            met = "" if test is None else ("yes" if test(metrics[key]) else "**no**")
            lines.append(f"| {key} | {metrics[key]} | {target} | {met} |")
        else:
            lines.append(f"| {key} | (not measured) | {target} | |")
    extra = ("attention_time_ratio_", "attention_fa2_time_ratio_", "attention_cudnn_time_ratio_")  # --tiny's lengths
    for key in sorted(k for k in metrics if k.startswith(extra) and k not in METRIC_TARGETS):
        lines.append(f"| {key} | {metrics[key]} | | |")
    return "\n".join(lines)
