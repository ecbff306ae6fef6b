"""Logging: `--log-format text|json`, and no request text in any line.

Request text (states, instructions, option names) must not reach logs: they are often
personal data, and a 2 MB request must not make 2 MB log lines. Our own messages never
format it; the one way it could leak is an exception's message (a validation or template
error quoting its input), so by default exceptions are logged as their type and stack
frames, without the message. `--log-request-bodies` (debugging only) lifts that.

The access line (logger `openjev.access`, one per HTTP request) carries its fields as
`record.fields`: JSON puts them at the top level, text as key=value pairs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import sys
import time
import traceback

ACCESS = "openjev.access"

# The key of `pseudonym`: this process's own, never written anywhere, so a log line's
# pseudonym cannot be reversed by hashing guesses (e-mails, user ids) as a plain digest can.
_PSEUDONYM_KEY = secrets.token_bytes(32)


def pseudonym(value: str) -> str:
    """What a log keeps of an end-user identifier (`safety_identifier`): 16 hex digits of
    its HMAC-SHA256 under this process's secret key. Equal values match within one run of
    the server (to follow one user's requests); no dictionary reverses them."""
    return hmac.new(_PSEUDONYM_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]


def _exception(record: logging.LogRecord, with_messages: bool) -> dict[str, str] | None:
    if not record.exc_info or record.exc_info[0] is None:
        return None
    kind, value, tb = record.exc_info
    out = {"exc_type": kind.__name__, "traceback": "".join(traceback.format_tb(tb)).rstrip()}
    if with_messages:
        out["exc_message"] = str(value)
    return out


class JsonFormatter(logging.Formatter):
    def __init__(self, with_messages: bool = False) -> None:
        super().__init__()
        self.with_messages = with_messages

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, "fields", None) or {})
        exc = _exception(record, self.with_messages)
        if exc:
            out.update(exc)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    def __init__(self, with_messages: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.with_messages = with_messages

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None  # rendered below, without the message
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text = saved
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items() if v is not None)
        exc = _exception(record, self.with_messages)
        if exc:
            line += f" exc_type={exc['exc_type']}"
            if "exc_message" in exc:
                line += f" exc_message={exc['exc_message']!r}"
            line += "\n" + exc["traceback"]
        return line


def _text_value(v) -> str:
    if isinstance(v, dict):
        return ",".join(f"{k}:{_text_value(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def configure(level: str, fmt: str, with_messages: bool = False) -> None:
    """The root handler for every logger (uvicorn's too: it is started with log_config=None)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(with_messages) if fmt == "json" else TextFormatter(with_messages))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # library warnings as log lines (one format on stderr)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # the access line is ours (ACCESS)
