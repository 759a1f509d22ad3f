"""CPU training's allocator policy: freed large blocks are reused, so a step's tensors stop faulting in new pages."""

import json
import subprocess
import sys

import pytest

# Like training steps: each round holds a transformer's weight-shaped float32 tensors (9 layers of
# 640 x 2560, 2560 x 640, 1920 x 640, 640 x 640 and an 8192 x 640 table: about 200 MB) and frees
# them all. Prints the minor page faults of each of 8 rounds.
PROBE = """
import json, resource, sys, torch
if sys.argv[1] == "reuse":
    from tscale.train.cpu_allocator import reuse_freed_blocks
    assert reuse_freed_blocks()
shapes = [(640, 2560), (2560, 640), (1920, 640), (640, 640), (8192, 640)] * 9
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.ones(shape) for shape in shapes]
    del held
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt (Linux)")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    default, reuse = _faults("default"), _faults("reuse")
    pages = 200 * (1 << 20) // 4096  # about one round's pages
    assert default[1] > pages // 2  # glibc gave the first round's memory back: the second faults it in again
    assert reuse[1] < pages // 8  # kept on the heap: the second round finds its pages in place
    assert sum(reuse[2:]) < pages // 8  # and so does every later one
