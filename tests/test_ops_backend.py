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
