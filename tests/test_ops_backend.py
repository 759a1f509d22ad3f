"""The ops backend's choice: made once, and readable from compiled code without warnings."""

import warnings

import torch

from tscale.ops.backend import _load, backend, kernels_available, kernels_usable_on


def test_choice_is_made_once_and_agrees_with_the_predicates():
    first = _load()
    assert _load() is first
    assert kernels_available() == first[0]
    assert kernels_usable_on("cpu") == first[0]
    assert kernels_usable_on("cuda") == first[1]
    assert kernels_usable_on("meta") is False
    assert backend() == first[2]


def test_compiled_code_reads_the_choice_without_a_dynamo_warning():
    def step(x: torch.Tensor) -> torch.Tensor:  # (3,)
        return x * 2 if kernels_usable_on("cuda") else x + 1

    x = torch.arange(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(step, backend="eager", fullgraph=True)(x)
    assert torch.equal(y, step(x))
    assert not [w for w in caught if "Dynamo" in str(w.message)], [str(w.message) for w in caught]


def test_compiled_code_takes_flex_attention_without_a_dynamo_warning():
    """Inside a compiled graph the CUDA flex path calls flex_attention itself (the graph compiles it), not the
    cached compiled wrapper that eager CUDA calls use, whose tracing Dynamo warns about."""
    from torch.nn.attention.flex_attention import flex_attention

    from tscale.ops.attention import _compiled_flex, _flex_function

    def pick(x: torch.Tensor) -> torch.Tensor:  # (3,)
        return x + 1 if _flex_function(True) is flex_attention else x - 1

    x = torch.arange(3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(pick, backend="eager", fullgraph=True)(x)
    assert torch.equal(y, x + 1)
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message) for w in caught]
    assert _flex_function(True) is _compiled_flex()  # eager CUDA calls keep the compiled one
    assert _flex_function(False) is flex_attention
