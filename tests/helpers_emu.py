"""Building a CUDA kernel's source for the CPU emulator of tests/attention_emu (skipped where it cannot be built)."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def build_emulator(name: str, source: str, include_dirs: list[str]):
    """The extension `name` built from tests/<source> with tests/attention_emu and the repo-relative include_dirs.

    Skips the calling test where TSCALE_SKIP_EMU=1 or where ninja (which torch.utils.cpp_extension needs) is
    missing; torch caches the build, so the compile (up to about a minute) happens once per source version.
    TSCALE_EMU_SOURCE_ROOT=DIR takes include_dirs from the tree at DIR instead (e.g. a comparison tree for
    scripts/device/attention_ab.sh, checked on CPU before it is timed on a GPU).
    """
    if os.environ.get("TSCALE_SKIP_EMU") == "1":
        pytest.skip("TSCALE_SKIP_EMU=1")
    from torch.utils import cpp_extension

    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        pytest.skip("ninja is not installed (torch.utils.cpp_extension needs it to build the emulator)")
    chosen = os.environ.get("TSCALE_EMU_SOURCE_ROOT")
    root = Path(chosen or REPO).resolve()
    missing = [d for d in include_dirs if not (root / d).is_dir()]
    if missing:
        where = f"TSCALE_EMU_SOURCE_ROOT={root}" if chosen else f"the repository at {root}"
        raise FileNotFoundError(f"{where}: no {missing[0]} there (give a tree with csrc/)")
    paths = [str(root / d) for d in include_dirs] + [str(REPO / "tests" / "attention_emu")]
    return cpp_extension.load(name=name, sources=[str(REPO / "tests" / source)], extra_include_paths=paths,
                              extra_cflags=["-O2"], verbose=False)
