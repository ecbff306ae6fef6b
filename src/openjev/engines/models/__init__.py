"""Where a model comes from and how its files are made ready: sources and fingerprints
(source.py), the named registry models (named.py, pins/), a GGUF's one conversion for
transformers (converted.py), the chat tokenizer every engine shares (tokenizer.py).
"""
