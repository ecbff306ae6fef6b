"""GGUF -> safetensors conversion is cached: the second load is fast and identical."""

import time

import torch

from openjev.engines.hf_model import gguf_cache_folder, load_model_and_tokenizer, resolve_source


def test_cold_conversion_then_warm_load_from_cache(tmp_path):
    source = resolve_source(None)
    cache = str(tmp_path / "cache")
    t0 = time.perf_counter()
    cold, tok, from_cache = load_model_and_tokenizer(source, cache_dir=cache, dtype=torch.float32, device="cpu")
    cold_s = time.perf_counter() - t0
    assert not from_cache
    assert (gguf_cache_folder(source, cache) / ".openjev-complete").exists()
    t0 = time.perf_counter()
    warm, tok2, from_cache = load_model_and_tokenizer(source, cache_dir=cache, dtype=torch.float32, device="cpu")
    warm_s = time.perf_counter() - t0
    assert from_cache
    print(f"cold load {cold_s:.1f} s, warm load {warm_s:.1f} s")
    ids = torch.tensor([tok("The parcel arrived late.", add_special_tokens=False)["input_ids"]])
    assert tok2("The parcel arrived late.", add_special_tokens=False)["input_ids"] == ids[0].tolist()
    assert tok.chat_template == tok2.chat_template
    with torch.inference_mode():
        assert torch.equal(cold(ids).logits, warm(ids).logits)
