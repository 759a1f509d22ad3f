"""`tscale train`: tokens/ + run.toml -> run/ (resolved config, metrics.jsonl, checkpoints)."""

from pathlib import Path

import click

from tscale.config import load_config


@click.command("train")
@click.argument("config", type=click.Path(), required=False)
@click.option("-o", "--out", type=click.Path(), required=True, help="Run folder to create (or to continue with --resume).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key, e.g. --set train.steps=200.")
@click.option("--tokens", type=click.Path(), help="Token folder (same as --set data.tokens=DIR).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its newest checkpoint.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def train(config: str | None, out: str, overrides: tuple[str, ...], tokens: str | None, resume: bool, quiet: bool) -> None:
    """Train a model. CONFIG is a TOML file (see configs/); with --resume it is read from the run folder.

    Launched by torchrun, each process is one data-parallel rank (see docs/distributed.md).
    """
    from tscale.train.loop import train_run

    source = Path(out) / "config.toml" if resume else config
    cfg = load_config(source, overrides)
    if tokens:
        cfg.data.tokens = tokens
    result = train_run(cfg, out, resume=resume, quiet=quiet)
    if result.rank != 0:
        return
    summary = f"step {result.step}"
    if result.val_loss is not None:
        summary += f", val loss {result.val_loss:.4f}"
    if result.checkpoint:
        summary += f", checkpoint {result.checkpoint}"
    click.echo(("stopped early: " if result.stopped_early else "done: ") + summary)
