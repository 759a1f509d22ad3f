"""The only door to kernels: each op has a pure-torch reference and, when built, a tscale._C kernel.

`tscale.ops.backend()` says once which implementation the library uses. Set the environment
variable TSCALE_OPS=reference to force the references (tests compare the two this way).
"""

from tscale.ops.backend import backend, kernels_available
from tscale.ops.bitpack import (pack_signs, pack_signs_feedback_, pack_signs_feedback_add_, unpack_signs,
                                unpack_signs_accumulate_, unpack_signs_into_)

__all__ = ["backend", "kernels_available", "pack_signs", "pack_signs_feedback_", "pack_signs_feedback_add_", "unpack_signs",
           "unpack_signs_accumulate_", "unpack_signs_into_"]
