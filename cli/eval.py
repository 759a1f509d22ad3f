"""`tscale eval`: checkpoint + token folder [+ index folders] -> eval.json (val loss, perplexity, bits per byte) [+ loss-curve PNG]."""

from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tscale.devices import resolve_device
from tscale.errors import UserError
from tscale.eval import evaluate_checkpoint, plot_curves, run_dir_of
from tscale.fileio import write_json_atomic
from tscale.precision import INFER_MODES
from tscale.terminal import console


@click.command("eval")
@click.argument("ckpt", type=click.Path())
@click.option("--tokens", "tokens_dir", type=click.Path(), required=True, help="Token folder whose val split is scored.")
@click.option("--out", type=click.Path(), help="eval.json to write [default: RUN/eval.json, or ./eval.json].")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Windows of seq_len tokens per forward pass.")
@click.option("--max-tokens", type=int, help="Score at most this many val tokens (a quick, partial evaluation).")
@click.option("--plot", type=click.Path(), help="Also draw the run's train/val loss curves into this PNG.")
@click.option("--index", "indexes", multiple=True, type=click.Path(),
              help="Index folder to score against (repeatable: e.g. a raw and a decontaminated one); a model trained "
              "with the index needs one, and is also scored once with its lookups switched off. Adds the loss by "
              "match-length bucket.")
@click.option("--index-max-len", type=click.IntRange(1, 255), metavar="L",
              help="Cap the --index lookups' matches at L tokens, for a model trained without the index (its "
              "buckets; default 64); a model trained with the index uses its own index.max_len.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--precision", type=click.Choice(INFER_MODES), default="bf16", show_default=True,
              help="Linear layers: as trained, int8/fp8 weights (-w), or int8/fp8 weights and activations.")
@click.option("--quantize-head", is_flag=True,
              help="Convert the head too (its own copy where it is tied to the embedding): int8 generation 1.7x "
              "faster at 124M on a 2-core CPU; weight-only modes slower there.")
def eval_cmd(ckpt, tokens_dir, out, batch_size, max_tokens, plot, indexes, index_max_len, device, precision,
             quantize_head) -> None:
    """Score CKPT (a checkpoint folder, or a run folder for its newest checkpoint) on the val split of TOKENS."""
    if not Path(ckpt).exists():
        raise UserError(f"{ckpt}: no such checkpoint or run folder")
    run_dir = run_dir_of(ckpt)
    metrics = None
    if plot is not None:
        if run_dir is None:
            raise UserError(f"{ckpt}: not inside a run folder, so there are no loss curves for --plot")
        metrics = run_dir / "metrics.jsonl"
        if not metrics.is_file():
            raise UserError(f"{metrics}: no such file; --plot needs the run's metrics")
    out = Path(out) if out else (run_dir / "eval.json" if run_dir is not None else Path("eval.json"))
    err = console(stderr=True, live=True)
    with Progress(TextColumn("scoring val tokens"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"),
                  TimeElapsedColumn(), console=err, disable=not err.is_terminal) as progress:
        task = progress.add_task("eval", total=None)
        result = evaluate_checkpoint(ckpt, tokens_dir, resolve_device(device, "--device"), batch_size, max_tokens,
                                     on_progress=lambda done, total: progress.update(task, completed=done, total=total),
                                     precision=precision, indexes=indexes, index_max_len=index_max_len,
                                     quantize_head=quantize_head)
    write_json_atomic(out, result)
    _print_table(result)
    for entry in result.get("indexes", []):
        _print_buckets(entry, result["model_uses_index"])
    if "without_index" in result:
        _print_buckets(result["without_index"], False)
    out_console = console()
    out_console.print(f"-> {out}")
    if metrics is not None:
        plot_curves(metrics, plot, title=f"{run_dir.name}", eval_point=(result["step"], result["val_loss"]))
        out_console.print(f"-> {plot}")


def _print_table(r: dict) -> None:
    def bpb(v):
        return "-" if v is None else f"{v:.4f}"

    table = Table(title=f"{r['checkpoint']} (step {r['step']:,}) on {r['tokens_dir']}")
    for col in ("source", "tokens", "loss", "perplexity", "bits/byte"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, s in sorted(r["by_source"].items()):
        table.add_row(name, f"{s['tokens']:,}", f"{s['loss']:.4f}", f"{s['perplexity']:.2f}", bpb(s["bits_per_byte"]))
    table.add_section()
    table.add_row("all", f"{r['val_tokens']:,}", f"{r['val_loss']:.4f}", f"{r['perplexity']:.2f}", bpb(r["bits_per_byte"]),
                  style="bold")
    table.add_row("unigram baseline", "", f"{r['unigram_loss']:.4f}", "", "", style="dim")
    console().print(table)


def _print_buckets(e: dict, fed: bool) -> None:
    d = e["decontamination"]
    what = "raw"
    if d:
        against = f", against {d['against']['path']}" if "against" in d else ""
        what = f"decontaminated ({d['ngram']}-grams{against})"
        if not e.get("decontaminated_against_this_split", True):
            what += ", NOT against these validation documents"
    if e["lookups"] == "hidden":
        title = (f"lookups switched off (the network alone), in the buckets of index {e['index']} ({what}): "
                 f"loss {e['val_loss']:.4f}, perplexity {e['perplexity']:.2f}")
    else:
        how = e["lookups"] + (", backoff distribution" if fed and e.get("distribution") == "backoff" else "")
        title = (f"against index {e['index']} ({what}, {how}): loss {e['val_loss']:.4f}, perplexity "
                 f"{e['perplexity']:.2f}{'' if fed else ' (the model does not use the index)'}")
    table = Table(title=title)
    for col in ("match length", "tokens", "share", "loss", "perplexity"):
        table.add_column(col, justify="left" if col == "match length" else "right")
    rows = list(e["by_match_len"].items()) + [("below 16", e["below_16"])]
    for i, (name, b) in enumerate(rows):
        if i == len(rows) - 1:
            table.add_section()
        loss = "-" if b["loss"] is None else f"{b['loss']:.4f}"
        ppl = "-" if b["perplexity"] is None else f"{b['perplexity']:.2f}"
        table.add_row(name, f"{b['tokens']:,}", f"{b['share']:.1%}", loss, ppl)
    console().print(table)
