"""TScale: train and run GPT-style transformers fast on GPUs people can own."""

__version__ = "0.1.0"
