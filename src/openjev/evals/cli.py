"""`openjev eval` and `openjev calibrate`: argument parsing and the two commands."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from openjev.core.readouts import CANONICAL_ORDER, READOUT_NAMES
from openjev.evals import pictures, report
from openjev.evals.dataset import DataError, load_items
from openjev.evals.metrics import by_type
from openjev.evals.runner import ResultStore, RunConfig, RunMismatch, run_items, run_meta, score


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "data",
        nargs="+",
        help="labelled JSON Lines file(s) (format: evals/data/README.md), or held-out source names: "
        "vader-tweets, vader-amazon, vader-movies, typed-decisions (evals/sources.py; fetched from the registry)",
    )
    p.add_argument(
        "--per-stratum", type=int, help="held-out sources: items per gold level or workflow (default: the source's)"
    )
    p.add_argument("--seed", type=int, default=0, help="held-out sources: the subsample's seed (default 0)")
    p.add_argument("--url", help="base URL of a running openjev server (default: serve in this process)")
    p.add_argument("--key", help="API key for the server (or OPENJEV_EVAL_KEY)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    p.add_argument("--limit", type=int, help="only the first N items (a quick look)")
    p.add_argument("--restart", action="store_true", help="discard what an earlier run left in the run folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    local = p.add_argument_group("in-process server (without --url); other settings from OPENJEV_* variables")
    local.add_argument(
        "--model",
        help="a named model, model folder or .gguf (default: as `openjev serve`, qwen2.5-coder-1.5b; `embedded`:"
        " the fast test model; the engine from OPENJEV_ENGINE, default llamacpp)",
    )
    local.add_argument(
        "--prefix-cache-bytes", type=int, help="prefix cache of the in-process engine (0 makes every request cold)"
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="measure accuracy and calibration on labelled data")
    _common(ev)
    ev.add_argument("--readout", choices=READOUT_NAMES, help="readout to ask for (default: the server's)")
    ev.add_argument("--rotations", type=int, help="letters: rotations to ask for (default: the server's)")
    ev.add_argument("--uncalibrated", action="store_true", help="ask for raw answers (x-openjev-calibration: none)")
    ev.add_argument("--no-flips", action="store_true", help="skip the rotated choice requests (no order-flip rate)")
    ev.add_argument("--calibration", help="in-process: auto, none or a calibration file (default auto)")
    ev.add_argument("--out", help="run folder (default evals/runs/<data>-<readout>-<calibration>)")
    ev.add_argument(
        "--report",
        action="store_true",
        help="also write the pictures: confidence.png (a histogram per type), coverage.png (the abstain rule's "
        "accuracy against coverage) and report.html showing them with reliability.png",
    )
    ev.add_argument(
        "--invariance",
        action="store_true",
        help="also run jevbench-mini's invariance relations (option_permutation, noul_as_choice, clone_symmetry, "
        "batch_order; 336 requests, no labels) with the same readout and calibration (needs jevbench)",
    )

    cal = sub.add_parser("calibrate", help="fit a calibration file on labelled (dev) data")
    _common(cal)
    cal.add_argument(
        "--config",
        action="append",
        metavar="READOUT[:ROTATIONS]",
        help="readout to fit, repeatable: letters, letters:4, yesno, parallel, canonical, mirror (default: the server's readout)",
    )
    cal.add_argument("-o", "--output", default="calibration.json", help="calibration file to write")
    cal.add_argument("--id", help="calibration id (default: <model>-<data>-<date>)")
    cal.add_argument("--out", help="folder for the raw runs (default evals/runs/calibrate-<data>)")


@contextmanager
def _target(args: argparse.Namespace, calibration: str | None = None) -> Iterator[tuple[str, str]]:
    """(base URL, a stable name of the target for run.json)."""
    if args.url:
        yield args.url.rstrip("/"), args.url.rstrip("/")
        return
    from openjev.config import load_settings
    from openjev.evals.local import local_server

    overrides = {"model": args.model, "prefix_cache_bytes": args.prefix_cache_bytes, "calibration": calibration}
    settings = load_settings(overrides)
    print(f"serving {settings.served.model or 'the embedded model'} in this process ...", file=sys.stderr)
    with local_server(settings) as url:
        yield url, f"in-process:{settings.served.model or 'embedded'}:calibration={settings.quality.calibration}"


def _key(args: argparse.Namespace) -> str | None:
    import os

    return args.key or os.environ.get("OPENJEV_EVAL_KEY")


def _stem(paths: list[str]) -> str:
    return "+".join(Path(p).stem for p in paths)


def _data_names(args: argparse.Namespace) -> list[str]:
    """The data as run.json records it: a held-out source with its subsample's size and seed."""
    from openjev.evals.sources import SOURCES

    return [
        f"{n}@{args.per_stratum or SOURCES[n].per_stratum}s{args.seed}" if n in SOURCES and not Path(n).exists() else n
        for n in args.data
    ]


def _items(args: argparse.Namespace):
    from openjev.config import load_settings
    from openjev.evals.sources import SOURCES, load_source

    items = []
    for name in args.data:
        if name in SOURCES and not Path(name).exists():
            cache_dir = load_settings({}).served.cache_dir
            items += load_source(name, cache_dir, per_stratum=args.per_stratum, seed=args.seed)
        else:
            items += load_items(name)
    return items[: args.limit] if args.limit else items


