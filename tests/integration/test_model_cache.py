"""GGUF -> safetensors conversion is cached: the second load reads the cached folder without
converting again, and gives the same model. (How much faster that is is measured by
bench/bench_startup.py, not asserted here.)"""

import pytest
import torch

from openjev.engines.models import converted
from openjev.engines.models.converted import load_model_and_tokenizer
from openjev.engines.models.source import gguf_cache_folder, resolve_source


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

    monkeypatch.setattr(converted, "_convert_gguf", no_conversion)
    warm, tok2, from_cache = load_model_and_tokenizer(source, cache_dir=cache, dtype=torch.float32, device="cpu")
    assert from_cache
    assert warm.name_or_path == str(folder)  # the weights came from the cache folder
    ids = torch.tensor([tok("The parcel arrived late.", add_special_tokens=False)["input_ids"]])
    assert tok2("The parcel arrived late.", add_special_tokens=False)["input_ids"] == ids[0].tolist()
    assert tok.chat_template == tok2.chat_template
    with torch.inference_mode():
        assert torch.equal(cold(ids).logits, warm(ids).logits)


def test_a_cache_edited_in_place_is_not_served(tmp_path, monkeypatch, caplog):
    """A sign flipped in one weight (same size: only the hash tells) is found at load, while
    the model loads beside the check, and the cache is converted again instead of served."""
    import shutil

    from openjev.config import load_settings
    from openjev.engines.models.converted import cache_problem

    source = resolve_source(None)
    folder = gguf_cache_folder(source, str(tmp_path / "cache"))
    user_cache = gguf_cache_folder(source, load_settings(environ={}).served.cache_dir)
    if cache_problem(user_cache) is None:
        shutil.copytree(user_cache, folder)
    else:
        load_model_and_tokenizer(source, cache_dir=str(tmp_path / "cache"), dtype=torch.float32, device="cpu")
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as fh:  # one high bit of a weight near the middle of the file
        fh.seek((weights.stat().st_size // 8) * 4 + 3)
        byte = fh.read(1)[0]
        fh.seek(-1, 1)
        fh.write(bytes([byte ^ 0x80]))

    class Converted(Exception):
        pass

    def convert(src, target):
        assert target == folder
        raise Converted

    monkeypatch.setattr(converted, "_convert_gguf", convert)
    with pytest.raises(Converted):
        load_model_and_tokenizer(source, cache_dir=str(tmp_path / "cache"), dtype=torch.float32, device="cpu")
    assert any(str(weights) in r.getMessage() and "SHA-256" in r.getMessage() for r in caplog.records)
