"""Which calibration carries to text we never fitted? Leave-one-source-out over held-out sources.

The sources are `evals/` dev (ours) and the registry sources of openjev.evals.sources
(vader-tweets, vader-amazon, vader-movies, typed-decisions). Each question's label
log-probs are recorded once per ordering (every cyclic shift of a choice, each scale and
yes/no both ways: letters R=2, what the default reads), and once more on a content-free
state ("N/A") per distinct question of the registry sources; every method below is then derived offline with the core readout's own
`combine`, so a row is what a server computes from the same log-probs. For each source,
each method is fitted on all the other sources and judged on it (per question type):

- `raw`: the default readout's probabilities, uncalibrated;
- `T`: a temperature per type (today's shipped form);
- `T(n)`: a temperature per type that depends on the option count, T = a - b ln n;
- `CF`, `CF+T`: content-free calibration (the question read on "N/A", divided out; Zhao et
  al. 2021), alone and followed by `T`;
- `BC`, `BC+T`: batch calibration (the mean answer of the same question over a batch of
  unlabelled traffic divided out; Zhou et al. 2024), where a question repeats at least
  BATCH_MIN times in the batch, else nothing;
- `CF/2+T`: half the content-free correction (its square root), then `T`.

    # 1. record (slow; resumable; one heavy job at a time)
    OPENJEV_ENGINE=llamacpp .venv/bin/python evals/source_table.py record --model qwen2.5-coder-1.5b
    # 2. the table (seconds)
    .venv/bin/python evals/source_table.py table --model qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import minimize_scalar

from openjev.core.readouts import LettersReadout, question_type
from openjev.evals import readings
from openjev.evals.dataset import Item, load_items
from openjev.evals.metrics import Scored, summarize
from openjev.evals.sources import load_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transfer_table import IDS, LABELS, Pool, pooled, questions_of

TYPES = ("noul", "choice", "score")
SOURCES = ("evals-dev", "vader-tweets", "vader-amazon", "vader-movies", "typed-decisions")
CF_STATE = "N/A"
BATCH_MIN = 8
FLOOR = 1e-12
# the default readout of the served model, per type (its calibration file's `defaults`)
READ = {"noul": LettersReadout(LABELS, IDS, rotations=1), "choice": LettersReadout(LABELS, IDS, rotations=2)}
READ["score"] = READ["choice"]


def items_of(source: str, cache_dir: str) -> list[Item]:
    if source.startswith("evals-"):
        return load_items(Path(__file__).resolve().parent / "data" / f"{source.removeprefix('evals-')}.jsonl")
    return load_source(source, cache_dir)


def signature(question: dict) -> str:
    return hashlib.sha256(json.dumps(question, sort_keys=True).encode()).hexdigest()[:16]


def content_free(items: Sequence[Item]) -> list[Item]:
    """One item per distinct question: the question alone on the content-free state."""
    seen: dict[str, Item] = {}
    for item in items:
        for qid, q in item.request["questions"].items():
            sig = signature(q)
            if sig not in seen and qid in item.expected:
                request = {**item.request, "state": CF_STATE, "questions": {qid: q}}
                seen[sig] = Item(f"cf-{sig}", request, {}, "content-free")
    return list(seen.values())


@dataclass(frozen=True)
class Row:
    source: str
    qtype: str
    n: int
    sig: str
    probs: tuple[float, ...]
    cf: tuple[float, ...] | None  # the content-free reading's answer, where it was recorded
    correct: int


def rows_of(source: str, items: Sequence[Item], pool: Pool) -> list[Row]:
    out = []
    for item, qid, q in questions_of(items):
        qtype = question_type(q)
        readout = READ[qtype]
        sig = signature(item.request["questions"][qid])
        got = [pool.get((item.id, qid), {}).get(o) for o in readout.orders(q)]
        cf = [pool.get((f"cf-{sig}", qid), {}).get(o) for o in readout.orders(q)]
        if any(g is None for g in got) or any(c is None for c in cf):
            continue
        probs = readout.combine(q, got).probs
        out.append(
            Row(source, qtype, len(probs), sig, probs, readout.combine(q, cf).probs, readings.expected_index(item, qid))
        )
    return out


def _norm(v: Sequence[float]) -> tuple[float, ...]:
    total = math.fsum(v)
    return tuple(x / total for x in v)


def _divide(probs: Sequence[float], prior: Sequence[float], power: float = 1.0) -> tuple[float, ...]:
    return _norm([p / max(q, FLOOR) ** power for p, q in zip(probs, prior, strict=True)])


def _temper(probs: Sequence[float], t: float) -> tuple[float, ...]:
    logs = [math.log(max(p, FLOOR)) / t for p in probs]
    top = max(logs)
    return _norm([math.exp(x - top) for x in logs])


def _nll(rows: Sequence[Row], t_of: Callable[[Row], float]) -> float:
    return math.fsum(-math.log(max(_temper(r.probs, t_of(r))[r.correct], FLOOR)) for r in rows) / max(len(rows), 1)


def fit_t(rows: Sequence[Row]) -> float:
    if not rows:
        return 1.0
    return float(minimize_scalar(lambda t: _nll(rows, lambda _r: t), bounds=(0.05, 20.0), method="bounded").x)


def fit_tn(rows: Sequence[Row]) -> tuple[float, float]:
    """(a, b) of T = a - b ln n, by NLL on a grid then refined (T kept at least 0.05)."""
    best = (math.inf, 1.0, 0.0)
    for b in np.linspace(-2.0, 2.0, 41):
        a = minimize_scalar(
            lambda a, b=b: _nll(rows, lambda r: max(a - b * math.log(r.n), 0.05)), bounds=(0.05, 20.0), method="bounded"
        ).x
        loss = _nll(rows, lambda r, a=a, b=b: max(a - b * math.log(r.n), 0.05))
        best = min(best, (loss, float(a), float(b)))
    return best[1], best[2]


def batch_priors(rows: Sequence[Row]) -> dict[str, tuple[float, ...]]:
    """Per question signature seen at least BATCH_MIN times: the mean answer (no labels)."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        groups[r.sig].append(r)
    return {
        sig: _norm([math.fsum(r.probs[j] for r in rs) / len(rs) for j in range(rs[0].n)])
        for sig, rs in groups.items()
        if len(rs) >= BATCH_MIN
    }


