"""The C allocator's policy for CPU training: freed blocks of up to 32 MB kept for reuse, not returned to the kernel.

A CPU training step allocates and frees the same large tensors every step: autocast's bf16
copies of the weights, the float32 gradients, the activations. glibc's malloc adapts on its own:
a block above its mmap threshold (128 kB at first, raised toward 32 MB as such blocks are freed)
gets a fresh mapping, unmapped on free, and free memory at the top of the heap beyond twice that
threshold goes back to the kernel. With a step's mix of tensor sizes it keeps doing both, so a
step faults in pages the previous one gave back: a quarter of a 50M-parameter step on one core
(docs/BENCHMARKS.md, 1-bit Adam). With the threshold at its 32 MB ceiling and the heap trimmed
only past 1 GB of free memory, freed blocks stay on the heap and the next step reuses their pages.
A process-wide setting, made once.
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
