"""The GPU machine's shell scripts (scripts/device): they parse, and their shared deadline counts down."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts" / "device").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_device_script_parses(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _left(seconds: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'set -u; source scripts/device/deadline.sh {seconds}; left'],
                          cwd=REPO, capture_output=True, text=True)


def test_deadline_gives_the_seconds_left_and_at_least_one():
    assert 95 <= int(_left("100").stdout) <= 100
    assert int(_left("0").stdout) == 1  # a step started past the deadline still gets a valid timeout
    missing = _left('""')
    assert missing.returncode != 0 and "usage" in missing.stderr


def _ab_builds(tmp_path, *trees: str, optional: bool = False) -> subprocess.CompletedProcess:
    """ab_builds.sh's argument checks, which run before it builds anything."""
    env = "AB_TREES_OPTIONAL=1 " if optional else ""
    args = " ".join([str(tmp_path / "out"), "10", *trees])
    return subprocess.run(["bash", "-c", f"{env}source scripts/device/ab_builds.sh attention_ab.sh {args}"],
                          cwd=REPO, capture_output=True, text=True)


def test_ab_builds_refuses_a_missing_tree_before_building(tmp_path):
    done = _ab_builds(tmp_path, str(tmp_path / "no-tree"), optional=True)
    assert done.returncode == 2
    assert "no-tree: no such comparison tree" in done.stderr
    assert not (tmp_path / "out").exists()


def test_ab_builds_needs_a_tree_unless_its_caller_allows_none(tmp_path):
    done = _ab_builds(tmp_path)
    assert done.returncode == 2 and "usage: attention_ab.sh OUT_DIR SECONDS BASE_DIR" in done.stderr
    assert not (tmp_path / "out").exists()
