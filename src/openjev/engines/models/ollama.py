"""Models in a local Ollama store, by Ollama's names (`--model qwen2.5:1.5b`): served from the
GGUF blob the name's manifest points to, as it is (nothing is copied or downloaded).

The store's layout (Ollama's own, under $OLLAMA_MODELS, default ~/.ollama/models):

    manifests/registry.ollama.ai/library/NAME/TAG     a JSON manifest, one per pulled tag
    blobs/sha256-<64 hex>                             content-addressed files

A name is `[[HOST/]NAMESPACE/]NAME[:TAG]` (HOST registry.ollama.ai, NAMESPACE library and
TAG latest where left out, as `ollama run` reads it). The manifest's `layers` list one layer
of mediaType `application/vnd.ollama.image.model`, whose `digest` (`sha256:<hex>`) names the
GGUF blob and whose `size` is that file's size, checked here (the content hash is not: it
would read gigabytes at every start; Ollama checked it when it pulled). Nothing here imports
an ML framework or touches the network.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from openjev.errors import ConfigError

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# Ollama's own name rules, loosely: path parts of letters, digits, '.', '_', '-', and a tag
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME = re.compile(
    rf"^(?:(?:(?P<host>{_PART})/)?(?P<ns>{_PART})/)?(?P<model>{_PART})(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}))?$"
)
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        """The short form `ollama list` shows: `model:tag`, with a namespace other than library."""
        short = self.model if self.namespace == DEFAULT_NAMESPACE else f"{self.namespace}/{self.model}"
        return (
            f"{short}:{self.tag}"
            if self.host == DEFAULT_HOST
            else f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        )


@dataclass(frozen=True)
class OllamaModel:
    name: OllamaName
    gguf: Path  # the model layer's blob


def store_root(environ: Mapping[str, str] | None = None) -> Path:
    """$OLLAMA_MODELS where set, else ~/.ollama/models (Ollama's default)."""
    env = os.environ if environ is None else environ
    given = env.get("OLLAMA_MODELS")
    return Path(given).expanduser() if given else Path.home() / ".ollama" / "models"


def parse_name(text: str) -> OllamaName | None:
    """`text` as an Ollama name, or None where it cannot be one."""
    m = _NAME.match(text)
    if m is None or ".." in text:
        return None
    return OllamaName(
        host=m["host"] or DEFAULT_HOST,
        namespace=m["ns"] or DEFAULT_NAMESPACE,
        model=m["model"],
        tag=m["tag"] or DEFAULT_TAG,
    )


def resolve(name: OllamaName, root: Path) -> OllamaModel:
    """The GGUF blob `name`'s manifest names in the store at `root`. ConfigError, saying what
    is there instead, for a name or tag not pulled, a manifest without a model layer, or a
    blob that is missing or of another size than the manifest says."""
    model_dir = root / "manifests" / name.host / name.namespace / name.model
    manifest = model_dir / name.tag
    if not manifest.is_file():
        if model_dir.is_dir():
            tags = sorted(p.name for p in model_dir.iterdir() if p.is_file())
            raise ConfigError(
                f"--model {name}: Ollama's store at {root} has no tag {name.tag!r} of {name.model!r}"
                f" (it has: {', '.join(tags) or 'none'}; `ollama pull {name}` fetches it)"
            )
        raise ConfigError(
            f"--model {name}: no such file or folder, nor a model in Ollama's store at {root}"
            " (`ollama list` shows what is there; models are never downloaded)"
        )
    try:
        layers = json.loads(manifest.read_text())["layers"]
        model_layers = [layer for layer in layers if layer.get("mediaType") == MODEL_MEDIA_TYPE]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"--model {name}: the Ollama manifest {manifest} cannot be read ({e})") from None
    if len(model_layers) != 1:
        raise ConfigError(
            f"--model {name}: the Ollama manifest {manifest} has {len(model_layers)} model layers, not one"
            " (an adapter-only or a multi-file model is not served)"
        )
    layer = model_layers[0]
    digest = _DIGEST.match(str(layer.get("digest", "")))
    if digest is None:
        raise ConfigError(f"--model {name}: the Ollama manifest {manifest} names no sha256 digest for its model")
    blob = root / "blobs" / f"sha256-{digest[1]}"
    if not blob.is_file():
        raise ConfigError(
            f"--model {name}: its model blob {blob} is missing from Ollama's store (`ollama pull {name}` again)"
        )
    size, want = blob.stat().st_size, layer.get("size")
    if isinstance(want, int) and size != want:
        raise ConfigError(
            f"--model {name}: its model blob {blob} has {size} bytes, the manifest says {want}"
            f" (an interrupted pull? `ollama pull {name}` again)"
        )
    return OllamaModel(name, blob)
