import pytest

from openjev.engines.hf_model import EMBEDDED_NAME, embedded_gguf, gguf_cache_folder, resolve_source
from openjev.errors import ConfigError


def test_embedded_model_is_found_without_importing_its_package():
    path = embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    source = resolve_source(None)
    assert source.name == EMBEDDED_NAME and source.gguf_file == path.name


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
