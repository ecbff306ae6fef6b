"""Named API keys and their per-key limits.

Keys come from `--api-key` (named key1, key2, ... in the order given, for logs and metric
labels only) and from `--api-keys-file`, one key per line:

    # comment; also after a space at the end of a line
    alice:s3cret-key-of-alice
    bob:sha256:<64 hex digits of sha256(key)>   requests_per_min=120 tokens_per_min=500000
    carol:another-key cache_group=team-a
    dave:yet-another-key cache_group=team-a weight=2

Each key has its own namespace in the engine's prefix cache: a state one key sent is
never reported as cached to another (api/identity/tenancy.py). Keys that name the same
`cache_group` opt in to share one namespace (one team's keys, a service's replicas).
Each key also has its share of the engine while several keys have work waiting
(engines/fair_share.py): `weight=N` (1 to MAX_WEIGHT, default 1) gives it N times a
weight-1 key's.

What is stored per key (tasks) is stored under its `tenant`, which never follows a position:
a named key's name (rotating its secret keeps its data; renamed, it starts empty and its
data stays with the old name), and for a key given without a name (`--api-key`) a digest
of its secret. Only names ever reach logs and metric labels. A key is matched by comparing SHA-256
digests with hmac.compare_digest against every entry (no early exit), so neither the time
nor the matching entry reveals how much of a guess was right. The file is re-read on
SIGHUP; a file that cannot be read or parsed (missing, not UTF-8, malformed) keeps the
previous keys and says why in the log; at startup the same file is a ConfigError (exit 2).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from openjev.errors import ConfigError

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
_COUNT = re.compile(r"^[0-9]{1,12}$")
_LIMITS = ("requests_per_min", "tokens_per_min")
_OPTIONS = "requests_per_min=N, tokens_per_min=N, weight=N or cache_group=NAME"
MAX_WEIGHT = 1000


@dataclass(frozen=True)
class KeyEntry:
    name: str
    digest: bytes  # sha256 of the key
    requests_per_min: int | None = None  # None: the server default (--key-requests-per-min)
    tokens_per_min: int | None = None
    cache_group: str | None = None  # keys of one group share a prefix-cache namespace
    cache_namespace: str = ""  # the namespace's salt (`salt` below), set by the KeyRing
    weight: int = 1  # its share of the engine against other keys' (engines/fair_share.py)
    unnamed: bool = False  # given without a name (--api-key): its name is its position

    @property
    def tenant(self) -> str:
        """The key's stable id, under which its data is kept: its name, or for an unnamed key
        `key-` and 16 hex digits of its secret's SHA-256 (never its position)."""
        return f"key-{self.digest.hex()[:16]}" if self.unnamed else self.name


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys_file(text: str, source: str = "keys file") -> list[KeyEntry]:
    """Entries of a keys file; ConfigError naming the line for anything malformed (never the key)."""
    entries: list[KeyEntry] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#"):
            continue
        line = line.split(" #", 1)[0].strip()  # a trailing comment, after a space (keys have none)
        if not line:
            continue
        head, *options = line.split()
        name, sep, secret = head.partition(":")
        where = f"{source} line {n}"
        if not sep or not secret:
            raise ConfigError(f"{where}: expected name:key or name:sha256:<hex>")
        if not _NAME.match(name):
            raise ConfigError(f"{where}: key name {name!r} must be 1-64 of A-Z a-z 0-9 _ . - (it becomes a label)")
        if secret.startswith("sha256:"):
            hexdigest = secret.removeprefix("sha256:")
            if not _HEX.match(hexdigest):
                raise ConfigError(f"{where}: sha256: must be followed by 64 hex digits")
            digest = bytes.fromhex(hexdigest)
        else:
            digest = digest_of(secret)
        limits, group = _options(options, where)
        if any(e.name == name for e in entries):
            raise ConfigError(f"{where}: key name {name!r} appears twice")
        same = [e.name for e in entries if hmac.compare_digest(e.digest, digest)]
        if same:  # one secret, two names: which name (and limits) a request gets would be a guess
            raise ConfigError(f"{where}: key {name!r} has the same secret as {same[0]!r}; each key needs its own")
        entries.append(
            KeyEntry(
                name,
                digest,
                requests_per_min=limits.get("requests_per_min"),
                tokens_per_min=limits.get("tokens_per_min"),
                cache_group=group,
                weight=limits.get("weight", 1),
            )
        )
    return entries


