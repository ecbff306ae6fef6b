"""An Ollama model store on disk, laid out as Ollama writes it (manifests/ and blobs/), for
tests of engines/models/ollama.py: real files, parsed by the real code."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

MODEL = "application/vnd.ollama.image.model"


def add_model(
    root: Path,
    name: str,
    tag: str,
    gguf: bytes | Path,
    *,
    namespace: str = "library",
    host: str = "registry.ollama.ai",
    extra_layers: tuple[dict, ...] = (),
) -> Path:
    """Put `gguf` (bytes, or a file linked or copied in) into the store's blobs under its
    SHA-256, and a manifest naming it for `name:tag`; returns the blob's path."""
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    if isinstance(gguf, Path):
        with open(gguf, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        blob = blobs / f"sha256-{digest}"
        if not blob.exists():
            try:
                os.link(gguf, blob)  # the same bytes without copying (Ollama's blobs are plain files)
            except OSError:
                shutil.copyfile(gguf, blob)
    else:
        digest = hashlib.sha256(gguf).hexdigest()
        blob = blobs / f"sha256-{digest}"
        blob.write_bytes(gguf)
    config = b'{"model_format":"gguf"}'
    (blobs / f"sha256-{hashlib.sha256(config).hexdigest()}").write_bytes(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
            "size": len(config),
        },
        "layers": [
            {"mediaType": MODEL, "digest": f"sha256:{digest}", "size": blob.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
            *extra_layers,
        ],
    }
    path = root / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob
