"""The in-process PyTorch engine (transformers models on CPU or CUDA): the engine and its
loader (engine.py), the scheduler that batches concurrent requests (scheduler.py), ragged
forwards over cached KV (kv.py, packing.py), the cost model and the prefix joins.
"""
