"""The `--precision` modes an inference benchmark runs, and with --with-head each low-precision one again with its head
converted (`--quantize-head`), named MODE+head."""

from tscale.precision import INFER_MODES

HEAD = "+head"


def modes_to_run(modes=INFER_MODES, with_head: bool = False) -> list[str]:
    """bf16 (the baseline) first, then the other modes, then (with_head) those again as MODE+head."""
    low = [m for m in modes if m != "bf16"]
    return ["bf16", *low, *([m + HEAD for m in low] if with_head else [])]


def precision_of(name: str) -> tuple[str, bool]:
    """(precision, quantize_head) of a mode name of modes_to_run."""
    return name.removesuffix(HEAD), name.endswith(HEAD)


def metric_key(name: str) -> str:
    """A mode name in metric names: int8-w+head -> int8_w_head."""
    return name.replace("-", "_").replace("+", "_")
