"""The sections of Settings: each component receives the one section it reads (or the few);
the engine's own in config/engines.py, the tasks' in config/tasks.py.

Every default is defined here, once, beside its help text: the CLI builds `openjev serve`'s
flags from these fields (config/fields.py names them) and code that needs a default reads it
from its section, never a copy. A field's name is unique across the sections (the flat name of
its flag and environment twin)."""

from __future__ import annotations

from dataclasses import dataclass

from openjev.config.checks import is_loopback_name
from openjev.config.fields import opt


@dataclass(frozen=True)
class ListenSettings:
    """Where to listen and whom to believe: the host policy (api/identity), the docs routes."""

    host: str = opt("127.0.0.1", "interface to listen on")
    port: int = opt(8000, "port to listen on")
    allowed_hosts: tuple[str, ...] = opt(
        (),
        "Host header names accepted besides the loopback ones (comma-separated or repeated; `*.example.com` "
        "for subdomains, `*` for any); none: only loopback names on a loopback --host, any name otherwise",
        flag="allowed-hosts",
        metavar="HOST[,HOST]",
        comma=True,
    )
    trusted_proxies: tuple[str, ...] = opt(
        (),
        "addresses or networks of the proxies in front of this server (comma-separated or repeated); "
        "X-Forwarded-For is believed only from them (none: from no one)",
        flag="trusted-proxies",
        metavar="IP[/BITS][,...]",
        comma=True,
    )
    docs: str = opt(
        "auth",
        "API docs (/docs, /redoc, /openapi.json): public, off, or auth (the API's bearer key when keys are "
        "configured, open when none are, like the API)",
    )

    @property
    def loopback_bind(self) -> bool:
        """Listening on a loopback interface only (the default): reachable from this machine alone."""
        return is_loopback_name(self.host)


@dataclass(frozen=True)
class ConnectionSettings:
    """The connection guard (api/operations/connections.py: checked before a request reaches the app)."""

    max_connections: int = opt(
        1024, "open HTTP connections at once; beyond it a new connection is answered 503 and closed"
    )
    max_connections_per_client: int = opt(
        64,
        "open HTTP connections from one client address at once (a --trusted-proxies peer excepted; beyond it "
        "that client's new connection is answered 503 and closed), and requests in progress per API key (429 "
        "beyond); 0: no bound",
    )
    head_timeout_s: float = opt(
        10.0, "time for a request's head (request line and headers) to arrive; beyond it: 408 and close"
    )
    body_timeout_s: float = opt(60.0, "time for a request's whole body to arrive once its head has; beyond it: 408")
    max_head_bytes: int = opt(65_536, "bytes of a request's head (request line and headers); beyond it: 431")
    send_timeout_s: float = opt(
        10.0,
        "time a client may leave a response unread (the server's send buffer full, no progress); "
        "beyond it the connection is dropped (a slow reader)",
    )
    max_body_chunks: int = opt(
        8192, "chunks of one chunked request body (each costs parser work); beyond it: 413 and close"
    )


@dataclass(frozen=True)
class QualitySettings:
    """Decision quality (docs/quality.md): the readout, calibration and abstain rule the service applies."""

    temperature: float = opt(1.0, "softmax temperature applied to label log-probs (1.0 = the model's own)")
    # Default from measurement (docs/quality-readouts.md): canonical reads a choice's options once,
    # lettered in an order of their own text, so the caller's order never reaches the model;
    # one reading, on every engine, and the best of the readouts on the embedded model's dev set.
    readout: str = opt(
        "canonical",
        "how questions are read: canonical (a choice's options lettered once in an order of their own text: "
        "order-free, one reading), letters (lettered in the caller's order; --rotations orders averaged), "
        "yesno (a Yes/No branch per option), mirror (canonical's order and its reverse, two readings) or "
        "parallel (choice options read side by side, order-free; in-process engine only, others read canonical); "
        "a served model's calibration file may name its own",
    )
    rotations: int = opt(
        4,
        "letters readout: cyclic rotations of the options read and averaged (set alone, with --readout left at "
        "canonical, it asks for letters)",
    )
    calibration: str = opt(
        "auto", "calibration applied to answers: auto (the file shipped for the served model, if any), none, or a path"
    )
    ignore_model_abstain: bool = opt(
        False,
        "do not apply the abstain rule that the served model's calibration file names (its readout and fits still "
        "apply): the --abstain-* flags' rule, which a floor of 0 cannot otherwise restore",
    )
    # The abstain rule (core/abstain.py). Chosen on the dev split (evals/abstain_table.py,
    # evals/results/abstain.md): declining the questions where fewer than half the option orders
    # read agree with the answer kept 69 % of the dev questions and raised accuracy on them from
    # 0.363 to 0.426; a label-mass floor bought nothing for the embedded model. 0 disables a floor.
    abstain_min_label_mass: float = opt(
        0.0, "decline (refuse) a question whose reading put less than this probability on the answer labels (0: off)"
    )
    abstain_min_order_agreement: float = opt(
        0.5,
        "decline (refuse) a question when less than this share of the option orders read agree with its answer "
        "(0: off; needs rotations)",
    )
    abstain_min_confidence: float = opt(
        0.0,
        "decline (refuse) a question whose calibrated top probability is below this (0: off; meaningful only "
        "under a calibration fitted for the served model)",
    )
    max_rotations: int = opt(8, "most rotations one request may ask for (x-openjev-rotations header)")
    rotation_max_options: int = opt(
        26, "letters: questions with more options are read in one ordering (each rotation repeats the option list)"
    )

    def readout_left(self) -> bool:
        """--readout and --rotations both at their defaults (a served model's file may name its own)."""
        return (self.readout, self.rotations) == (_QUALITY_DEFAULT.readout, _QUALITY_DEFAULT.rotations)

    def rotations_moved(self) -> bool:
        """--rotations set away from its default (under a one-order readout it asks for letters)."""
        return self.rotations != _QUALITY_DEFAULT.rotations

    def abstain_left(self) -> bool:
        """The three --abstain-* floors at their defaults (the served model's file may name its own)."""
        return self.abstain_floors() == _QUALITY_DEFAULT.abstain_floors()

    def abstain_floors(self) -> tuple[float, float, float]:
        return (self.abstain_min_label_mass, self.abstain_min_order_agreement, self.abstain_min_confidence)


