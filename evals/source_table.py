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
- `CF/2+T`: half the content-free correction (its square root), then `T`;
- `chosen`: per type CHOSEN (noul raw, choice CF+T, score raw), fitted on the others as above;
- `shipped`: the shipped file as it is (its choice temperature saw every human source: in-sample).

`ship` writes CHOSEN into the shipped file, fitted on every human-labelled source.

    # 1. record (slow; resumable; one heavy job at a time)
    OPENJEV_ENGINE=llamacpp .venv/bin/python evals/source_table.py record --model qwen2.5-coder-1.5b
    # 2. the table (seconds)
    .venv/bin/python evals/source_table.py table --model qwen2.5-coder-1.5b --per-stratum 5 8 16
    # 3. the shipped file's default-readout fits
    .venv/bin/python evals/source_table.py ship --model qwen2.5-coder-1.5b --per-stratum 5 8 16 --created DATE
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
from abstain_table import MIN_COVERAGE, MIN_GAIN, Read, grid, measure, rule_text
from transfer_table import IDS, LABELS, Pool, pooled, questions_of

from openjev.core.abstain import AbstainRule

TYPES = ("noul", "choice", "score")
SOURCES = ("evals-dev", "vader-tweets", "vader-amazon", "vader-movies", "typed-decisions")
CF_STATE = "N/A"
BATCH_MIN = 8
FLOOR = 1e-12
# the default readout of the served model, per type (its calibration file's `defaults`)
READ = {"noul": LettersReadout(LABELS, IDS, rotations=1), "choice": LettersReadout(LABELS, IDS, rotations=2)}
READ["score"] = READ["choice"]


def items_of(source: str, cache_dir: str, per_stratum: Sequence[int] | None = None) -> list[Item]:
    """A source's items; for a registry source, the union of its subsamples of each size given."""
    if source.startswith("evals-"):
        return load_items(Path(__file__).resolve().parent / "data" / f"{source.removeprefix('evals-')}.jsonl")
    seen: dict[str, Item] = {}
    for size in per_stratum or [None]:
        for item in load_source(source, cache_dir, per_stratum=size):
            seen.setdefault(item.id, item)
    return list(seen.values())


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
    soft: tuple[float, ...] | None = None  # a soft gold in option order, where the source has one
    label_mass: float = 1.0  # the readings' (for the abstain rule)
    agreement: float | None = None


def rows_of(source: str, items: Sequence[Item], pool: Pool) -> list[Row]:
    out = []
    for item, qid, q in questions_of(items):
        qtype = question_type(q)
        readout = READ[qtype]
        sig = signature(item.request["questions"][qid])
        got = [pool.get((item.id, qid), {}).get(o) for o in readout.orders(q)]
        cf = [pool.get((f"cf-{sig}", qid), {}).get(o) for o in readout.orders(q)]
        if any(g is None for g in got):
            continue
        combined = readout.combine(q, got)
        probs = combined.probs
        free = None if any(c is None for c in cf) else readout.combine(q, cf).probs
        soft = _soft(item, qid)
        gold = readings.expected_index(item, qid)
        mass, agreement = combined.label_mass, combined.order_agreement
        out.append(Row(source, qtype, len(probs), sig, probs, free, gold, soft, mass, agreement))
    return out


def _soft(item: Item, qid: str) -> tuple[float, ...] | None:
    """The source's soft gold of a question in the question's option order (noul: true, false)."""
    if not item.soft or qid not in item.soft:
        return None
    gold, q = item.soft[qid], item.request["questions"][qid]
    if q["type"] == "noul":
        names = ["true", "false"]
    elif q["type"] == "choice":
        names = list(q["criteria"])
    else:
        names = [str(j) for j in range(len(q["criteria"]))]
    return tuple(gold.get(n, 0.0) for n in names)


