"""The `tscale` command line: one thin click module per pipeline stage (installed as tscale.cli)."""
