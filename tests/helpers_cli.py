"""Assertions on how the `tscale` command reports a user error: one line, exit code 2."""


def assert_one_line_error(result, *words: str, command: str) -> None:
    """`result` (a click CliRunner result) failed with exit 2 and one stderr line naming `words`."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tscale {command}: error: "), result.stderr
    for w in words:
        assert w in lines[0], lines[0]
