"""Ollama store names (engines/models/ollama.py) over stores laid out on disk in tmp_path
(tests/support/ollama_store.py): the name's parse, its manifest to its GGUF blob, and the
errors a caller sees for a name, tag or blob that is not there."""

from __future__ import annotations

import json

import pytest

from openjev.engines.models import ollama
from openjev.engines.models.source import resolve_source
from openjev.errors import ConfigError
from tests.support.ollama_store import add_model

GGUF = b"GGUF" + bytes(range(256)) * 4


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "ollama"
    add_model(root, "smollm2", "135m", GGUF)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("smollm2", ("registry.ollama.ai", "library", "smollm2", "latest")),
        ("smollm2:135m", ("registry.ollama.ai", "library", "smollm2", "135m")),
        (
            "qwen2.5-coder:1.5b-instruct-q4_K_M",
            ("registry.ollama.ai", "library", "qwen2.5-coder", "1.5b-instruct-q4_K_M"),
        ),
        ("someone/model:v1", ("registry.ollama.ai", "someone", "model", "v1")),
        ("example.com/team/model:7b", ("example.com", "team", "model", "7b")),
    ],
)
def test_names_parse_as_ollama_reads_them(text, parts):
    name = ollama.parse_name(text)
    assert name is not None and (name.host, name.namespace, name.model, name.tag) == parts


@pytest.mark.parametrize("text", ["", "a:b:c", "../etc:passwd", "a/../b", "/abs/model", "model:", "a/b/c/d"])
def test_what_cannot_be_a_name_is_none(text):
    assert ollama.parse_name(text) is None


def test_short_names_print_as_ollama_list_shows_them():
    assert str(ollama.parse_name("smollm2")) == "smollm2:latest"
    assert str(ollama.parse_name("someone/model:v1")) == "someone/model:v1"
    assert str(ollama.parse_name("example.com/team/model:7b")) == "example.com/team/model:7b"


def test_the_store_is_ollamas_env_or_its_default(tmp_path, monkeypatch):
    assert ollama.store_root({"OLLAMA_MODELS": str(tmp_path)}) == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ollama.store_root({}) == tmp_path / ".ollama" / "models"


def test_a_name_resolves_to_its_model_blob(store):
    found = ollama.resolve(ollama.parse_name("smollm2:135m"), store)
    assert found.gguf.read_bytes() == GGUF and found.gguf.parent == store / "blobs"
    source = resolve_source("smollm2:135m")
    assert source.folder / (source.gguf_file or "") == found.gguf
    assert source.name == "smollm2:135m" and "Ollama" in source.description


def test_a_path_that_exists_is_a_path_first(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2:135m").write_bytes(GGUF)  # a file of that name: --model means it
    with pytest.raises(ConfigError, match=r"must be a \.gguf"):
        resolve_source("smollm2:135m")


def test_an_unknown_tag_names_the_tags_there(store):
    add_model(store, "smollm2", "360m", GGUF + b"x")
    with pytest.raises(ConfigError, match=r"no tag '1\.7b' of 'smollm2' \(it has: 135m, 360m;"):
        resolve_source("smollm2:1.7b")


def test_an_unknown_name_says_neither_file_nor_model(store):
    with pytest.raises(ConfigError, match="no such file or folder, nor a model in Ollama's store"):
        resolve_source("llama3:8b")


def test_without_a_store_the_error_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"no such file or folder, nor an Ollama store at .*absent"):
        resolve_source("smollm2:135m")


def test_a_missing_blob_is_named(store):
    blob = ollama.resolve(ollama.parse_name("smollm2:135m"), store).gguf
    blob.unlink()
    with pytest.raises(ConfigError, match=rf"model blob {blob} is missing .*ollama pull smollm2:135m"):
        resolve_source("smollm2:135m")


def test_a_truncated_blob_is_refused(store):
    blob = ollama.resolve(ollama.parse_name("smollm2:135m"), store).gguf
    blob.write_bytes(GGUF[:100])
    with pytest.raises(ConfigError, match=f"has 100 bytes, the manifest says {len(GGUF)}"):
        resolve_source("smollm2:135m")


def test_a_manifest_without_one_model_layer_is_refused(store):
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    body = json.loads(manifest.read_text())
    body["layers"] = [layer for layer in body["layers"] if layer["mediaType"] != ollama.MODEL_MEDIA_TYPE]
    manifest.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="has 0 model layers, not one"):
        resolve_source("smollm2:135m")
    manifest.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        resolve_source("smollm2:135m")


def test_a_digest_cannot_point_outside_the_blobs(store):
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    body = json.loads(manifest.read_text())
    body["layers"][0]["digest"] = "sha256:../../etc/passwd"
    manifest.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match="names no sha256 digest"):
        resolve_source("smollm2:135m")