def _pre(name: str, rows: Sequence[Row]) -> list[Row]:
    """The rows after a method's label-free step (content-free or batch division)."""
    if name.startswith("CF"):
        power = 0.5 if name.startswith("CF/2") else 1.0
        return [replace(r, probs=_divide(r.probs, r.cf, power)) if r.cf else r for r in rows]
    if name.startswith("BC"):
        priors = batch_priors(rows)
        return [replace(r, probs=_divide(r.probs, priors[r.sig])) if r.sig in priors else r for r in rows]
    return list(rows)


METHODS = ("raw", "T", "T(n)", "CF", "CF+T", "CF/2+T", "BC", "BC+T")


def held_out(name: str, train: Sequence[Row], test: Sequence[Row]) -> list[Row]:
    """`test` calibrated by `name` fitted on `train` (batch steps see each source's own batch)."""
    by_source: dict[str, list[Row]] = defaultdict(list)
    for r in train:
        by_source[r.source].append(r)
    train = [x for rs in by_source.values() for x in _pre(name, rs)]
    test = _pre(name, test)
    out: list[Row] = []
    for t in TYPES:
        tr, te = [r for r in train if r.qtype == t], [r for r in test if r.qtype == t]
        if name.endswith("T(n)"):
            a, b = fit_tn(tr)
            out += [replace(r, probs=_temper(r.probs, max(a - b * math.log(r.n), 0.05))) for r in te]
        elif name.endswith("+T") or name == "T":
            temp = fit_t(tr)
            out += [replace(r, probs=_temper(r.probs, temp)) for r in te]
        else:
            out += te
    return out


def figures(rows: Sequence[Row]) -> dict[str, float | int | None]:
    scored = [Scored(r.qtype, r.probs, r.correct) for r in rows]
    m = summarize(scored)
    return {"n": len(rows), "accuracy": m["accuracy"], "ece": m["ece"], "nll": m["nll"], "brier": m.get("brier")}


def table(rows: Sequence[Row]) -> dict:
    sources = sorted({r.source for r in rows}, key=lambda s: SOURCES.index(s) if s in SOURCES else 99)
    out: dict = {}
    for name in METHODS:
        out[name] = {}
        for s in sources:
            test = held_out(name, [r for r in rows if r.source != s], [r for r in rows if r.source == s])
            out[name][s] = {
                t: figures([r for r in test if r.qtype == t]) for t in TYPES if any(r.qtype == t for r in test)
            }
            out[name][s]["all"] = figures(test)
    return out


def markdown(result: dict, model: str) -> str:
    lines = [f"# Leave-one-source-out calibration: {model}", ""]
    lines += ["Each cell: ECE / accuracy (n) of the source when fitted on all the others.", ""]
    sources = list(next(iter(result.values())))
    lines += ["| method | type | " + " | ".join(sources) + " |", "|---|---|" + "---|" * len(sources)]
    for name, per in result.items():
        for t in (*TYPES, "all"):
            cells = []
            for s in sources:
                m = per[s].get(t)
                cells.append("-" if m is None else f"{m['ece']:.3f} / {m['accuracy']:.3f} ({m['n']})")
            lines.append(f"| {name} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _service(model: str):
    from quality_model_table import _service as service

    return service(model)


def record(args: argparse.Namespace) -> int:
    from openjev.core.readouts import ReadoutSpec

    service, loaded = _service(args.model)
    folder = Path(args.out) / args.model
    spec = ReadoutSpec("letters", args.rotations)
    todo = {s: items_of(s, args.cache_dir)[: args.limit or None] for s in args.sources}
    for source, items in todo.items():
        out = folder / f"{source}-cf-letters-r{spec.rotations}.jsonl"
        readings.record(service, loaded.engine, content_free(items), spec, out)
    # item by item, the sources in turn: a run stopped early leaves every source in proportion
    for i in range(max(len(items) for items in todo.values())):
        for source, items in todo.items():
            out = folder / f"{source}-letters-r{spec.rotations}.jsonl"
            readings.record(service, loaded.engine, items[i : i + 1], spec, out)
    return 0


def build(args: argparse.Namespace) -> int:
    folder = Path(args.out) / args.model
    pool = pooled(folder)
    rows: list[Row] = []
    for source in args.sources:
        rows += rows_of(source, items_of(source, args.cache_dir), pool)
    result = table(rows)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"sources-{args.model}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result, args.model)
    (results / f"sources-{args.model}.md").write_text(text)
    sys.stdout.write(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("record", "table"):
        c = sub.add_parser(name)
        c.add_argument("--model", required=True)
        c.add_argument("--out", default="evals/results/readings")
        c.add_argument("--cache-dir", default="~/.cache/openjev")
        c.add_argument("sources", nargs="*", default=list(SOURCES))
    sub.choices["record"].add_argument("--limit", type=int)
    sub.choices["record"].add_argument("--rotations", type=int, default=2, help="letters rotations to record")
    sub.choices["table"].add_argument("--results", default="evals/results")
    args = p.parse_args()
    return record(args) if args.command == "record" else build(args)


if __name__ == "__main__":
    sys.exit(main())
