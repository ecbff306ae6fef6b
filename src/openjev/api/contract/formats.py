"""The wire formats of the decision routes, registered once: adding a format is one module
(a `WireFormat`, api/contract/format_port.py) and its line in `FORMATS`. Which format a path
speaks, and how an error on that path is rendered, are decided here; every other path
(models, limits, health, the batch, unknown paths) answers in Jev's shape."""

from __future__ import annotations

from openjev.api.contract.format_port import Problem, Rendered, WireFormat
from openjev.api.contract.jev.format import JEV
from openjev.api.contract.openai.format import OPENAI

FORMATS: tuple[WireFormat, ...] = (JEV, OPENAI)
DEFAULT = JEV

_BY_PATH = {path: fmt for fmt in FORMATS for path in fmt.paths}


def format_of(path: str) -> WireFormat:
    """The format a path speaks (Jev's for any path no format serves)."""
    return _BY_PATH.get(path, DEFAULT)


def render_error(path: str, problem: Problem) -> Rendered:
    """(status, body) of `problem` answering a request to `path`."""
    return format_of(path).render_error(problem)
