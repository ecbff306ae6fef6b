"""A GGUF's weights converted for transformers, once, and checked at every load.

GGUF files are dequantised by transformers (through `gguf`), which takes ~20 s for the
embedded model on a laptop CPU; the converted weights are cached as safetensors under the
cache folder (source.gguf_cache_folder), keyed by the file's content and the converter, so
later starts load in well under a second, and every copy of the file on the machine (each
clone's .venv) shares one conversion. The conversion records the GGUF's SHA-256, the
converter, and every file's size and SHA-256 (in `.openjev-complete`); each load checks them,
and a cache that differs (truncated, edited, from an older openjev) is converted again, never
served as it is. One process converts a folder at a time (a lock file beside it), and a
folder appears whole or not at all (renamed into place). Nothing here touches the network.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from openjev.config import ServedSettings
from openjev.engines.models.source import (
    WEIGHT_SUFFIXES,
    ModelSource,
    check_cache_dir,
    check_writable,
    content_digest,
    converter_id,
    gguf_cache_folder,
    resolve_source,
)
from openjev.errors import ConfigError

log = logging.getLogger(__name__)

COMPLETE = ".openjev-complete"  # the record a finished conversion writes


def preflight(served: ServedSettings) -> None:
    """Fail fast on a model setting that cannot load (missing path, wrong kind of file) and,
    for a GGUF, on a cache folder that could never hold its conversion (found before the
    conversion's seconds are spent, not after)."""
    source = resolve_source(served.model, served.cache_dir)
    if source.gguf_file is not None:
        check_cache_dir(served.cache_dir)
        if not (gguf_cache_folder(source, served.cache_dir) / COMPLETE).exists():
            check_writable(served.cache_dir)  # a read-only cache serves what it already holds


def load_model_and_tokenizer(source: ModelSource, *, cache_dir: str, dtype, device: str):
    """(model, tokenizer, from_cache). The model is in eval mode on `device`.

    A cached conversion is loaded while its hashes are checked on another thread (hashing
    releases the GIL), so the check costs little wall time beside the load; a cache whose
    sizes or hashes differ from the record is thrown away and converted again."""
    if source.gguf_file is None:
        return (*_load_folder(source.folder, dtype, device), False)
    cached = gguf_cache_folder(source, cache_dir)
    problem = None
    if (cached / COMPLETE).exists():
        # instant: a truncated file is never handed to the loader
        problem = sizes_problem(cached) or source_problem(cached, source, cache_dir)
        if problem is None:
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="openjev-cache-check") as pool:
                checking = pool.submit(hashes_problem, cached)
                try:
                    loaded, load_error = _load_folder(cached, dtype, device), None
                except Exception as e:  # noqa: BLE001 - decided below, once the check has spoken
                    loaded, load_error = None, e
                problem = checking.result()
            if problem is None:
                if loaded is None:
                    raise load_error or RuntimeError(f"{cached} did not load")
                return (*loaded, True)
            del loaded
        log.warning("converted-weights cache %s is not what was converted (%s): converting again", cached, problem)
    try:
        folder, _ = _convert_once(source, cached, cache_dir)
    except OSError as e:
        why = f"is damaged ({problem}) and" if problem else "is not there and"
        raise ConfigError(
            f"converted-weights cache {cached} {why} cannot be written: {e.strerror or e} "
            "(fix or delete it, or pass another --cache-dir)"
        ) from None
    return (*_load_folder(folder, dtype, device), False)


def ensure_converted(source: ModelSource, cache_dir: str) -> tuple[Path, bool]:
    """(converted folder, whether it was converted now): a GGUF's conversion, made once
    (`openjev model install`); a cache whose record's sizes match is kept (each load checks
    its hashes)."""
    cached = gguf_cache_folder(source, cache_dir)
    if (cached / COMPLETE).exists() and (sizes_problem(cached) or source_problem(cached, source, cache_dir)) is None:
        return cached, False
    return _convert_once(source, cached, cache_dir)