def _options(options: list[str], where: str) -> tuple[dict[str, int], str | None]:
    """A keys file line's options: (its limits and weight by name, its cache_group or None)."""
    limits: dict[str, int] = {}
    group: str | None = None
    seen: set[str] = set()
    for option in options:
        k, _, v = option.partition("=")
        if k in seen:  # which one would win is not for the server to guess
            raise ConfigError(f"{where}: option {k!r} given twice")
        seen.add(k)
        if k == "cache_group":
            if not _NAME.match(v):
                raise ConfigError(f"{where}: cache_group must be 1-64 of A-Z a-z 0-9 _ . -")
            group = v
            continue
        if k not in (*_LIMITS, "weight"):
            raise ConfigError(f"{where}: unknown option {k!r} (expected {_OPTIONS})")
        if not _COUNT.match(v) or int(v) == 0:  # ASCII digits only: '²' is a digit to str.isdigit
            raise ConfigError(
                f"{where}: {k} must be a whole number of at least 1 (leave it out for the server's "
                "default; a key that must not be served is removed from the file)"
            )
        if k == "weight" and not 1 <= int(v) <= MAX_WEIGHT:
            raise ConfigError(f"{where}: weight must be 1 to {MAX_WEIGHT}")
        limits[k] = int(v)
    return limits, group


def read_keys_text(path: str) -> str:
    """The keys file's text; ConfigError naming the path and the reason (unreadable, not
    UTF-8: the line of the first bad byte, never the bytes themselves, which may be a key)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"--api-keys-file {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"--api-keys-file {path} line {line}: not UTF-8 text (save the file as UTF-8)") from None


def _check_whole(text: str, path: str, *, had_file_keys: bool) -> None:
    """ConfigError for a keys file that a reload must not take: one cut short (a last line
    without its newline: truncated, or still being written, and its last key possibly cut
    to a shorter one), or one with no keys where the old file had some (an empty file read
    while being rewritten would otherwise lock every client out with a 401)."""
    if text and not text.endswith("\n"):
        raise ConfigError(
            f"--api-keys-file {path} does not end with a newline: truncated or still being written "
            "(write the new file whole, then rename it into place)"
        )
    if had_file_keys and not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        raise ConfigError(
            f"--api-keys-file {path} holds no keys (empty or truncated); to revoke every key, leave one "
            "that nobody holds, or restart the server"
        )


def flag_entries(keys: Iterable[str]) -> list[KeyEntry]:
    return [KeyEntry(f"key{i}", digest_of(k), unnamed=True) for i, k in enumerate(keys, 1)]


def namespace_id(name: str, cache_group: str | None) -> str:
    """Which namespace a key belongs to: its group's, else its own."""
    return f"group:{cache_group}" if cache_group else f"key:{name}"


