"""`tscale build-index`: tokens/ -> index/ (suffix-array index; not built yet)."""

import click

from tscale.errors import UserError


@click.command("build-index")
@click.argument("tokens", type=click.Path())
@click.option("-o", "--out", type=click.Path(), required=True, help="Index folder to create.")
def build_index(tokens: str, out: str) -> None:
    """Build the suffix-array index of a token folder (not built yet)."""
    raise UserError("build-index is not built yet in this version of tscale")
