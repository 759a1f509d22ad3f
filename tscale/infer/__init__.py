"""Inference: the generation engine (KV cache, sampling, streaming) and batch prompt files."""

from tscale.infer.batch import Request, check_new_output, read_requests, write_completions
from tscale.infer.engine import Completion, Engine, GenerationParams, TextStream
from tscale.infer.sampling import SamplingParams, SettingError, filter_top_k, flag_name, filter_top_p, make_generator, sample_next

__all__ = [
    "Completion", "Engine", "GenerationParams", "Request", "SamplingParams", "SettingError", "TextStream",
    "check_new_output", "filter_top_k", "filter_top_p", "flag_name", "make_generator", "read_requests",
    "sample_next", "write_completions",
]
