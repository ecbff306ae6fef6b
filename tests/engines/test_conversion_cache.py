"""The converted-weights cache is keyed by the GGUF's content and the converter: two copies of
one file (two clones' .venv) share one conversion, a changed file gets another; one process
converts a folder at a time; the record names the file it was converted from."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from openjev.engines.models import converted, source
from openjev.engines.models.converted import COMPLETE, ensure_converted, source_problem, write_complete
from openjev.engines.models.source import content_digest, converter_id, gguf_cache_folder, resolve_source

BYTES = b"GGUF" + bytes(range(256)) * 40


def _gguf(path: Path, data: bytes = BYTES) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_two_copies_of_one_file_share_one_folder_and_a_changed_file_gets_another(tmp_path):
    cache = str(tmp_path / "cache")
    first = resolve_source(str(_gguf(tmp_path / "clone-a" / ".venv" / "model.gguf")))
    second = resolve_source(str(_gguf(tmp_path / "clone-b" / ".venv" / "model.gguf")))
    assert first.folder != second.folder
    folder = gguf_cache_folder(first, cache)
    assert gguf_cache_folder(second, cache) == folder

    changed = bytearray(BYTES)
    changed[2000] ^= 0x01  # one bit, same size
    _gguf(second.folder / "model.gguf", bytes(changed))
    assert gguf_cache_folder(second, cache) != folder
    assert gguf_cache_folder(first, cache) == folder


def test_a_file_changed_with_its_mtime_set_back_is_read_again(tmp_path, monkeypatch):
    """The remembered digest is keyed by the copy's stamp, ctime included: `touch -d` cannot
    set the ctime back, so an edited file is hashed again."""
    monkeypatch.setattr(source, "_RACY_NS", 0)  # remember even a file written just now
    cache = str(tmp_path / "cache")
    (tmp_path / "cache" / "gguf").mkdir(parents=True)
    path = _gguf(tmp_path / "model.gguf")
    digest = content_digest(path, cache)
    memo = json.loads((tmp_path / "cache" / "gguf" / "digests.json").read_text())
    assert list(memo.values()) == [digest]
    st = path.stat()
    time.sleep(0.05)  # past the file clock's tick
    changed = bytearray(BYTES)
    changed[10] ^= 0x80
    path.write_bytes(bytes(changed))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size
    assert content_digest(path, cache) != digest


def test_a_remembered_digest_is_not_read_again(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "_RACY_NS", 0)
    cache = str(tmp_path / "cache")
    (tmp_path / "cache" / "gguf").mkdir(parents=True)
    path = _gguf(tmp_path / "model.gguf")
    digest = content_digest(path, cache)

    def no_read(*args, **kwargs):
        raise AssertionError("the file was read again")

    monkeypatch.setattr(source.hashlib, "file_digest", no_read)
    assert content_digest(path, cache) == digest


def test_a_file_written_just_now_is_not_remembered(tmp_path):
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    content_digest(_gguf(tmp_path / "model.gguf"), str(cache))
    assert not (cache / "gguf" / "digests.json").exists()


def test_reading_a_digest_creates_no_cache_folder(tmp_path, monkeypatch):
    """A server refused before it loads anything (a busy port) leaves no cache behind."""
    monkeypatch.setattr(source, "_RACY_NS", 0)
    content_digest(_gguf(tmp_path / "model.gguf"), str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


def test_another_converter_gets_another_folder(tmp_path, monkeypatch):
    src = resolve_source(str(_gguf(tmp_path / "model.gguf")))
    folder = gguf_cache_folder(src, str(tmp_path / "cache"))
    monkeypatch.setattr(source, "CONVERTER", source.CONVERTER + "-next")
    assert gguf_cache_folder(src, str(tmp_path / "cache")) != folder


def test_an_unwritable_digest_memo_is_no_error(tmp_path):
    (tmp_path / "cache").write_text("a file where the cache folder would be")
    path = _gguf(tmp_path / "model.gguf")
    assert len(content_digest(path, str(tmp_path / "cache"))) == 64


def _fake_conversion(calls: list[Path], started: threading.Event):
    """The converter's seam: writes what a conversion writes, slowly, counting the calls."""

    def convert(src, target: Path) -> Path:
        calls.append(target)
        started.set()
        time.sleep(0.5)

        def fill(tmp: Path) -> dict[str, str]:
            (tmp / "model.safetensors").write_bytes(b"weights")
            gguf = src.folder / src.gguf_file
            return {"source": str(gguf), "source_sha256": converted._sha256(gguf)}

        write_complete(target, fill)
        return target

    return convert


def test_two_processes_starting_at_once_convert_once(tmp_path, monkeypatch):
    """Two clones' servers starting together: the second waits on the folder's lock and finds
    the first's conversion (a flock lock excludes another open file, thread or process)."""
    calls: list[Path] = []
    started = threading.Event()
    monkeypatch.setattr(converted, "_convert_gguf", _fake_conversion(calls, started))
    cache = str(tmp_path / "cache")
    sources = [resolve_source(str(_gguf(tmp_path / f"clone-{n}" / "model.gguf"))) for n in "ab"]
    results: list[tuple[Path, bool]] = []
    first = threading.Thread(target=lambda: results.append(ensure_converted(sources[0], cache)))
    first.start()
    assert started.wait(10)
    results.append(ensure_converted(sources[1], cache))  # while the first still converts
    first.join()
    assert len(calls) == 1
    assert sorted(made for _, made in results) == [False, True]
    assert results[0][0] == results[1][0] == calls[0]
    assert json.loads((calls[0] / COMPLETE).read_text())["converter"] == converter_id()


def test_the_record_names_the_file_it_was_converted_from(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(converted, "_convert_gguf", _fake_conversion(calls, threading.Event()))
    cache = str(tmp_path / "cache")
    src = resolve_source(str(_gguf(tmp_path / "model.gguf")))
    folder, made = ensure_converted(src, cache)
    assert made and source_problem(folder, src, cache) is None

    record = json.loads((folder / COMPLETE).read_text())
    (folder / COMPLETE).write_text(json.dumps({**record, "source_sha256": "0" * 64}))
    assert source_problem(folder, src, cache) == "it was converted from another file"
    assert ensure_converted(src, cache) == (folder, True)  # converted again, not served

    record = json.loads((folder / COMPLETE).read_text())
    (folder / COMPLETE).write_text(json.dumps({**record, "converter": "another"}))
    assert "another converter" in (source_problem(folder, src, cache) or "")


def test_the_embedded_model_of_two_clones_maps_to_one_folder(tmp_path):
    """The real embedded GGUF, copied into two clones' places: one cache folder."""
    import shutil

    from openjev.engines.models.source import embedded_gguf

    cache = str(tmp_path / "cache")
    folders = set()
    for n in range(2):
        copy = tmp_path / f"clone-{n}" / ".venv" / "site-packages" / embedded_gguf().name
        copy.parent.mkdir(parents=True)
        shutil.copyfile(embedded_gguf(), copy)
        folders.add(gguf_cache_folder(resolve_source(str(copy)), cache))
    assert folders == {gguf_cache_folder(resolve_source(None), cache)}
