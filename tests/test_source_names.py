"""Every name the package, its tests and its scripts use is defined: GPU-only code never runs on a CPU machine,
so a stale name there would otherwise surface only on a GPU."""

import ast
from pathlib import Path

import pytest

WHY = "make test installs pyflakes; without it the names go unchecked"
checker = pytest.importorskip("pyflakes.checker", reason=WHY)
messages = pytest.importorskip("pyflakes.messages", reason=WHY)

ROOT = Path(__file__).resolve().parent.parent
UNDEFINED = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


def undefined_names(source: str, filename: str) -> list[str]:
    """pyflakes' undefined-name findings in one module, as "file:line: message"."""
    found = checker.Checker(ast.parse(source, filename), filename=filename).messages
    return [f"{m.filename}:{m.lineno}: {m.message % m.message_args}" for m in found if isinstance(m, UNDEFINED)]


def test_the_check_finds_a_name_used_only_on_a_gpu_path():
    source = "import torch\n\ndef run():\n    if torch.cuda.is_available():\n        return helper_that_moved()\n"
    assert undefined_names(source, "probe.py") == ["probe.py:5: undefined name 'helper_that_moved'"]


@pytest.mark.parametrize("folder", ["tscale", "tests", "scripts"])
def test_every_name_used_is_defined(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    problems = [p for f in files for p in undefined_names(f.read_text(), str(f.relative_to(ROOT)))]
    assert problems == []
