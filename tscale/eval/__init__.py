"""Evaluation: validation loss / perplexity / bits per byte by source, and loss-curve plots."""

from tscale.eval.perplexity import check_same_tokenizer, evaluate, evaluate_checkpoint, run_dir_of, unigram_log_probs, windows
from tscale.eval.plot import plot_curves, read_curves

__all__ = ["check_same_tokenizer", "evaluate", "evaluate_checkpoint", "plot_curves", "read_curves", "run_dir_of",
           "unigram_log_probs", "windows"]
