"""GGUF -> safetensors conversion is cached: the second load reads the cached folder without
converting again, and gives the same model. (How much faster that is is measured by
bench/bench_startup.py, not asserted here.)"""

import torch

from openjev.engines import hf_model
from openjev.engines.hf_model import gguf_cache_folder, load_model_and_tokenizer, resolve_source


def test_cold_conversion_then_warm_load_from_cache(tmp_path, monkeypatch):
    source = resolve_source(None)
    cache = str(tmp_path / "cache")
    cold, tok, from_cache = load_model_and_tokenizer(source, cache_dir=cache, dtype=torch.float32, device="cpu")
    assert not from_cache
    folder = gguf_cache_folder(source, cache)
    assert (folder / ".openjev-complete").exists()
    assert any(folder.glob("*.safetensors"))

    def no_conversion(*args, **kwargs):
        raise AssertionError("the warm load converted the GGUF again")

    monkeypatch.setattr(hf_model, "_convert_gguf", no_conversion)
    warm, tok2, from_cache = load_model_and_tokenizer(source, cache_dir=cache, dtype=torch.float32, device="cpu")
    assert from_cache
    assert warm.name_or_path == str(folder)  # the weights came from the cache folder
    ids = torch.tensor([tok("The parcel arrived late.", add_special_tokens=False)["input_ids"]])
    assert tok2("The parcel arrived late.", add_special_tokens=False)["input_ids"] == ids[0].tolist()
    assert tok.chat_template == tok2.chat_template
    with torch.inference_mode():
        assert torch.equal(cold(ids).logits, warm(ids).logits)
