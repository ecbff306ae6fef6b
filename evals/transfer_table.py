"""Does a readout and its fit carry to other text? A leave-one-domain-out evaluation.

The labelled items (dev and test together) are grouped by what their state is
(openjev.evals.domains: tickets, reviews, logs, one-liners, e-mails, other languages,
chats, JSON records). For each group, each readout's calibration is fitted on every other
group and judged on the held-out one; the held-out answers of all groups pooled give the
"held-out group" figures, per question type, beside the in-domain ones: the same fit
judged on items of the groups it saw (8 folds by item, the same amount of training data)
and the fit on dev judged on test (the protocol of docs/quality.md).

Every row is derived from recorded label log-probs (evals/quality_model_table.py record:
every cyclic shift of each choice, each scale both ways, and the canonical and mirror
readings) with the core readouts' own `combine`, so a row is what a server at that
configuration computes. Two fit forms: `T` (a temperature per type) and `T+prior` (the
shipped rule: a per-position correction kept where 5-fold cross-validation on the
training data says it helps; never for a position-free readout's choice questions).

`pride` is one canonical reading divided by a position prior per option count (PriDe,
Zheng et al. 2024), estimated without labels from the training groups' permuted readings.

    .venv/bin/python evals/transfer_table.py --readings evals/results/readings/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from openjev.core import calibration as calib
from openjev.core import scoring
from openjev.core.readouts import LettersReadout, question_type
from openjev.core.types import ChoiceQuestion, NoulQuestion, Question
from openjev.evals import readings
from openjev.evals.dataset import Item, load_items
from openjev.evals.domains import domain_of_id
from openjev.evals.fit import (
    fit_readout,
    fit_type_held_out_uniform,
    fit_type_worst_excess,
    fit_type_worst_group,
    fit_type_worst_group_uniform,
)
from openjev.evals.metrics import Scored, summarize

TYPES = ("noul", "choice", "score")
LABELS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
IDS = tuple(range(len(LABELS)))  # the recordings carry the log-probs; ids are never looked up
Pool = dict[tuple[str, str], dict[tuple[int, ...], tuple[float, ...]]]


def pooled(folder: Path) -> Pool:
    """Per (item, question): every recorded ordering's label log-probs (letters, canonical and
    mirror readings of one ordering show the same text, so any of them serves)."""
    out: Pool = {}
    for path in sorted(folder.glob("*.jsonl")):
        if "-yesno-" in path.name or "-parallel-" in path.name:
            continue
        for rec in readings.recorded(readings.load(path)).values():
            by_order = out.setdefault((rec.item, rec.qid), {})
            for order, lp in zip(rec.orders, rec.logprobs, strict=True):
                if order is not None:
                    by_order.setdefault(tuple(order), lp)
    return out


def _lps(pool: Pool, key: tuple[str, str], orders: Sequence[tuple[int, ...]]) -> list[tuple[float, ...]] | None:
    got = pool.get(key, {})
    return [got[o] for o in orders] if all(o in got for o in orders) else None


Priors = dict[str, dict[int, list[float]]]  # question type -> option count -> position prior


def _mean_prior(rows: Sequence[Sequence[float]], n: int) -> list[float]:
    """The softmax of the mean log-probability each displayed position got over `rows` (the
    readings of one question in several orders: the options' own merit cancels)."""
    logs = [[math.log(max(p, 1e-12)) for p in scoring.softmax(lp, 1.0)] for lp in rows]
    return scoring.softmax([math.fsum(row[j] for row in logs) / len(logs) for j in range(n)], 1.0)


def _averaged(sums: dict[int, list[float]], counts: dict[int, int]) -> dict[int, list[float]]:
    return {n: [v / counts[n] for v in acc] for n, acc in sums.items()}


def prior_by_count(
    pool: Pool, questions: Sequence[tuple[tuple[str, str], Question]], types: Sequence[str] = ("choice", "score")
) -> Priors:
    """PriDe's position prior per question type (of `types`) and option count, no labels used.
    choice: for each question with all n cyclic shifts recorded, `_mean_prior` over the
    shifts, then the mean of those per n. score: the same over the scale and its reverse
    (what canonical reads): position j showed level j once and level n-1-j once, so what
    is left is the preference for the position, symmetric in j and n-1-j as the server
    applies it (core.calibration.apply, `mirrored`)."""
    sums: dict[str, dict[int, list[float]]] = {t: {} for t in types}
    counts: dict[str, dict[int, int]] = {t: {} for t in types}
    for key, q in questions:
        n = readings_n(q)
        if n < 2 or isinstance(q, NoulQuestion) or question_type(q) not in types:
            continue
        if isinstance(q, ChoiceQuestion):
            qtype, orders = "choice", [tuple((s + j) % n for j in range(n)) for s in range(n)]
        else:
            qtype, orders = "score", [tuple(range(n)), tuple(range(n))[::-1]]
        lps = _lps(pool, key, orders)
        if lps is None:
            continue
        prior = _mean_prior(lps, n)
        acc = sums[qtype].setdefault(n, [0.0] * n)
        for j in range(n):
            acc[j] += prior[j]
        counts[qtype][n] = counts[qtype].get(n, 0) + 1
    return {t: _averaged(sums[t], counts[t]) for t in sums}


def prior_of_readings(pool: Pool, questions: Sequence[tuple[tuple[str, str], Question]]) -> Priors:
    """The cheaper estimate for choice: no permuted readings, only each question's one
    canonical reading: per option count, the mean over questions of the probability each
    displayed position got. Over many questions the options' merit averages out wherever the
    right answer is not tied to a position (canonical order is by text). No labels used.
    score: as prior_by_count (canonical reads every scale both ways)."""
    readout = LettersReadout(LABELS, IDS, canonical=True)
    sums: dict[int, list[float]] = {}
    counts: dict[int, int] = {}
    for key, q in questions:
        n = readings_n(q)
        if n < 2 or not isinstance(q, ChoiceQuestion):
            continue
        lps = _lps(pool, key, readout.orders(q)[:1])
        if lps is None:
            continue
        probs = scoring.softmax(lps[0], 1.0)
        acc = sums.setdefault(n, [0.0] * n)
        for j in range(n):
            acc[j] += probs[j]
        counts[n] = counts.get(n, 0) + 1
    return {"choice": _averaged(sums, counts), "score": prior_by_count(pool, questions, ("score",))["score"]}


PRIOR_ESTIMATE = {
    "pride": prior_by_count,
    "pride+scales": prior_by_count,
    "pride-mean": prior_of_readings,
}
# the question types whose position prior each config divides out (and writes into its fit)
PRIOR_TYPES = {"pride": ("choice",), "pride+scales": ("choice", "score"), "pride-mean": ("choice",)}


def readings_n(q: Question) -> int:
    from openjev.core.readouts import n_options

    return n_options(q)


Combiner = Callable[[Question, tuple[str, str], Pool, Priors], tuple[float, ...] | None]


def _readout_combiner(readout: LettersReadout) -> Combiner:
    def combine(q, key, pool, _prior):
        lps = _lps(pool, key, readout.orders(q))
        return None if lps is None else readout.combine(q, lps).probs

    return combine


def _pride_for(types: tuple[str, ...]) -> Combiner:
    """canonical's readings, with the position prior of `types` divided out exactly as a
    server with that fit's `position_prior` does (core.calibration.apply at T=1: the fit's
    temperature applies after it, and softmax(log p / T) of the renormalised answer is the
    same as of the raw one): a choice's one reading by the prior of its letters, a scale
    read both ways by the symmetrised prior."""
    readout = LettersReadout(LABELS, IDS, canonical=True)

    def combine(q, key, pool, prior):
        lps = _lps(pool, key, readout.orders(q))
        if lps is None:
            return None
        got = readout.combine(q, lps)
        qtype = question_type(q)
        if qtype not in types or not prior.get(qtype):
            return got.probs
        fit = calib.TypeFit(1.0, (), {n: tuple(p) for n, p in prior[qtype].items()})
        return calib.apply(fit, got.probs, got.shown, got.clones, got.mirrored)

    return combine


CONFIGS: dict[str, tuple[Combiner, tuple[str, ...], int]] = {
    # name: (combiner, order-free types (no position prior in the fit), readings per choice)
    "letters R=1": (_readout_combiner(LettersReadout(LABELS, IDS, rotations=1)), (), 1),
    "letters R=2": (_readout_combiner(LettersReadout(LABELS, IDS, rotations=2)), (), 2),
    "letters R=4": (_readout_combiner(LettersReadout(LABELS, IDS, rotations=4)), (), 4),
    "canonical": (_readout_combiner(LettersReadout(LABELS, IDS, canonical=True)), ("choice",), 1),
    "pride": (_pride_for(PRIOR_TYPES["pride"]), ("choice",), 1),
    "pride+scales": (_pride_for(PRIOR_TYPES["pride+scales"]), ("choice", "score"), 1),
    "pride-mean": (_pride_for(PRIOR_TYPES["pride-mean"]), ("choice",), 1),
    "mirror": (_readout_combiner(LettersReadout(LABELS, IDS, mirror=True)), TYPES, 2),
}


def questions_of(items: Sequence[Item]) -> list[tuple[Item, str, Question]]:
    out = []
    for item in items:
        request = readings.core_request(item)
        for qid, q in request.questions:
            if qid in item.expected:
                out.append((item, qid, q))
    return out


def scored(name: str, qs, pool: Pool, prior: Priors) -> list[tuple[str, Scored]] | None:
    """(domain, Scored) per question under config `name`; None where an ordering is missing."""
    combine = CONFIGS[name][0]
    out = []
    for item, qid, q in qs:
        probs = combine(q, (item.id, qid), pool, prior)
        if probs is None:
            return None
        out.append(
            (item.domain or domain_of_id(item.id), Scored(question_type(q), probs, readings.expected_index(item, qid)))
        )
    return out


def _apply(fits: dict[str, dict], s: Scored) -> Scored:
    fit = fits.get(s.qtype)
    if fit is None:
        return s
    probs = calib.apply(calib.TypeFit(fit["temperature"], tuple(fit["bias"])), s.probs)
    # the uniform mix of the +U forms: measured here only (it did not pay: evals/results/transfer-*.md)
    lam = fit.get("uniform_weight", 0.0)
    return Scored(s.qtype, tuple((1 - lam) * p + lam / len(probs) for p in probs), s.correct)


WORST_GROUP_FITS = {
    "T-worst": fit_type_worst_group,
    "T-excess": fit_type_worst_excess,
    "T-worst+U": fit_type_worst_group_uniform,
    "T+U-lgo": fit_type_held_out_uniform,
}


def _fit(train: Sequence[tuple[str, Scored]], name: str, form: str) -> dict[str, dict]:
    """Per type, the fit of `form`: T (pooled NLL), T+prior (the shipped rule), T-worst (the
    T whose worst training group is best: fit_type_worst_group), T-excess (the T whose worst
    training group is least above a guess: fit_type_worst_excess) or T-worst+U (T and the
    uniform mix λ whose worst training group is best: fit_type_worst_group_uniform) or
    T+U-lgo (λ chosen by leave-one-group-out within the training groups, T pooled:
    fit_type_held_out_uniform)."""
    if form in WORST_GROUP_FITS:
        out = {}
        for t in TYPES:
            part = [(g, s) for g, s in train if s.qtype == t]
            if len(part) >= 10:
                out[t] = WORST_GROUP_FITS[form]([s for _, s in part], [g for g, _ in part])
        return out
    return fit_readout([s for _, s in train], order_free=CONFIGS[name][1], prior=form == "T+prior")


def _figures(samples: Sequence[Scored]) -> dict[str, dict]:
    out = {}
    for t in TYPES:
        part = [s for s in samples if s.qtype == t]
        if part:
            m = summarize(part)
            uniform = math.fsum(math.log(len(s.probs)) for s in part) / len(part)
            # the standard error of the mean excess over a guess: how far above a guess a
            # group's NLL must be before it says more than its few questions can
            excess = [-math.log(max(s.probs[s.correct], 1e-12)) - math.log(len(s.probs)) for s in part]
            mean = math.fsum(excess) / len(excess)
            var = math.fsum((e - mean) ** 2 for e in excess) / max(len(excess) - 1, 1)
            out[t] = {
                "n": len(part),
                "accuracy": m["accuracy"],
                "ece": m["ece"],
                "nll": m["nll"],
                "uniform_nll": uniform,
                "excess_se": math.sqrt(var / len(excess)),
            }
    return out


def evaluate(name: str, form: str, dev_qs, test_qs, pool: Pool) -> dict[str, Any] | None:
    everything = list(dev_qs) + list(test_qs)
    groups = sorted({item.domain or domain_of_id(item.id) for item, _, _ in everything})
    # dev -> test, the in-domain protocol of docs/quality.md
    estimate = PRIOR_ESTIMATE.get(name, prior_by_count)
    prior = estimate(pool, [((i.id, qid), q) for i, qid, q in dev_qs])
    dev, test = scored(name, dev_qs, pool, prior), scored(name, test_qs, pool, prior)
    if dev is None or test is None:
        return None
    fits = _fit(dev, name, form)
    dev_test = _figures([_apply(fits, s) for _, s in test])
    raw_test = _figures([s for _, s in test])
    # 8 folds by item (in-domain, as much training data as a held-out group has) and held-out groups
    by_item = sorted({i.id for i, _, _ in everything})
    folds = {iid: k % len(groups) for k, iid in enumerate(by_item)}
    in_domain, held_out, per_group = [], [], {}
    for k in range(len(groups)):
        train_qs = [x for x in everything if folds[x[0].id] != k]
        held_qs = [x for x in everything if folds[x[0].id] == k]
        in_domain += _fold(name, form, train_qs, held_qs, pool)
    for g in groups:
        train_qs = [x for x in everything if (x[0].domain or domain_of_id(x[0].id)) != g]
        held_qs = [x for x in everything if (x[0].domain or domain_of_id(x[0].id)) == g]
        got = _fold(name, form, train_qs, held_qs, pool)
        held_out += got
        per_group[g] = _figures(got)
    return {
        "readout": name,
        "form": form,
        "raw_test": raw_test,
        "dev_test": dev_test,
        "in_domain_cv": _figures(in_domain),
        "held_out_groups": _figures(held_out),
        "per_group": per_group,
        "dev_fits": fits,
    }


def _fold(name: str, form: str, train_qs, held_qs, pool: Pool) -> list[Scored]:
    prior = PRIOR_ESTIMATE.get(name, prior_by_count)(pool, [((i.id, qid), q) for i, qid, q in train_qs])
    train = scored(name, train_qs, pool, prior)
    held = scored(name, held_qs, pool, prior)
    assert train is not None and held is not None
    fits = _fit(train, name, form)
    return [_apply(fits, s) for _, s in held]


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def markdown(results: list[dict], head: str) -> str:
    lines = [
        head,
        "",
        "Per type: ECE / NLL / accuracy. held-out: each domain group predicted by a fit on the others, pooled.",
        "",
    ]
    lines += [
        "| readout | fit | type | raw (test) | dev -> test | in-domain (8 folds) | held-out groups | held-out minus in-domain ECE | groups worse than uniform (NLL; standard error of the excess) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for t in TYPES:
            cells = []
            for part in ("raw_test", "dev_test", "in_domain_cv", "held_out_groups"):
                m = r[part].get(t)
                cells.append("-" if m is None else f"{_f(m['ece'])} / {_f(m['nll'])} / {_f(m['accuracy'])}")
            gap = r["held_out_groups"][t]["ece"] - r["in_domain_cv"][t]["ece"]
            worse = [
                f"{g} ({m[t]['nll']:.3f} > {m[t]['uniform_nll']:.3f}, se {m[t]['excess_se']:.3f})"
                for g, m in r["per_group"].items()
                if t in m and m[t]["nll"] > m[t]["uniform_nll"] + 1e-9
            ]
            lines.append(
                f"| {r['readout']} | {r['form']} | {t} | "
                + " | ".join(cells)
                + f" | {gap:+.3f} | {', '.join(worse) or 'none'} |"
            )
    groups = list(results[0]["per_group"]) if results else []
    lines += ["", "Held-out group figures per group (calibrated ECE / NLL, uniform NLL in brackets; n):", ""]
    lines += ["| readout | fit | type | " + " | ".join(groups) + " |", "|---|---|---|" + "---|" * len(groups)]
    for r in results:
        for t in TYPES:
            cells = []
            for g in groups:
                m = r["per_group"][g].get(t)
                cells.append(
                    "-" if m is None else f"{m['ece']:.3f} / {m['nll']:.3f} ({m['uniform_nll']:.3f}; {m['n']})"
                )
            lines.append(f"| {r['readout']} | {r['form']} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


FORMS = ("T", "T+prior", "T-worst", "T-excess", "T-worst+U", "T+U-lgo")
SERVED_FORMS = FORMS[:4]  # what a calibration file can hold (core.calibration: no uniform mix)
SERVED = {"letters R=1": ("letters", 1), "letters R=2": ("letters", 2), "letters R=4": ("letters", 4)}
SERVED |= {
    "canonical": ("canonical", 1),
    "mirror": ("mirror", 1),
    "pride": ("canonical", 1),
    "pride+scales": ("canonical", 1),
    "pride-mean": ("canonical", 1),
}


def write_fits(
    path: Path, names: Sequence[str], form: str, dev_qs, pool: Pool, *, cal_id: str, note: str, per_type: dict
) -> None:
    """Merge each served readout's fit on dev (`form`; `per_type`: another form for some
    types) into the calibration file at `path` (a fit for the same readout is replaced; the
    others are kept), under a new id."""
    doc = json.loads(path.read_text())
    for name in names:
        readout, rotations = SERVED[name]
        prior = PRIOR_ESTIMATE[name](pool, [((i.id, qid), q) for i, qid, q in dev_qs]) if name in PRIOR_ESTIMATE else {}
        dev = scored(name, dev_qs, pool, prior)
        assert dev is not None, f"{name}: not recorded"
        types = _fit(dev, name, form)
        for qtype, other in per_type.items():
            types[qtype] = _fit(dev, name, other)[qtype]
        entry = {"readout": readout, "rotations": rotations, "types": types}
        for qtype in PRIOR_TYPES.get(name, ()):  # what the server divides the letters by
            # two options or levels are always read both ways under canonical, where the
            # symmetrised prior is the same for both: a prior for n = 2 would change nothing
            kept = {str(n): p for n, p in sorted(prior.get(qtype, {}).items()) if n > 2}
            if qtype in entry["types"] and kept:
                entry["types"][qtype]["position_prior"] = kept
                entry["types"][qtype]["note"] = (
                    "position_prior: per option count from 3 (two are read in both orders, where a prior cancels)"
                )
        entry["source"] = note
        doc["fits"] = [f for f in doc["fits"] if (f["readout"], f.get("rotations", 1)) != (readout, rotations)]
        doc["fits"].append(entry)
    doc["id"] = cal_id
    calib.from_dict(doc)  # what we write must load
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readings", required=True, help="folder of recorded readings (quality_model_table.py record)")
    ap.add_argument("--dev", default="evals/data/dev.jsonl")
    ap.add_argument("--test", default="evals/data/test.jsonl")
    ap.add_argument("--only", help="comma-separated readouts of: " + ", ".join(CONFIGS))
    ap.add_argument("--out", help="write NAME.md and NAME.json (default: print)")
    ap.add_argument("--head", default="", help="a line naming the model, CPU and dtype of the recordings")
    ap.add_argument("--write-fits", help="comma-separated served readouts whose dev fit to merge into --into")
    ap.add_argument("--into", help="the calibration file to merge fits into")
    ap.add_argument("--form", default="T", choices=SERVED_FORMS, help="the fit form written (default T)")
    ap.add_argument("--type-form", action="append", default=[], metavar="TYPE=FORM", help="another form for a type")
    ap.add_argument("--forms", default=",".join(FORMS), help="fit forms compared (default: all)")
    ap.add_argument("--id", help="the calibration's new id (with --write-fits)")
    args = ap.parse_args()
    pool = pooled(Path(args.readings))
    recorded_items = {k[0] for k in pool}
    dev_qs = [x for x in questions_of(load_items(args.dev)) if x[0].id in recorded_items]
    test_qs = [x for x in questions_of(load_items(args.test)) if x[0].id in recorded_items]
    if args.write_fits:
        note = f"dev fit ({args.form}) from the recorded readings in {args.readings}: {args.head}"
        names = [n.strip() for n in args.write_fits.split(",")]
        per_type = dict(entry.split("=", 1) for entry in args.type_form)
        if not set(per_type.values()) <= set(SERVED_FORMS):
            ap.error(f"--type-form: a served form is one of {', '.join(SERVED_FORMS)}")
        note += "".join(f"; {t}: {f}" for t, f in per_type.items())
        write_fits(Path(args.into), names, args.form, dev_qs, pool, cal_id=args.id, note=note, per_type=per_type)
        return 0
    names = [n.strip() for n in args.only.split(",")] if args.only else list(CONFIGS)
    results, skipped = [], []
    for name in names:
        for form in args.forms.split(","):
            got = evaluate(name, form, dev_qs, test_qs, pool)
            if got is None:
                skipped.append(name)
                break
            results.append(got)
    head = args.head or f"recordings: {args.readings}"
    if skipped:
        head += f" (not recorded, left out: {', '.join(skipped)})"
    text = markdown(results, head + f"; {len(dev_qs)} dev and {len(test_qs)} test questions")
    if args.out:
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps({"head": head, "results": results}, indent=2) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