def soft_figures(rows: Sequence[Row], bins: int = 15) -> dict[str, float]:
    """Against a soft gold: the ECE of our top answer's probability against the gold's probability
    of that answer, and the mean total variation between the two distributions."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    tv = 0.0
    for r in rows:
        assert r.soft is not None
        top = max(range(r.n), key=lambda j: r.probs[j])
        k = min(int(r.probs[top] * bins), bins - 1)
        sums[k][0] += 1
        sums[k][1] += r.probs[top]
        sums[k][2] += r.soft[top]
        tv += 0.5 * math.fsum(abs(a - b) for a, b in zip(r.probs, r.soft, strict=True))
    ece = math.fsum(abs(c - g) for _, c, g in sums.values()) / max(len(rows), 1)
    return {"soft_ece": ece, "total_variation": tv / max(len(rows), 1)}


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


METHODS = ("raw", "shipped", "chosen", "T", "T(n)", "T+ord", "CF", "CF+T", "CF/2+T", "BC", "BC+T")
# What ships for the default readouts (`ship`): per type, the method that held on every source
# left out, the non-sentiment ones (evals-dev, typed-decisions) included; docs/quality-model.md.
CHOSEN = {"noul": "raw", "choice": "CF+T", "score": "raw"}
# the shipped file's temperatures for the default readout (noul letters R=1, choice and score R=2)
SHIPPED_FILE = Path(__file__).resolve().parents[1] / "src/openjev/calibrations/qwen2.5-coder-1.5b.json"


def shipped_fits(path: Path = SHIPPED_FILE) -> dict[str, dict]:
    """The shipped file's fit of each type's default readout (noul letters R=1, choice and score R=2)."""
    doc = json.loads(path.read_text())
    fits = {(f["readout"], f.get("rotations", 1)): f["types"] for f in doc["fits"]}
    return {"noul": fits[("letters", 1)]["noul"]} | {t: fits[("letters", 2)][t] for t in ("choice", "score")}


def chosen_fit(qtype: str, rows: Sequence[Row]) -> dict:
    """The file entry of CHOSEN[qtype] fitted on `rows` (every human-labelled source)."""
    mine = [r for r in rows if r.qtype == qtype]
    if CHOSEN[qtype] == "raw":
        return {"temperature": 1.0, "bias": [], "n": len(mine), "form": "none"}
    t = fit_t(_pre("CF", mine))
    return {"temperature": t, "bias": [], "content_free": True, "n": len(mine), "form": "content-free+temperature"}


def _tilt(probs: Sequence[float], t: float, a: float, b: float) -> tuple[float, ...]:
    """`probs` at temperature t, then tilted by level: log p_j + a z_j + b z_j^2, z_j from -1/2 to 1/2."""
    n = len(probs)
    z = [j / (n - 1) - 0.5 for j in range(n)]
    logs = [math.log(max(p, FLOOR)) / t + a * z[j] + b * z[j] ** 2 for j, p in enumerate(probs)]
    top = max(logs)
    return _norm([math.exp(x - top) for x in logs])


def fit_ord(rows: Sequence[Row]) -> tuple[float, float, float]:
    """(T, a, b) of `_tilt` by NLL: an ordinal-aware calibration of a scale (a leaning toward one
    end, b toward the ends or the middle); tiny ridge on a and b."""
    from scipy.optimize import minimize

    def loss(x: np.ndarray) -> float:
        t, a, b = max(float(x[0]), 0.05), float(x[1]), float(x[2])
        nll = math.fsum(-math.log(max(_tilt(r.probs, t, a, b)[r.correct], FLOOR)) for r in rows) / len(rows)
        return nll + 1e-3 * (a * a + b * b)

    x = minimize(loss, np.array([1.0, 0.0, 0.0]), method="Nelder-Mead", options={"xatol": 1e-3, "fatol": 1e-5}).x
    return max(float(x[0]), 0.05), float(x[1]), float(x[2])


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
        if name == "shipped":  # the 1.5B's shipped file (another model's rows: its figures are not shown)
            fit = shipped_fits()[t]
            te = _pre("CF", te) if fit.get("content_free") else te
            out += [replace(r, probs=_temper(r.probs, fit["temperature"])) for r in te]
        elif name == "chosen" and CHOSEN[t] == "CF+T":
            out += [replace(r, probs=_temper(r.probs, fit_t(_pre("CF", tr)))) for r in _pre("CF", te)]
        elif name == "chosen":
            out += te
        elif name == "T+ord" and t == "score" and tr:
            temp, a, b = fit_ord(tr)
            out += [replace(r, probs=_tilt(r.probs, temp, a, b)) for r in te]
        elif name == "T+ord":
            temp = fit_t(tr)
            out += [replace(r, probs=_temper(r.probs, temp)) for r in te]
        elif name.endswith("T(n)"):
            a, b = fit_tn(tr)
            out += [replace(r, probs=_temper(r.probs, max(a - b * math.log(r.n), 0.05))) for r in te]
        elif name.endswith("+T") or name == "T":
            temp = fit_t(tr)
            out += [replace(r, probs=_temper(r.probs, temp)) for r in te]
        else:
            out += te
    return out


def _single(order: Sequence[int], lp: Sequence[float]) -> tuple[float, ...]:
    """One reading's answer in the question's own option order."""
    top = max(lp)
    shown = _norm([math.exp(x - top) for x in lp])
    out = [0.0] * len(order)
    for position, option in enumerate(order):
        out[option] = shown[position]
    return tuple(out)


def score_variants(source: str, items: Sequence[Item], pool: Pool) -> dict[str, list[Row]]:
    """A scale's answer read forward only, reversed only, and both (the default), uncalibrated."""
    out: dict[str, list[Row]] = {"forward": [], "reversed": [], "both": []}
    readout = READ["score"]
    for item, qid, q in questions_of(items):
        if question_type(q) != "score":
            continue
        orders = readout.orders(q)
        got = [pool.get((item.id, qid), {}).get(o) for o in orders]
        if any(g is None for g in got) or len(orders) != 2:
            continue
        gold = readings.expected_index(item, qid)
        n = len(orders[0])
        for name, probs in (
            ("forward", _single(orders[0], got[0])),
            ("reversed", _single(orders[1], got[1])),
            ("both", readout.combine(q, got).probs),
        ):
            out[name].append(Row(source, "score", n, "", probs, None, gold))
    return out