def evaluate(args: argparse.Namespace) -> int:
    items = _items(args)
    config = RunConfig(
        readout=args.readout, rotations=args.rotations, calibrated=not args.uncalibrated, flips=not args.no_flips
    )
    label = (
        f"{args.readout or 'default'}"
        + (f"-r{args.rotations}" if args.rotations else "")
        + ("-raw" if args.uncalibrated else "-cal")
    )
    folder = Path(args.out or Path("evals/runs") / f"{_stem(args.data)}-{label}")
    with _target(args, args.calibration) as (url, target):
        store = ResultStore(folder, run_meta(_data_names(args), target, config), restart=args.restart)
        asyncio.run(
            run_items(
                url, items, config, store, concurrency=args.concurrency, key=_key(args), progress=not args.no_progress
            )
        )
        invariance = _invariance(args, url, config) if args.invariance else None
    scored, facts = score(items, store)
    summary = {"metrics": by_type(scored), "run": facts, "config": run_meta(_data_names(args), target, config)}
    if invariance is not None:
        summary["invariance"] = invariance
    title = f"{_stem(args.data)}: readout {facts['readout']}, calibration {facts['calibration']}"
    report.write(folder, summary, scored, title)
    sys.stdout.write(report.markdown(summary, title))
    if args.report:
        print(f"wrote {pictures.write(folder, scored, title, report.markdown(summary, title))}", file=sys.stderr)
    print(f"\nwrote {folder}/summary.json, summary.md, reliability.png", file=sys.stderr)
    return 0 if facts["items_failed"] == 0 else 1


def _invariance(args: argparse.Namespace, url: str, config: RunConfig) -> dict:
    from openjev.evals import invariance

    print("jevbench-mini invariance relations ...", file=sys.stderr)
    return invariance.measure(url, config.headers(_key(args)), concurrency=args.concurrency)


def _parse_config(text: str) -> RunConfig:
    name, _, rot = text.partition(":")
    if name not in READOUT_NAMES:
        raise ValueError(f"--config {text!r}: readout must be one of {', '.join(READOUT_NAMES)}")
    return RunConfig(readout=name, rotations=int(rot) if rot else 1, calibrated=False, flips=False)


def calibrate(args: argparse.Namespace) -> int:
    from openjev.core import calibration as calib

    items = _items(args)
    configs = [_parse_config(c) for c in args.config] if args.config else [None]
    base = Path(args.out or Path("evals/runs") / f"calibrate-{_stem(args.data)}")
    fits = []
    with _target(args, "none") as (url, target):
        headers = {"Authorization": f"Bearer {_key(args)}"} if _key(args) else {}
        model = httpx.get(url + "/v1/models", headers=headers, timeout=30).json()["models"][0]
        for config in configs:
            if config is None:  # the server's default readout
                readout, _, rot = str(model["x_readout"]).partition(";rotations=")
                config = RunConfig(readout=readout, rotations=int(rot) if rot else 1, calibrated=False, flips=False)
            fit = _fit_readout(args, url, target, items, config, base)
            if fit is None:
                return 1
            fits.append(fit)
    doc = _calibration_doc(args, model, len(items), fits)
    calib.from_dict(doc)  # what we write must load
    Path(args.output).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _fit_readout(
    args: argparse.Namespace, url: str, target: str, items: list, config: RunConfig, base: Path
) -> dict | None:
    """Read `items` uncalibrated under `config` and fit its calibration (None: requests failed)."""
    from openjev.evals.fit import fit_readout

    name = f"{config.readout}" + (f":{config.rotations}" if config.readout == "letters" else "")
    store = ResultStore(
        base / name.replace(":", "-r"), run_meta(_data_names(args), target, config), restart=args.restart
    )
    print(f"reading {len(items)} items with readout {name} (uncalibrated) ...", file=sys.stderr)
    asyncio.run(
        run_items(
            url, items, config, store, concurrency=args.concurrency, key=_key(args), progress=not args.no_progress
        )
    )
    scored, facts = score(items, store)
    if facts["items_failed"]:
        print(f"openjev calibrate: {facts['items_failed']} requests failed: {facts['failures'][:3]}", file=sys.stderr)
        return None
    # parallel and canonical read choice options in a canonical order: a correction by
    # request position would bring the caller's order back into their answers
    order_free = ("choice",) if config.readout in CANONICAL_ORDER else ()
    types = fit_readout(scored, order_free=order_free)
    for qtype, fit in types.items():
        print(
            f"  {name:10s} {qtype:6s} n={fit['n']:3d} T={fit['temperature']:.3f} {fit['form']:17s} "
            f"NLL {fit['nll_before']:.3f} -> {fit['nll_after']:.3f}",
            file=sys.stderr,
        )
    return {"readout": config.readout, "rotations": config.rotations, "types": types}


def _calibration_doc(args: argparse.Namespace, model: dict, n_items: int, fits: list[dict]) -> dict:
    from openjev.core import calibration as calib

    today = datetime.date.today().isoformat()
    return {
        "format": calib.FORMAT,
        "id": args.id or f"{model['name']}-{_stem(args.data)}-{today}",
        "model": {"name": model["name"], "fingerprint": model["x_fingerprint"]},
        "prompt_version": model["x_prompt_version"],
        "base_temperature": model.get("x_temperature", 1.0),
        "created": today,
        "data": {"files": [Path(p).name for p in args.data], "items": n_items},
        "fits": fits,
    }


def run(args: argparse.Namespace) -> int:
    try:
        return evaluate(args) if args.command == "eval" else calibrate(args)
    except (DataError, RunMismatch, ValueError, RuntimeError, httpx.HTTPError) as e:
        print(f"openjev {args.command}: {e}", file=sys.stderr)
        return 2
