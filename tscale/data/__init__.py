"""Data: tokenizer, the token shard format, tokenization of text, resumable loaders."""
