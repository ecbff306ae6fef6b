"""A GGUF's Hugging Face tokenizer for an engine that never converts the weights (llama.cpp).

transformers builds a GGUF's tokenizer from the file's metadata: seconds for a 150k-token
vocabulary, on every start. So the first start saves what it built into the cache folder,
beside the weights' conversion and keyed like it (`tokenizer_cache_folder`: the GGUF's
content and the converter), with the size and SHA-256 of every file written (the conversion's
record, converted.py); later starts load that folder, checked against its record. Where the weights
were converted already (`openjev model install`), the conversion's own tokenizer is the same
one and is used as it is. A cache that cannot be written is not an error: the tokenizer is
then built again next time.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from openjev.engines.models.converted import COMPLETE, cache_problem, locked, sizes_problem, write_complete
from openjev.engines.models.source import ModelSource, gguf_cache_folder

log = logging.getLogger(__name__)


def tokenizer_cache_folder(source: ModelSource, cache_dir: str) -> Path:
    """Where the GGUF's tokenizer is saved: beside its conversion's folder, the same key."""
    converted = gguf_cache_folder(source, cache_dir)
    return converted.with_name(converted.name + "-tokenizer")


def load_gguf_tokenizer(source: ModelSource, cache_dir: str):
    """The tokenizer of `source` (a GGUF), as the in-process PyTorch engine loads it: from the
    saved copy, or the conversion's, where one is complete; else built from the GGUF and
    saved for the next start."""
    saved = tokenizer_cache_folder(source, cache_dir)
    if (saved / COMPLETE).exists():
        problem = cache_problem(saved)  # a few MB: hashed in milliseconds
        if problem is None:
            return named_tokenizer(saved)
        log.warning("saved tokenizer %s is not what was saved (%s): building it again", saved, problem)
    converted = gguf_cache_folder(source, cache_dir)
    # sizes only: the hashes would read the float32 weights, which this engine never loads
    if (converted / COMPLETE).exists() and sizes_problem(converted) is None:
        return named_tokenizer(converted)
    from transformers import AutoTokenizer

    log.info("building the tokenizer of %s from the GGUF (once; saved in %s)", source.gguf_file, saved)
    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file, local_files_only=True)
    try:
        _save(tokenizer, saved)
    except OSError as e:  # a read-only cache serves, it only builds the tokenizer on each start
        log.warning("the tokenizer could not be saved in %s (%s): it is built again on the next start", saved, e)
    return tokenizer


def _save(tokenizer, target: Path) -> None:
    """Written as a conversion is (converted.write_complete): complete or absent, one writer
    at a time."""

    def fill(tmp: Path) -> dict[str, str]:
        tokenizer.save_pretrained(tmp)
        return {}

    with locked(target):
        write_complete(target, fill)


def named_tokenizer(folder: Path):
    """The tokenizer class the folder's tokenizer_config.json names, loaded as AutoTokenizer
    would load it, without AutoTokenizer's detour through the model's configuration classes,
    which import torch (seconds and hundreds of MiB of the llama.cpp engine's start; that
    engine never runs torch). AutoTokenizer where no class is named."""
    import transformers

    try:
        name = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        name = None
    cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if cls is None or not issubclass(cls, transformers.PreTrainedTokenizerBase):
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return cls.from_pretrained(folder, local_files_only=True)
