"""The `tscale` command group: registers the five stage commands and turns UserError into exit 2."""

import os
import sys

import click

from tscale.errors import UserError


class TScaleGroup(click.Group):
    """Runs a subcommand; a UserError becomes one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            name = ctx.invoked_subcommand or ctx.info_name
            if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for every rank
                click.echo(f"tscale {name}: error: {e}", err=True)
            sys.exit(2)


@click.group(cls=TScaleGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(package_name="tscale")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """TScale: train and run transformer language models on GPUs people can own.

    Stages exchange folders on disk: tokenize -> build-index -> train -> infer / eval.
    """
    ctx.obj = {"debug": debug}


def _idle_openmp_threads_sleep_under_launchers() -> None:
    """In a data-parallel launch (WORLD_SIZE > 1), idle OpenMP threads sleep instead of spinning.

    A spinning thread holds its core after every parallel region; on CPU hosts that core is what
    Gloo's threads and the 1-bit exchange's callbacks need. 4 processes of 4 threads on 16 cores
    stepped in 0.84 s with spinning threads, 0.29 s with sleeping ones (docs/BENCHMARKS.md,
    sync_1bit). Runs before torch loads OpenMP; a value the user set is kept.
    """
    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1"):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _register() -> None:
    from .build_index import build_index
    from .eval import eval_cmd
    from .infer import infer
    from .tokenize import tokenize
    from .train import train

    for cmd in (tokenize, build_index, train, infer, eval_cmd):
        main.add_command(cmd)


_idle_openmp_threads_sleep_under_launchers()
_register()