@dataclass(frozen=True)
class KeySettings:
    """Who may call: the key ring (api/identity/keys.py) and its per-key budgets."""

    api_keys: tuple[str, ...] = opt(
        (),
        "accepted API keys (flag repeatable; env comma-separated); none = no auth",
        flag="api-key",
        env="API_KEYS",
        metavar="KEY",
    )
    api_keys_file: str | None = opt(
        None,
        "file of named keys, one `name:key` or `name:sha256:<hex>` per line, optional "
        "`requests_per_min=N tokens_per_min=N`; reloaded on SIGHUP",
    )
    key_requests_per_min: int = opt(0, "per API key: requests per minute (token bucket; 0: unlimited); beyond: 429")
    key_tokens_per_min: int = opt(
        0, "per API key: distinct tokens per minute (token bucket; 0: unlimited); beyond: 429"
    )


@dataclass(frozen=True)
class LimitSettings:
    """Limits, checked before any engine work; admission and drain read their part."""

    max_questions: int = opt(64, "questions per request")
    max_body_bytes: int = opt(2 * 1024 * 1024, "request body bytes, after decoding")
    max_json_depth: int = opt(64, "nesting depth of arrays and objects in a request body (the whole body); deeper: 422")
    max_branch_tokens: int = opt(32_768, "tokens of one branch (state + one question)")
    max_request_tokens: int = opt(262_144, "distinct tokens of one request (state once + every question)")
    max_branches: int = opt(
        4096, "branches of one request (a question is one per rotation, or under the yesno readout one per option)"
    )
    max_prompt_tokens: int = opt(
        4_194_304, "tokens of one request's branches added up (the state counted once per branch)"
    )
    max_in_flight: int = opt(16, "evaluations in flight; beyond it: 529 with Retry-After")
    engine_timeout_s: float = opt(120.0, "deadline for the engine's work on one request; beyond it: 504")
    retry_after_s: int = opt(1, "Retry-After seconds sent with 529 until a drain rate is measured")
    max_tokens_in_flight: int = opt(
        0, "distinct tokens admitted to the engine at once, all requests together (0: unlimited); beyond: 529"
    )
    max_queue_wait_s: float = opt(
        0.0,
        "refuse (529) work the engine would not reach within this many seconds at its measured rate "
        "(0: half the engine timeout)",
    )
    drain_timeout_s: float = opt(0.0, "on SIGTERM, how long in-flight requests may finish (0: engine timeout + 15 s)")
    max_batch_items: int = opt(256, "items per POST /v1/systemone/batch")
    max_batch_tokens: int = opt(1_048_576, "distinct tokens of one batch (each item's, added up)")

    @property
    def max_queue_wait(self) -> float:
        return self.max_queue_wait_s or self.engine_timeout_s / 2

    @property
    def drain_timeout(self) -> float:
        """Long enough for the longest admitted request (compile + engine deadline) unless set."""
        return self.drain_timeout_s or self.engine_timeout_s + 15.0


@dataclass(frozen=True)
class LogSettings:
    """What the logs carry and how (api/operations/logs.py)."""

    log_level: str = opt("info", "debug, info, warning, error")
    log_format: str = opt("text", "text or json (one object per line)")
    log_request_bodies: bool = opt(False, "debug only: let logs carry request text and error messages")


_QUALITY_DEFAULT = QualitySettings()
