"""`python -m tscale` runs the `tscale` command."""

from tscale.cli.main import main

main()
