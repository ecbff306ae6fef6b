import pytest

from openjev.engines.models.source import EMBEDDED_NAME, embedded_gguf, gguf_cache_folder, resolve_source
from openjev.errors import ConfigError
from tests.support.models import EMBEDDED


def test_embedded_model_is_found_without_importing_its_package():
    path = embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    source = resolve_source(None)
    assert source.name == EMBEDDED_NAME and source.gguf_file == path.name
    assert resolve_source(EMBEDDED["model"]) == source  # `--model embedded` names it


@pytest.mark.parametrize("kind", ["missing", "not-gguf", "no-config"])
def test_unusable_model_paths_are_config_errors(tmp_path, kind):
    if kind == "missing":
        target = tmp_path / "nope"
    elif kind == "not-gguf":
        target = tmp_path / "weights.bin"
        target.write_bytes(b"x")
    else:
        target = tmp_path / "folder"
        target.mkdir()
    with pytest.raises(ConfigError):
        resolve_source(str(target))


def test_folder_and_gguf_sources(tmp_path):
    folder = tmp_path / "My Model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve_source(str(folder)).name == "my-model"
    # /v1/models shows the description: the model's name, never the local path
    assert resolve_source(str(folder)).description == "My Model"
    gguf = tmp_path / "tiny.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    source = resolve_source(str(gguf))
    assert source.gguf_file == "tiny.Q4.gguf" and source.name == "tiny.q4"
    assert str(tmp_path) not in source.description
    # the cache key follows the file's identity
    first = gguf_cache_folder(source, str(tmp_path / "cache"))
    gguf.write_bytes(b"GGUF changed")
    assert gguf_cache_folder(source, str(tmp_path / "cache")) != first


def _converted(folder):
    """A folder as a conversion leaves it: its files, then the record of their sizes and hashes."""
    import json

    from openjev.engines.models.converted import files_record

    folder.mkdir()
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "config.json").write_text("{}")
    (folder / ".openjev-complete").write_text(json.dumps({"source": "x.gguf", "files": files_record(folder)}))
    return folder


def test_a_converted_cache_is_checked_against_the_sizes_and_hashes_written(tmp_path):
    from openjev.engines.models.converted import cache_problem

    intact = _converted(tmp_path / "intact")
    assert cache_problem(intact) is None

    truncated = _converted(tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    problem = cache_problem(truncated)
    assert problem is not None and str(weights) in problem and "truncated" in problem

    flipped = _converted(tmp_path / "flipped")  # a sign bit flipped in place: same size
    weights = flipped / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[4003] ^= 0x80
    weights.write_bytes(bytes(data))
    problem = cache_problem(flipped)
    assert problem is not None and str(weights) in problem and "SHA-256" in problem

    missing = _converted(tmp_path / "missing")
    (missing / "config.json").unlink()
    assert "missing" in (cache_problem(missing) or "")

    added = _converted(tmp_path / "added")
    (added / "model-00002.safetensors").write_bytes(b"x")
    assert "not written by the conversion" in (cache_problem(added) or "")

    old = _converted(tmp_path / "old")  # what openjev wrote before it recorded hashes
    (old / ".openjev-complete").write_text("/some/model.gguf")
    assert "records no sizes and hashes" in (cache_problem(old) or "")


def test_preflight_refuses_a_cache_dir_that_is_a_file(tmp_path):
    from openjev.config import load_settings
    from openjev.engines.models.converted import preflight

    blocker = tmp_path / "cache"
    blocker.write_text("")
    for cache_dir in (blocker, blocker / "below"):
        with pytest.raises(ConfigError, match="is not a folder") as info:
            preflight(load_settings({**EMBEDDED, "cache_dir": str(cache_dir)}, environ={}).served)
        assert str(blocker) in str(info.value)