def salt(ns_id: str, member_digests: list[bytes]) -> str:
    """The namespace's token: HMAC-SHA256 of its id under a secret only this server's keys
    give (the SHA-256 digests of its members' keys), urlsafe base64 without padding (43
    characters, 256 bits). Replicas with the same keys compute the same salt; a group whose
    membership changes gets a new one (its cache starts cold)."""
    secret = hashlib.sha256(b"openjev cache namespace\0" + b"".join(sorted(member_digests))).digest()
    mac = hmac.new(secret, ns_id.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def with_namespaces(entries: Iterable[KeyEntry]) -> tuple[KeyEntry, ...]:
    """`entries` with their cache namespaces: each key its own, a cache_group's keys one."""
    entries = tuple(entries)
    members: dict[str, list[bytes]] = {}
    for e in entries:
        members.setdefault(namespace_id(e.tenant, e.cache_group), []).append(e.digest)
    salts = {ns: salt(ns, digests) for ns, digests in members.items()}
    if entries:
        log.info(
            "%d API keys in %d prefix-cache namespaces (keys share one only by cache_group)", len(entries), len(salts)
        )
    return tuple(dataclasses.replace(e, cache_namespace=salts[namespace_id(e.tenant, e.cache_group)]) for e in entries)


class KeyRing:
    """The accepted keys (from flags and the file). `identify` is safe to call from any thread."""

    def __init__(self, flag_keys: Iterable[str] = (), path: str | None = None) -> None:
        self._flag_entries = flag_entries(flag_keys)
        self._path = path
        self._entries: tuple[KeyEntry, ...] = with_namespaces(self._flag_entries)
        if path is not None:
            self._entries = self._load()  # a broken file at startup is a ConfigError: exit 2

    @property
    def enabled(self) -> bool:
        return bool(self._entries) or self._path is not None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self._entries)

    def _load(self, *, reloading: bool = False) -> tuple[KeyEntry, ...]:
        if self._path is None:
            return self._entries  # keys given on the command line: nothing to read
        text = read_keys_text(self._path)
        if reloading:
            _check_whole(text, self._path, had_file_keys=len(self._entries) > len(self._flag_entries))
        from_file = parse_keys_file(text, self._path)
        names = {e.name for e in from_file}
        clash = [e.name for e in self._flag_entries if e.name in names]
        if clash:
            raise ConfigError(f"{self._path}: names {clash} are taken by --api-key keys")
        digests = {e.digest for e in self._flag_entries}
        shared = [e.name for e in from_file if e.digest in digests]
        if shared:
            raise ConfigError(
                f"{self._path}: keys {shared} have the secret of an --api-key key; each key needs its own"
            )
        return with_namespaces(self._flag_entries + from_file)

    def reload(self) -> bool:
        """Re-read the file (SIGHUP). Keeps the old keys if it does not parse; True if swapped."""
        if self._path is None:
            return False
        try:
            entries = self._load(reloading=True)
        except ConfigError as e:
            log.error("keys not reloaded, keeping %d: %s", len(self._entries), e)
            return False
        except Exception as e:
            log.error("keys not reloaded, keeping %d: unexpected %s", len(self._entries), type(e).__name__, exc_info=e)
            return False
        self._entries = entries  # one reference swap: readers see the old or the new tuple
        log.info("keys reloaded: %d", len(entries))
        return True

    def identify(self, given: str) -> KeyEntry | None:
        digest = digest_of(given)
        found = None
        for entry in self._entries:  # every entry compared, whatever matches
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found


@dataclass(frozen=True)
class Allowance:
    """What a key is held to, per minute (0: no limit), and its `weight`: its share of the
    engine against other keys' (engines/fair_share.py; the server's is 1). `of` is the one
    place the rule is written: a key's own where the keys file sets one, else the server's."""

    requests_per_min: int
    tokens_per_min: int
    weight: int = 1

    def of(self, entry: KeyEntry | None) -> Allowance:
        """`entry`'s allowance, where this is the server's (itself without a key)."""
        if entry is None:
            return self
        return Allowance(
            self.requests_per_min if entry.requests_per_min is None else entry.requests_per_min,
            self.tokens_per_min if entry.tokens_per_min is None else entry.tokens_per_min,
            entry.weight,
        )

    def by_kind(self) -> dict[str, int]:
        """The limits that are set, by bucket kind."""
        return {k: v for k, v in zip(_LIMITS, (self.requests_per_min, self.tokens_per_min), strict=True) if v}
