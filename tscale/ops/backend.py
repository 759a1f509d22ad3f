"""Loads tscale._C once and decides, once, whether ops run as kernels or as torch references."""

import functools
import logging
import os

log = logging.getLogger("tscale.ops")


_loaded: tuple[bool, bool, str] | None = None


def _load() -> tuple[bool, bool, str]:
    """(CPU kernels usable, CUDA kernels usable, description), decided on the first call.

    A module global rather than functools.cache: torch.compile reads a global as a constant,
    while it warns about every cache-wrapped function it traces through.
    """
    global _loaded
    if _loaded is None:
        _loaded = _probe()
    return _loaded


def _probe() -> tuple[bool, bool, str]:
    if os.environ.get("TSCALE_OPS") == "reference":
        return False, False, "reference ops (TSCALE_OPS=reference)"
    try:
        import tscale._C as ext
    except ImportError as e:
        return False, False, (f"reference ops (tscale._C not importable: {e}; "
                              f"rebuild with `pip install --no-build-isolation -e .`)")
    cuda = "with CUDA kernels" if ext.with_cuda else "CPU kernels only"
    return True, bool(ext.with_cuda), f"tscale._C kernels ({cuda})"


def kernels_available() -> bool:
    return _load()[0]


def cuda_kernels_available() -> bool:
    return _load()[1]


def op_defined(name: str) -> bool:
    """Whether the op tscale::NAME has a schema (defined by the loaded extension or by Python)."""
    import torch

    try:
        torch._C._get_schema(f"tscale::{name}", "")
        return True
    except RuntimeError:
        return False


def kernels_usable_on(device_type: str) -> bool:
    """Whether tscale._C kernels serve tensors of this device type ("cpu", "cuda", ...)."""
    if device_type == "cpu":
        return kernels_available()
    return device_type == "cuda" and cuda_kernels_available()


@functools.cache
def backend() -> str:
    """A one-line description of the chosen implementation, logged the first time it is asked."""
    desc = _load()[2]
    log.info("ops: %s", desc)
    return desc
