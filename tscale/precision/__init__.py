"""fp8 / int8 linear layers and their scaling: training recipes (convert_linears) and inference conversion."""

from tscale.precision.inference import INFER_MODES, QuantizedLinear, quantize_for_inference
from tscale.precision.linear import LowPrecLinear, lowprec_matmul, convert_linears
from tscale.precision.recipes import RECIPES, TRAIN_RECIPES, Recipe, get_recipe

__all__ = ["INFER_MODES", "RECIPES", "TRAIN_RECIPES", "LowPrecLinear", "lowprec_matmul", "QuantizedLinear", "Recipe",
           "convert_linears", "get_recipe", "quantize_for_inference"]
