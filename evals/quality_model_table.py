"""The quality table of a model too slow to read every configuration separately (the opt-in
1.5B quality model on 2 CPU cores): record each labelled item's per-reading label
log-probs once (openjev.evals.readings), then derive every readout row from them offline,
fit the calibration on dev only and report on test.

    # 1. record (slow; resumable, one JSON line per item; run it niced in the background)
    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python evals/quality_model_table.py record \\
        --model qwen2.5-coder-1.5b --rotations 1 evals/data/dev.jsonl evals/data/test.jsonl
    # 2. the table, the dev fit and the abstain curve (seconds)
    .venv/bin/python evals/quality_model_table.py table --model qwen2.5-coder-1.5b

`--rotations R` records letters with R rotations (R at least the most options of any choice
records every cyclic shift, from which R=1, 2 and 4 and their order-flip twins all
follow); `--parallel`, `--canonical` and `--yesno` record those readouts too. Rows that need an ordering that was not
recorded are left out of the table (and say so). The calibrated rows apply a fit made on
the dev records (openjev.evals.fit, the same as `openjev calibrate`) to the test records;
nothing is fitted on test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from openjev.core import calibration as calib
from openjev.core.ports import Engine
from openjev.core.readouts import CANONICAL_ORDER, LettersReadout, ParallelReadout, ReadoutSpec, YesNoReadout
from openjev.evals import readings
from openjev.evals.dataset import Item, load_items
from openjev.evals.fit import fit_readout
from openjev.evals.metrics import Scored, by_type

sys.path.insert(0, str(Path(__file__).resolve().parent))
from abstain_table import Read, choose, grid, measure, rule_text  # the embedded model's abstain table, reused

# Order matters on a tie: canonical reads noul and score exactly as letters R=1 (the same
# readings, the same NLL, the same tokens), and choose_per_type keeps the first of equals.
CONFIGS = [("letters", 1), ("letters", 2), ("letters", 4), ("parallel", 1), ("yesno", 1), ("canonical", 1)]
DATA = {"dev": "evals/data/dev.jsonl", "test": "evals/data/test.jsonl"}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def _model(name: str) -> str | None:
    return None if name == "embedded" else name


def _service(model: str):
    """(service, loaded engine) of `model` served in this process, uncalibrated."""
    from openjev.api.server.assembly import build_service
    from openjev.config import load_settings
    from openjev.engines import load_engine

    settings = load_settings({"engine": "transformers", "model": model, "calibration": "none"})
    loaded = load_engine(settings)
    return build_service(settings.quality, settings.limits, loaded), loaded


def _folder(args: argparse.Namespace) -> Path:
    return Path(args.out) / args.model


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def record(args: argparse.Namespace) -> int:
    service, loaded = _service(args.model)
    engine = loaded.engine
    specs = [ReadoutSpec("letters", args.rotations)] if args.rotations else []  # 0: no letters this run
    specs += [ReadoutSpec("parallel")] if args.parallel else []
    specs += [ReadoutSpec("canonical")] if args.canonical else []
    specs += [ReadoutSpec("mirror")] if args.mirror else []
    specs += [ReadoutSpec("yesno")] if args.yesno else []
    splits = {path: load_items(path)[: args.limit] if args.limit else load_items(path) for path in args.data}
    # Item by item, the splits in turn: a run stopped early (the compute is the limit) still
    # leaves dev items to fit on and test items to report on, in proportion.
    for i in range(max(len(items) for items in splits.values())):
        for path, items in splits.items():
            for spec in specs:
                out = _folder(args) / f"{Path(path).stem}-{spec.name}-r{spec.rotations}.jsonl"
                readings.record(service, engine, items[i : i + 1], spec, out, log=_log)
    return 0


def _records(folder: Path, split: str) -> dict[str, dict]:
    """Recorded questions of a split per readout name: {"letters": recs, "yesno": recs}."""
    out: dict[str, dict] = {}
    for path in sorted(folder.glob(f"{split}-*.jsonl")):
        name = path.stem.split("-")[1]
        out.setdefault(name, {}).update(readings.recorded(readings.load(path)))
    return out


def _readout(service, name: str, rotations: int):
    return service.readout(ReadoutSpec(name, rotations))


def _rows(service, items, recs, name, rotations) -> list[tuple[Scored, Any]] | None:
    if name not in recs:
        return None
    readout = _readout(service, name, rotations)
    assert isinstance(readout, (LettersReadout, YesNoReadout, ParallelReadout))
    try:
        return readings.scored_rows(items, recs[name], readout)
    except readings.MissingReading:
        return None


def _calibrated(rows: list[tuple[Scored, Any]], fits: dict[str, dict]) -> list[Scored]:
    out = []
    for s, _ in rows:
        fit = fits.get(s.qtype)
        probs = s.probs if fit is None else calib.apply(calib.TypeFit(fit["temperature"], tuple(fit["bias"])), s.probs)
        out.append(Scored(s.qtype, probs, s.correct, s.flipped))
    return out


def _fmt(v: Any, f: str = "{:.3f}") -> str:
    return "-" if v is None else f.format(v)


def _recorded_items(items, recs: dict[str, dict]) -> list:
    """The items recorded under every readout that has records: every row of the table is
    then measured on the same questions."""
    recorded = [{k[0] for k in by_name} for by_name in recs.values()]
    common = set.intersection(*recorded) if recorded else set()
    return [i for i in items if i.id in common]


def _reads(rows: list[tuple[Scored, Any]], scored: list[Scored]) -> list[Read]:
    """abstain_table's rows: correctness of the (possibly calibrated) answer, the raw reading's
    label mass and order agreement (what the server's rule sees), and the answer's top
    probability (the confidence floor compared beside it)."""
    return [
        Read(s.qtype, s.top == s.correct, c.label_mass, c.order_agreement, s.probs[s.top])
        for (_, c), s in zip(rows, scored, strict=True)
    ]


def _label(spec: ReadoutSpec) -> str:
    if spec.per_type:
        return spec.describe().replace(";", ", ")
    return spec.name + (f", R={spec.rotations}" if spec.name == "letters" else "")


TYPES = ("noul", "choice", "score")
CHEAPER_WITHIN = 0.01  # a cheaper readout whose dev NLL is this close to the best one is taken


def _typed_items(items, qtype: str) -> list:
    """The items reduced to their questions of one type (items without any are left out)."""
    out = []
    for item in items:
        qs = {k: q for k, q in item.request["questions"].items() if q["type"] == qtype}
        if qs:
            out.append(Item(item.id, {**item.request, "questions": qs}, {k: item.expected[k] for k in qs}))
    return out


def choose_per_type(service, items, fits_doc: list[dict]) -> tuple[ReadoutSpec, list[dict]]:
    """Per question type, the readout with the lowest cross-validated NLL on dev after its
    calibration (its fit's `cv_nll`, temperature form: accuracy and calibration in one
    number, measured on dev only); a readout that costs fewer tokens for that type and
    comes within CHEAPER_WITHIN of it is taken instead. The evidence comes back as rows."""
    evidence, chosen = [], {}
    for qtype in TYPES:
        typed = _typed_items(items, qtype)
        rows = []
        for f in fits_doc:
            fit = f["types"].get(qtype)
            if fit is None:
                continue
            spec = ReadoutSpec(f["readout"], f["rotations"])
            nll = fit["cv_nll"].get("temperature", fit["nll_before"])
            rows.append(
                {
                    "type": qtype,
                    "readout": _label(spec),
                    "spec": spec,
                    "dev_cv_nll": nll,
                    "dev_raw_nll": fit["nll_before"],
                    "tokens": readings.tokens(service, typed, spec),
                }
            )
        best = min(r["dev_cv_nll"] for r in rows)
        pick = min(
            (r for r in rows if r["dev_cv_nll"] <= best + CHEAPER_WITHIN), key=lambda r: (r["tokens"], r["dev_cv_nll"])
        )
        chosen[qtype] = pick["spec"]
        for r in rows:
            evidence.append({**{k: v for k, v in r.items() if k != "spec"}, "chosen": r is pick})
    counts: dict[ReadoutSpec, int] = {}
    first: dict[ReadoutSpec, int] = {}
    for n, qtype in enumerate(TYPES):
        counts[chosen[qtype]] = counts.get(chosen[qtype], 0) + 1
        first.setdefault(chosen[qtype], n)
    base = max(counts, key=lambda spec: (counts[spec], -first[spec]))  # the most types; ties: the earliest
    return ReadoutSpec(base.name, base.rotations, tuple(chosen.items())), evidence


def _policy(args: argparse.Namespace, service=None, items=None, fits_doc=None) -> ReadoutSpec | None:
    """The default named by --default and --per-type (`--default auto`: chosen per type on
    dev, choose_per_type), or None."""
    if not args.default:
        return None
    if args.default == "auto":
        policy, args.evidence = choose_per_type(service, items, fits_doc)
        return policy
    name, _, rot = args.default.partition(":")
    per_type = []
    for entry in args.per_type:
        qtype, _, readout = entry.partition("=")
        part, _, part_rot = readout.partition(":")
        per_type.append((qtype, ReadoutSpec(part, int(part_rot or 1))))
    return ReadoutSpec(name, int(rot or 1), tuple(per_type))


def table(args: argparse.Namespace) -> int:
    from openjev.core.wording import PROMPT_VERSION
    from openjev.engines.models.source import resolve_source, source_fingerprint

    folder = _folder(args)
    service = _service_for_tables(args.model)
    recs = {split: _records(folder, split) for split in DATA}
    items = {split: _recorded_items(load_items(path), recs[split]) for split, path in DATA.items()}
    rows, fits_doc, skipped, abstain = [], [], [], {}
    measured: dict[ReadoutSpec, dict] = {}  # per readout: its calibrated dev and test rows
    for name, rotations in CONFIGS:
        spec = ReadoutSpec(name, rotations)
        dev = _rows(service, items["dev"], recs["dev"], name, rotations)
        test = _rows(service, items["test"], recs["test"], name, rotations)
        label = _label(spec)
        if not dev or not test:
            skipped.append(label)
            continue
        # parallel and canonical read a choice in its canonical order: no per-position correction there
        order_free = ("choice",) if name in CANONICAL_ORDER else ()
        fits = fit_readout([s for s, _ in dev], prior=args.prior, order_free=order_free)
        fits_doc.append({"readout": name, "rotations": rotations, "types": fits})
        tokens = readings.tokens(service, items["test"], spec)
        for calibrated in (False, True):
            scored = _calibrated(test, fits) if calibrated else [s for s, _ in test]
            rows.append({"readout": label, "calibrated": calibrated, "metrics": by_type(scored), "tokens": tokens})
        abstain[label] = {
            "dev": _reads(dev, _calibrated(dev, fits)),
            "test": _reads(test, _calibrated(test, fits)),
        }
        measured[spec] = {"test": test, "fits": fits, "label": label}
    args.evidence = []
    policy = _policy(args, service, items["dev"], fits_doc)
    if policy is not None and policy.per_type:
        # the per-type default's own rows: each question as its type's readout answered it
        label = _label(policy)
        for calibrated in (False, True):
            scored = []
            for qtype in ("noul", "choice", "score"):
                m = measured[policy.for_type(qtype)]
                part = [(s, c) for s, c in m["test"] if s.qtype == qtype]
                scored += _calibrated(part, m["fits"]) if calibrated else [s for s, _ in part]
            tokens = readings.tokens(service, items["test"], policy)
            rows.append({"readout": label, "calibrated": calibrated, "metrics": by_type(scored), "tokens": tokens})
        abstain[label] = {
            split: [
                r
                for qtype in ("noul", "choice", "score")
                for r in abstain[_label(policy.for_type(qtype))][split]
                if r.qtype == qtype
            ]
            for split in ("dev", "test")
        }
    source = resolve_source(_model(args.model))
    today = datetime.date.today().isoformat()
    doc = {
        "format": calib.FORMAT,
        "id": args.id or f"{args.model}-dev-{today}",
        "model": {"name": args.model, "fingerprint": source_fingerprint(source)},
        "prompt_version": PROMPT_VERSION,
        "base_temperature": 1.0,
        "created": today,
        "data": {"files": ["dev.jsonl"], "items": len(items["dev"])},
        "fits": fits_doc,
    }
    if policy is not None:
        rule = choose(abstain[_label(policy)]["dev"]) if _label(policy) in abstain else None
        doc["defaults"] = {"readout": policy.name, "rotations": policy.rotations}
        if policy.per_type:
            doc["defaults"]["per_type"] = {
                qtype: {"readout": spec.name, "rotations": spec.rotations} for qtype, spec in policy.per_type
            }
        if rule is not None:
            doc["defaults"]["abstain"] = rule.describe()
    calib.from_dict(doc)  # what we write must load
    (folder / "calibration-dev.json").write_text(json.dumps(doc, indent=2) + "\n")
    shown = (*ABSTAIN_ROWS, _label(policy)) if policy is not None else ABSTAIN_ROWS
    text = _markdown(args, rows, skipped, items, abstain, shown)
    Path(args.results).mkdir(parents=True, exist_ok=True)
    (Path(args.results) / f"quality-{args.model}.md").write_text(text)
    (Path(args.results) / f"quality-{args.model}.json").write_text(
        json.dumps({"cpu": cpu_name(), "rows": rows, "fits": fits_doc}, indent=2) + "\n"
    )
    sys.stdout.write(text)
    return 0


def _service_for_tables(model: str):
    """A service over the model's tokenizer only (the table needs readouts and plans, no
    forward pass): its engine refuses to run."""
    from transformers import AutoTokenizer

    from openjev.api.server.assembly import build_service
    from openjev.config import load_settings
    from openjev.engines import LoadedEngine, ModelCard
    from openjev.engines.models.source import gguf_cache_folder, resolve_source
    from openjev.engines.models.tokenizer import HFChatTokenizer

    settings = load_settings({"engine": "transformers", "model": model, "calibration": "none"})
    source = resolve_source(settings.served.model, settings.served.cache_dir)
    tok = AutoTokenizer.from_pretrained(gguf_cache_folder(source, settings.served.cache_dir), local_files_only=True)

    class NoEngine(Engine):
        parallel_layouts = True  # it stands for the in-process engine the readings were recorded on

        async def run(self, _plan):
            raise RuntimeError("the table reads recorded log-probs; nothing runs the model")

        async def close(self) -> None:
            return None

        def stats(self) -> dict[str, float]:
            return {}  # it runs nothing

    return build_service(
        settings.quality, settings.limits, LoadedEngine(NoEngine(), HFChatTokenizer(tok), ModelCard(model, "", ""), 0.0)
    )


ABSTAIN_ROWS = ("letters, R=1", "letters, R=4", "parallel")  # the candidate defaults: the abstain curve is theirs


def _markdown(args, rows, skipped, items, abstain, shown) -> str:
    n_dev = sum(len(i.expected) for i in items["dev"])
    n_test = sum(len(i.expected) for i in items["test"])
    lines = [
        f"# Quality table: {args.model}",
        "",
        f"Made by `evals/quality_model_table.py table --model {args.model}` from the recorded readings in "
        f"`{_folder(args)}`; CPU: {cpu_name()}. Fitted on dev ({len(items['dev'])} items, {n_dev} questions), "
        f"reported on test ({len(items['test'])} items, {n_test} questions). Tokens: what a cold request computes "
        "(mean over the test items).",
        "",
        "| readout | calibrated | accuracy | ECE | Brier | NLL | acc@p>=0.9 (coverage) | choice order flips | tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["metrics"]["all"]
        sel = "-" if m["accuracy_at_0.9"] is None else f"{m['accuracy_at_0.9']:.2f} ({m['coverage_at_0.9']:.2f})"
        lines.append(
            f"| {r['readout']} | {'yes' if r['calibrated'] else 'no'} | {m['accuracy']:.3f} | {m['ece']:.3f} | "
            f"{m['brier']:.3f} | {m['nll']:.3f} | {sel} | {_fmt(r['metrics']['choice']['order_flip_rate'])} | "
            f"{r['tokens']:.0f} |"
        )
    if skipped:
        lines += ["", f"Not in this table (their orderings were not recorded): {', '.join(skipped)}."]
    if args.evidence:
        lines += [
            "",
            "## The readout per question type, chosen on dev",
            "",
            "Per type, the readout with the lowest cross-validated NLL on dev after its calibration "
            f"(5 folds, temperature); a cheaper one (tokens of that type's questions alone) within "
            f"{CHEAPER_WITHIN} of it is taken instead. Nothing from test enters the choice.",
            "",
            "| type | readout | dev NLL raw | dev NLL calibrated (cv) | tokens | chosen |",
            "|---|---|---|---|---|---|",
        ]
        for e in args.evidence:
            lines.append(
                f"| {e['type']} | {e['readout']} | {e['dev_raw_nll']:.3f} | {e['dev_cv_nll']:.3f} | "
                f"{e['tokens']:.0f} | {'**yes**' if e['chosen'] else ''} |"
            )
    lines += [
        "",
        "Per question type (accuracy / ECE / Brier / NLL; n):",
        "",
        "| readout | calibrated | noul | choice | score |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = []
        for t in ("noul", "choice", "score"):
            m = r["metrics"][t]
            cells.append(
                f"{m['accuracy']:.3f} / {m['ece']:.3f} / {m['brier']:.3f} / {m['nll']:.3f}; {m['questions']}"
                if m.get("questions")
                else "-"
            )
        lines.append(f"| {r['readout']} | {'yes' if r['calibrated'] else 'no'} | " + " | ".join(cells) + " |")
    for label, sets in abstain.items():
        if label not in shown:
            continue
        chosen = choose(sets["dev"])
        lines += [
            "",
            f"## Abstention, {label}, calibrated",
            "",
            f"The server's rule (label-mass, order-agreement or calibrated-confidence floors), chosen on dev: "
            f"{rule_text(chosen)} "
            "(abstain_table.choose: best accuracy on answered with coverage >= 50 % and a gain >= 2 points; else none).",
            "",
            "| rule | dev coverage | dev acc. answered | test coverage | test acc. answered |",
            "|---|---|---|---|---|",
        ]
        for rule in grid():
            if rule.min_order_agreement and all(r.order_agreement is None for r in sets["dev"]):
                continue  # one ordering read: the agreement floor never applies
            d, t = measure(sets["dev"], rule), measure(sets["test"], rule)
            mark = " **(chosen)**" if rule == chosen else ""
            lines.append(
                f"| {rule_text(rule)}{mark} | "
                f"{d['coverage']:.2f} | {d['accuracy_answered']:.3f} | {t['coverage']:.2f} | "
                f"{t['accuracy_answered']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record per-reading log-probs (slow, resumable)")
    rec.add_argument("data", nargs="+")
    rec.add_argument("--rotations", type=int, default=1, help="letters rotations to record (0: none)")
    rec.add_argument("--parallel", action="store_true")
    rec.add_argument("--canonical", action="store_true")
    rec.add_argument("--mirror", action="store_true")
    rec.add_argument("--yesno", action="store_true")
    rec.add_argument("--limit", type=int)
    tab = sub.add_parser("table", help="derive the rows, fit on dev, report on test")
    tab.add_argument("--results", default="evals/results")
    tab.add_argument(
        "--default",
        metavar="READOUT[:ROTATIONS]",
        help="the model's default readout, named in the calibration file; auto: chosen per type on dev",
    )
    tab.add_argument("--id", help="the calibration's id (default: MODEL-dev-DATE)")
    tab.add_argument(
        "--per-type",
        action="append",
        default=[],
        metavar="TYPE=READOUT[:ROTATIONS]",
        help="another default readout for one question type (repeatable), e.g. choice=yesno",
    )
    tab.add_argument("--prior", action="store_true", help="allow a per-position prior in the fit (default: T only)")
    for p in (rec, tab):
        p.add_argument("--model", required=True)
        p.add_argument("--out", default="evals/results/readings")
    args = ap.parse_args()
    return record(args) if args.command == "record" else table(args)


if __name__ == "__main__":
    raise SystemExit(main())
