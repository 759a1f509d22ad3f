"""The training recipes: which dtype each product's operands take and how their scales are laid out.

A recipe names the dtype of activations and weights in the forward product, the dtype of the
output gradient in the two backward products (None: the backward runs in the autocast dtype,
from the high-precision activations and weights), and the scale granularity: one scale per
tensor, or one per row of the left operand and one per column of the right operand of each
product (per token and per output channel in the forward product). docs/lowprec.md has the
details and the reasons.

The switchback recipes (int8_switchback, fp8_switchback) run the forward and the input-gradient
products in low precision with one scale per row of both operands, and the weight-gradient
product in the compute dtype: no product contracts over the tokens, so no activation or
gradient is quantised along a column or transposed, and every quantisation is a row reduction
that torch.compile can fold into the kernel making the row (the norm, the activation, the
residual gradient). Their quantisation is always written as torch ops (graph_matmul.py).
"""

from dataclasses import dataclass, replace

import torch

from tscale.errors import UserError


@dataclass(frozen=True)
class Recipe:
    name: str
    fwd_dtype: torch.dtype
    grad_dtype: torch.dtype | None
    rowwise: bool
    fast_accum: bool = False  # fp8 fast accumulation in the forward product (the backward's stay exact)
    in_graph: bool = False  # quantisation as traceable torch ops (precision/graph_matmul.py), not the custom op
    lowp_weight_grad: bool = True  # False: the weight-gradient product runs in the compute dtype (switchback)
    delayed_history: int = 0  # > 0: delayed scaling over that many calls' amax (precision/delayed.py); 0: dynamic


RECIPES: dict[str, Recipe] = {
    "fp8_tensorwise": Recipe("fp8_tensorwise", torch.float8_e4m3fn, torch.float8_e5m2, rowwise=False),
    "fp8_rowwise": Recipe("fp8_rowwise", torch.float8_e4m3fn, torch.float8_e4m3fn, rowwise=True),
    "int8_rowwise": Recipe("int8_rowwise", torch.int8, None, rowwise=True),
    "int8_switchback": Recipe("int8_switchback", torch.int8, torch.int8, rowwise=True, in_graph=True,
                              lowp_weight_grad=False),
    "fp8_switchback": Recipe("fp8_switchback", torch.float8_e4m3fn, torch.float8_e4m3fn, rowwise=True, in_graph=True,
                             lowp_weight_grad=False),
}
TRAIN_RECIPES = ("bf16", *RECIPES)


def get_recipe(name: str, int8_backward: bool = False, fp8_fast_accum: bool = False,
               quantize_in_graph: bool = False, delayed_history: int = 0) -> Recipe | None:
    """The recipe called `name`; None for "bf16" (plain nn.Linear under the configured autocast).

    delayed_history > 0: fp8_tensorwise with delayed scaling over that many calls (precision.scaling)."""
    if delayed_history and (name != "fp8_tensorwise" or quantize_in_graph):
        raise UserError(f'precision.scaling = "delayed" needs precision.recipe = "fp8_tensorwise" without '
                        f'precision.quantize_in_graph (got "{name}"{", in graph" if quantize_in_graph else ""})')
    if fp8_fast_accum and not name.startswith("fp8"):
        raise UserError(f'precision.fp8_fast_accum needs an fp8 recipe (got "{name}")')
    if quantize_in_graph and name != "fp8_tensorwise":
        raise UserError(f'precision.quantize_in_graph needs precision.recipe = "fp8_tensorwise" (got "{name}"; '
                        'the switchback recipes always quantise in the graph)')
    if name == "bf16":
        if int8_backward:
            raise UserError('precision.int8_backward needs precision.recipe = "int8_rowwise"')
        return None
    if name not in RECIPES:
        raise UserError(f"precision.recipe {name!r}: expected one of {', '.join(TRAIN_RECIPES)}")
    recipe = RECIPES[name]
    if int8_backward:
        if name != "int8_rowwise":
            raise UserError('precision.int8_backward needs precision.recipe = "int8_rowwise"')
        return Recipe("int8_rowwise+int8_backward", torch.int8, torch.int8, rowwise=True)
    suffix = ("+fast_accum" if fp8_fast_accum else "") + ("+in_graph" if quantize_in_graph else "") + (
        f"+delayed{delayed_history}" if delayed_history else "")
    if suffix:
        return replace(recipe, name=name + suffix, fast_accum=fp8_fast_accum,
                       in_graph=recipe.in_graph or quantize_in_graph, delayed_history=delayed_history)
    return recipe