def ece_floor(scored: Sequence[Scored], draws: int = 200, seed: int = 0) -> float:
    """The mean ECE of a perfectly calibrated answerer with these confidences on this many questions
    (each right with the probability it gives): what a cell's ECE is made of by its size alone."""
    import random

    rng = random.Random(seed)
    total = 0.0
    for _ in range(draws):
        sim = [
            Scored(s.qtype, s.probs, s.top if rng.random() < max(s.probs) else (s.top + 1) % len(s.probs))
            for s in scored
        ]
        total += summarize(sim)["ece"]
    return total / draws


def figures(rows: Sequence[Row]) -> dict[str, float | int | None]:
    scored = [Scored(r.qtype, r.probs, r.correct) for r in rows]
    m = summarize(scored)
    out = {"n": len(rows), "accuracy": m["accuracy"], "ece": m["ece"], "nll": m["nll"], "brier": m.get("brier")}
    out["ece_floor"] = ece_floor(scored)
    if rows and all(r.soft is not None for r in rows):
        out |= soft_figures(rows)
    return out


def table(rows: Sequence[Row]) -> dict:
    """Per method and source: a human-labelled source fitted on the other human-labelled ones; a
    soft-gold source (another model's opinion: never fitted on) on all the human-labelled ones."""
    sources = sorted({r.source for r in rows}, key=lambda s: SOURCES.index(s) if s in SOURCES else 99)
    human = [r for r in rows if r.soft is None]
    out: dict = {}
    for name in METHODS:
        out[name] = {}
        for s in sources:
            test = held_out(name, [r for r in human if r.source != s], [r for r in rows if r.source == s])
            out[name][s] = {
                t: figures([r for r in test if r.qtype == t]) for t in TYPES if any(r.qtype == t for r in test)
            }
            out[name][s]["all"] = figures(test)
    return out


