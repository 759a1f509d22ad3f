"""The C allocator's policy for CPU training: freed blocks of up to 32 MB kept for reuse, not unmapped.

A CPU training step allocates and frees the same large tensors every step: autocast's bf16
copies of the weights, the float32 gradients, the activations. glibc's malloc serves a block
above its mmap threshold (128 kB at first, adapting up to 32 MB) with a fresh mapping and unmaps
it on free, so every step touches new pages, and the kernel's page faults and zeroing for them
cost a quarter of a 50M-parameter step on one core (docs/BENCHMARKS.md, 1-bit Adam). With the
threshold at its 32 MB ceiling and the heap trimmed only past 1 GB of free memory, freed blocks
go back to the heap and the next step reuses their pages. A process-wide setting, made once.
"""

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the largest value glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30

_applied: bool | None = None


def reuse_freed_blocks() -> bool:
    """Set glibc's thresholds (see the module docstring); False where there is no glibc (macOS, musl)."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
