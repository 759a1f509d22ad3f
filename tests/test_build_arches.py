"""setup.py's architecture lists: Hopper built as sm_90a for the wgmma kernels, the others left as given."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _setup_functions(*names: str) -> dict:
    """The named top-level functions of setup.py, without running its setup() call."""
    tree = ast.parse((REPO / "setup.py").read_text())
    module = ast.Module([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names], type_ignores=[])
    scope: dict = {}
    exec(compile(module, "setup.py", "exec"), scope)
    return scope


def test_hopper_becomes_sm90a_and_keeps_its_ptx():
    with_sm90a = _setup_functions("_with_sm90a")["_with_sm90a"]
    assert with_sm90a("8.0;8.6;8.9;9.0") == "8.0;8.6;8.9;9.0a"
    assert with_sm90a("9.0+PTX") == "9.0a;9.0+PTX"
    assert with_sm90a("8.0 9.0") == "8.0;9.0a"
    assert with_sm90a("9.0a;9.0") == "9.0a"  # no duplicate
    assert with_sm90a("8.9") == "8.9"  # a consumer GPU's build has no Hopper code


def test_cutlass_arches_take_hopper_as_sm90a():
    arches = _setup_functions("_cutlass_arches")["_cutlass_arches"]
    assert arches("8.0;8.6;8.9;9.0a") == ["80", "86", "89", "90a"]
    assert arches("7.5;9.0+PTX") == ["90a"]