@contextmanager
def locked(target: Path) -> Iterator[None]:
    """`target` written by one process at a time (two clones' servers, or two tests, starting
    at once): an exclusive lock on a file beside it, held for the block."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_once(source: ModelSource, target: Path, cache_dir: str) -> tuple[Path, bool]:
    """(folder, whether converted now), under the folder's lock: the conversion another
    process completed while this one waited (checked whole), or a conversion now."""
    with locked(target):
        if (target / COMPLETE).exists() and (
            cache_problem(target) or source_problem(target, source, cache_dir)
        ) is None:
            return target, False
        return _convert_gguf(source, target), True


def source_problem(folder: Path, source: ModelSource, cache_dir: str) -> str | None:
    """Why `folder`'s record does not name this GGUF's content and this converter, or None."""
    try:
        record = json.loads((folder / COMPLETE).read_text())
    except (OSError, ValueError):
        return "its record cannot be read"
    if not isinstance(record, dict) or record.get("converter") != converter_id():
        return "it was converted by another converter, or an older openjev"
    if record.get("source_sha256") != content_digest(source.folder / (source.gguf_file or ""), cache_dir):
        return "it was converted from another file"
    return None


def _load_folder(folder: Path, dtype, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    model.to(torch.device(device)).eval()  # type: ignore[arg-type]  # transformers' stub types .to() wrongly
    return model, tokenizer


def _convert_gguf(source: ModelSource, target: Path) -> Path:
    """Dequantise a GGUF once and write it as a float32 safetensors folder (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors (once; cached in %s)", source.gguf_file, target)
    model = AutoModelForCausalLM.from_pretrained(
        source.folder, gguf_file=source.gguf_file, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file, local_files_only=True)
    # The weights are plain float32 now; transformers refuses to save while it still
    # believes them GGUF-quantised.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    gguf_file = source.gguf_file or ""

    def fill(tmp: Path) -> dict[str, str]:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # the GGUF's bytes as read now: a file changed since it was keyed is found at load
        return {"source": str(source.folder / gguf_file), "source_sha256": _sha256(source.folder / gguf_file)}

    write_complete(target, fill)
    return target


def write_complete(target: Path, fill: Callable[[Path], dict[str, str]]) -> None:
    """`fill(folder)` writes the files into a temporary sibling of `target` and returns what
    the record adds beside the files' sizes and hashes; the record (COMPLETE) is written last,
    then the folder renamed into place: a folder at `target` is either complete or absent."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        record = {"converter": converter_id(), **fill(tmp)}
        (tmp / COMPLETE).write_text(json.dumps({**record, "files": files_record(tmp)}, indent=1))
        if target.exists():  # an incomplete or damaged earlier copy
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def files_record(folder: Path) -> dict[str, dict[str, int | str]]:
    """Size and SHA-256 of every file a conversion wrote (what each load checks)."""
    return {
        f.name: {"size": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != COMPLETE
    }


def cache_problem(folder: Path) -> str | None:
    """Why the converted folder is not what its conversion wrote, or None if every recorded
    file has its recorded size and SHA-256 and no unrecorded weight file was added.

    Sizes first (a truncated file is found without reading it), then hashes: a tensor
    edited in place (a flipped sign) keeps the size and changes the hash. The hashes read
    every byte once (bench/bench_cache_check.py measures it beside the warm load).
    """
    return sizes_problem(folder) or hashes_problem(folder)


def _recorded(folder: Path) -> dict[str, dict]:
    record = json.loads((folder / COMPLETE).read_text())
    files = record["files"]
    if not isinstance(files, dict) or not files:
        raise ValueError("no files")
    return files


def sizes_problem(folder: Path) -> str | None:
    """The record's presence, each recorded file's presence and size, no unrecorded weights."""
    try:
        files = _recorded(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return "it records no sizes and hashes (converted by an older openjev, or the record is damaged)"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != want.get("size"):
            return f"{path} has {size} bytes, {want.get('size')} were written (truncated or replaced)"
    extra = sorted(
        f.name for f in folder.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES) and f.name not in files
    )
    if extra:
        return f"{folder / extra[0]} was not written by the conversion"
    return None


def hashes_problem(folder: Path) -> str | None:
    """Each recorded file's SHA-256 (run after sizes_problem found nothing)."""
    try:
        files = _recorded(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return "it records no sizes and hashes (converted by an older openjev, or the record is damaged)"
    for name, want in files.items():
        try:
            digest = _sha256(folder / name)
        except OSError as e:
            return f"{folder / name} cannot be read: {e.strerror or e}"
        if digest != want.get("sha256"):
            return f"{folder / name} has another SHA-256 than was written (the file was changed)"
    return None
