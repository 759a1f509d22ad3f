"""fp8 / int8 linear layers and their scaling: training recipes (convert_linears) and inference conversion."""

from tscale.precision.inference import INFER_MODES, QuantizedLinear, quantize_for_inference, store_linears_in
from tscale.precision.linear import LowPrecLinear, convert_linears, convert_linears_as_configured, lowprec_matmul
from tscale.precision.recipes import RECIPES, TRAIN_RECIPES, Recipe, get_recipe

__all__ = ["INFER_MODES", "RECIPES", "TRAIN_RECIPES", "LowPrecLinear", "lowprec_matmul", "QuantizedLinear", "Recipe",
           "convert_linears", "convert_linears_as_configured", "get_recipe", "quantize_for_inference", "store_linears_in"]
