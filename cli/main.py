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


def _register() -> None:
    from .build_index import build_index
    from .eval import eval_cmd
    from .infer import infer
    from .tokenize import tokenize
    from .train import train

    for cmd in (tokenize, build_index, train, infer, eval_cmd):
        main.add_command(cmd)


_register()
