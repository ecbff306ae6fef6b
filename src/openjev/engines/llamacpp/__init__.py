"""The llama.cpp engine: GGUF files as shipped, in-process through llama-cpp-python (engine.py,
its loader load.py), the trie as one batch (layout.py), the prefix cache (cache.py) and the
binding seam (lib.py).
"""