def markdown(full: dict, model: str) -> str:
    result = full["methods"]
    lines = [f"# Leave-one-source-out calibration: {model}", ""]
    sources = list(next(iter(result.values())))
    lines += ["Per method over every held-out (source, type) cell: the mean and worst ECE, the cells whose ECE is"]
    lines += ["above the uncalibrated reading's by more than 0.005, and the mean accuracy change against it.", ""]
    floors = [result["raw"][s][t]["ece_floor"] for s in sources for t in TYPES if t in result["raw"][s]]
    lines += [
        f"(A perfectly calibrated answerer's mean ECE on cells of these sizes: {sum(floors) / len(floors):.3f}.)",
        "",
    ]
    lines += ["| method | mean ECE | worst ECE | cells worse than raw | accuracy change |", "|---|---|---|---|---|"]
    for name, per in result.items():
        cells = [(s, t) for s in sources for t in TYPES if t in per[s]]
        eces = [per[s][t]["ece"] for s, t in cells]
        worse = sum(per[s][t]["ece"] > result["raw"][s][t]["ece"] + 0.005 for s, t in cells)
        gain = [per[s][t]["accuracy"] - result["raw"][s][t]["accuracy"] for s, t in cells]
        lines.append(
            f"| {name} | {sum(eces) / len(eces):.3f} | {max(eces):.3f} | {worse} of {len(cells)} | "
            f"{sum(gain) / len(gain):+.3f} |"
        )
    lines += ["", "Each cell: ECE / accuracy (n) of the source when fitted on all the others.", ""]
    lines += ["| method | type | " + " | ".join(sources) + " |", "|---|---|" + "---|" * len(sources)]
    for name, per in result.items():
        for t in (*TYPES, "all"):
            cells = []
            for s in sources:
                m = per[s].get(t)
                cells.append("-" if m is None else f"{m['ece']:.3f} / {m['accuracy']:.3f} ({m['n']})")
            lines.append(f"| {name} | {t} | " + " | ".join(cells) + " |")
    lines += ["", "Scales read one way or both (uncalibrated): ECE / accuracy (n)", ""]
    variants = full["score_readings"]
    lines += ["| reading | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for name in ("forward", "reversed", "both"):
        cells = [
            "-" if name not in v else f"{v[name]['ece']:.3f} / {v[name]['accuracy']:.3f} ({v[name]['n']})"
            for v in variants.values()
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _service(model: str):
    from quality_model_table import _service as service

    return service(model)


def record(args: argparse.Namespace) -> int:
    from openjev.core.readouts import ReadoutSpec

    service, loaded = _service(args.model)
    folder = Path(args.out) / args.model
    spec = ReadoutSpec("letters", args.rotations)
    todo = {s: items_of(s, args.cache_dir, args.per_stratum)[: args.limit or None] for s in args.sources}
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
        rows += rows_of(source, items_of(source, args.cache_dir, args.per_stratum), pool)
    result = table(rows)
    if args.model != "qwen2.5-coder-1.5b":
        result.pop("shipped")
    variants: dict[str, dict] = {}
    for source in args.sources:
        got = score_variants(source, items_of(source, args.cache_dir, args.per_stratum), pool)
        variants[source] = {name: figures(rs) for name, rs in got.items() if rs}
    result = {"methods": result, "score_readings": variants}
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / f"sources-{args.model}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result, args.model)
    (results / f"sources-{args.model}.md").write_text(text)
    sys.stdout.write(text)
    return 0


def abstain_rule(rows: Sequence[Row]) -> tuple[AbstainRule, dict[str, tuple[float, float, float]]]:
    """The abstain rule for the CHOSEN answers that holds on every human-labelled source: of
    abstain_table's grid, those keeping coverage >= MIN_COVERAGE and gaining >= MIN_GAIN of
    accuracy on each, the best mean accuracy answered (ties: more coverage); and what it does
    on each source: coverage, accuracy answered, accuracy all."""
    fits = {t: chosen_fit(t, rows) for t in TYPES}
    reads: dict[str, list[Read]] = defaultdict(list)
    for r in rows:
        fit = fits[r.qtype]
        probs = _divide(r.probs, r.cf) if fit.get("content_free") and r.cf else r.probs
        probs = _temper(probs, fit["temperature"])
        top = max(range(len(probs)), key=probs.__getitem__)
        reads[r.source].append(Read(r.qtype, top == r.correct, r.label_mass, r.agreement, max(probs)))
    human = [s for s in reads if s != "typed-decisions"]
    best, best_key = AbstainRule(), (-1.0, -1.0)
    for candidate in grid():
        ms = [measure(reads[s], candidate) for s in human]
        if all(m["coverage"] >= MIN_COVERAGE and m["accuracy_answered"] - m["accuracy_all"] >= MIN_GAIN for m in ms):
            key = (sum(m["accuracy_answered"] for m in ms) / len(ms), sum(m["coverage"] for m in ms) / len(ms))
            if key > best_key:
                best, best_key = candidate, key
    rule = best
    held = {}
    for source, rs in reads.items():
        m = measure(rs, rule)
        held[source] = (round(m["coverage"], 3), round(m["accuracy_answered"], 3), round(m["accuracy_all"], 3))
    return rule, held


def ship(args: argparse.Namespace) -> int:
    """Rewrite the shipped file's default-readout fits with CHOSEN, fitted on every human-labelled source."""
    pool = pooled(Path(args.out) / args.model)
    rows = [
        r
        for s in args.sources
        for r in rows_of(s, items_of(s, args.cache_dir, args.per_stratum), pool)
        if r.soft is None
    ]
    doc = json.loads(SHIPPED_FILE.read_text())
    for f in doc["fits"]:
        if f["readout"] == "letters" and f.get("rotations", 1) in (1, 2):
            for t in ("noul",) if f.get("rotations", 1) == 1 else ("choice", "score"):
                f["types"][t] = chosen_fit(t, rows)
        if f["readout"] == "canonical":  # a scale read canonically is read both ways: the same fit
            f["types"]["score"] = chosen_fit("score", rows)
    sources = sorted({r.source for r in rows})
    rule, held = abstain_rule(rows)
    doc["defaults"]["abstain"] = rule.describe()
    print(f"abstain: {rule_text(rule)}; on each source (coverage, accuracy answered / all): {held}")
    doc["id"], doc["created"] = "qwen2.5-coder-1.5b-sources-v5", args.created
    doc["data"] = {
        "files": sources,
        "items": len(rows),
        "default_readouts": "per type CHOSEN by leave-one-source-out (evals/source_table.py); other readouts: dev",
    }
    SHIPPED_FILE.write_text(json.dumps(doc, indent=2) + "\n")
    print({t: chosen_fit(t, rows) for t in TYPES})
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("record", "table", "ship"):
        c = sub.add_parser(name)
        c.add_argument("--model", required=True)
        c.add_argument("--out", default="evals/results/readings")
        c.add_argument("--cache-dir", default="~/.cache/openjev")
        c.add_argument("sources", nargs="*", default=list(SOURCES))
        c.add_argument(
            "--per-stratum",
            type=int,
            nargs="+",
            help="registry sources: items per stratum (default: the source's); several: the union of those subsamples",
        )
    sub.choices["record"].add_argument("--limit", type=int)
    sub.choices["record"].add_argument("--rotations", type=int, default=2, help="letters rotations to record")
    sub.choices["table"].add_argument("--results", default="evals/results")
    sub.choices["ship"].add_argument("--created", required=True, help="the date written in the file")
    args = p.parse_args()
    return {"record": record, "table": build, "ship": ship}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
