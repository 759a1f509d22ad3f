"""The rich consoles the commands print through: strings as given, so a path's brackets survive."""

from rich.console import Console


def console(stderr: bool = False, quiet: bool = False, live: bool = False) -> Console:
    """A console that prints strings as given: no markup (`runs/[v2]` would lose `[v2]`), no highlighting.

    Lines are not wrapped (a log keeps one line a record) unless `live`: a live progress display must be cropped to
    its terminal, so its console wraps, and notes printed through it pass soft_wrap=True.
    """
    return Console(stderr=stderr, quiet=quiet, markup=False, highlight=False, soft_wrap=not live)
