"""What the abstain rule (core/abstain.py) buys: accuracy on the answered questions against
coverage (the share answered), for a grid of floors, on the labelled splits.

The runs are plain `openjev eval` runs with the server's defaults (every answer carries its
`x_label_mass` and `x_order_agreement`); the rule is applied here, offline, with the core's
own `AbstainRule.refuses`, so one run per split serves every threshold:

    .venv/bin/openjev eval evals/data/dev.jsonl --no-flips --out evals/runs/abstain-dev
    .venv/bin/openjev eval evals/data/test.jsonl --no-flips --out evals/runs/abstain-test
    .venv/bin/python evals/abstain_table.py

The default is chosen on dev (`choose`), then reported on test. Correct: noul when
P(true) >= 0.5 matches, choice and score when the most probable option is the expected one.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from openjev.core.abstain import AbstainRule
from openjev.evals.dataset import load_items

MASS_FLOORS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9)
AGREEMENT_FLOORS = (0.0, 0.3, 0.5, 0.6, 0.75, 1.0)
CONFIDENCE_FLOORS = (0.5, 0.6, 0.7, 0.8, 0.9)  # on the calibrated top probability, alone
MIN_COVERAGE = 0.5  # a rule that declines more than half the questions is not a default
MIN_GAIN = 0.02  # nor one that buys less than 2 points of accuracy on what it answers


@dataclass(frozen=True)
class Read:
    qtype: str
    correct: bool
    label_mass: float
    order_agreement: float | None
    top_probability: float = 1.0  # the answer's own (calibrated) top probability: the confidence floor's signal


def reads(data: str, run: str) -> list[Read]:
    items = load_items(data)
    records: dict[tuple[str, str], dict] = {}  # read directly: a ResultStore would rewrite run.json
    for line in (Path(run) / "results.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interruption
        records[(rec["id"], rec["kind"])] = rec
    out = []
    for item in items:
        main = records.get((item.id, "main"))
        if main is None or main["status"] != 200:
            continue
        for qid, expected in item.expected.items():
            q, a = item.request["questions"][qid], main["answers"][qid]
            if q["type"] == "noul":
                correct = (a["noul"] >= 0.5) == bool(expected)
                top = max(a["noul"], 1.0 - a["noul"])
            elif q["type"] == "choice":
                correct = a["choice"] == expected
                top = max(a["probabilities"].values())
            else:
                probs = [a["probabilities"][str(i)] for i in range(len(q["criteria"]))]
                correct = max(range(len(probs)), key=probs.__getitem__) == int(expected)
                top = max(probs)
            out.append(Read(q["type"], correct, a["x_label_mass"], a.get("x_order_agreement"), top))
    return out


def measure(rows: list[Read], rule: AbstainRule) -> dict[str, float]:
    answered = [r for r in rows if not rule.refuses(r.label_mass, r.order_agreement, r.top_probability)]
    return {
        "questions": len(rows),
        "coverage": len(answered) / len(rows) if rows else 0.0,
        "accuracy_answered": sum(r.correct for r in answered) / len(answered) if answered else float("nan"),
        "accuracy_all": sum(r.correct for r in rows) / len(rows) if rows else float("nan"),
    }


def grid() -> list[AbstainRule]:
    """Every pair of mass and agreement floors, then each confidence floor alone."""
    pairs = [AbstainRule(m, a) for m in MASS_FLOORS for a in AGREEMENT_FLOORS]
    return pairs + [AbstainRule(min_confidence=c) for c in CONFIDENCE_FLOORS]


def rule_text(rule: AbstainRule) -> str:
    floors = [
        f"{name} >= {value}"
        for name, value in (
            ("mass", rule.min_label_mass),
            ("agreement", rule.min_order_agreement),
            ("calibrated top probability", rule.min_confidence),
        )
        if value
    ]
    return ", ".join(floors) or "none (answer everything)"


def choose(rows: list[Read]) -> AbstainRule:
    """The rule with the best accuracy on answered questions that keeps coverage >= MIN_COVERAGE
    and gains at least MIN_GAIN over answering everything; else no rule (ties: more coverage)."""
    base = measure(rows, AbstainRule())["accuracy_answered"]
    best, best_key = AbstainRule(), (base + MIN_GAIN, 1.0)
    for rule in grid():
        m = measure(rows, rule)
        if m["coverage"] < MIN_COVERAGE:
            continue
        key = (m["accuracy_answered"], m["coverage"])
        if key[0] >= best_key[0] and key > best_key:
            best, best_key = rule, key
    return best


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", default="evals/runs/abstain-dev", help="run folder of the dev split")
    ap.add_argument("--test", default="evals/runs/abstain-test", help="run folder of the test split")
    ap.add_argument("--out", default="evals/results/abstain.md")
    args = ap.parse_args()
    dev = reads("evals/data/dev.jsonl", args.dev)
    test = reads("evals/data/test.jsonl", args.test) if (Path(args.test) / "results.jsonl").exists() else []
    chosen = choose(dev)
    lines = [
        "# The abstain rule on evals/ (embedded model, server defaults)",
        "",
        f"Made by `evals/abstain_table.py` from `{args.dev}` and `{args.test}`; CPU: {cpu_name()}.",
        f"Chosen on dev: {rule_text(chosen)} "
        f"(best accuracy on answered questions with coverage >= {MIN_COVERAGE:.0%} and a gain >= {MIN_GAIN:.0%}; "
        "else no rule).",
        "",
        "| floors | dev coverage | dev acc. answered | test coverage | test acc. answered |",
        "|---|---|---|---|---|",
    ]
    for rule in grid():
        d = measure(dev, rule)
        t = measure(test, rule) if test else None
        mark = " **(chosen)**" if rule == chosen else ""
        lines.append(
            f"| {rule_text(rule)}{mark} | {d['coverage']:.2f} | "
            f"{d['accuracy_answered']:.3f} | {t['coverage'] if t else float('nan'):.2f} | "
            f"{t['accuracy_answered'] if t else float('nan'):.3f} |"
        )
    lines += [
        "",
        "Per question type, no rule -> the chosen rule (a rule that only declined the hardest type would",
        "raise the average without reading any question better; this shows whether it does more):",
        "",
        "| split | type | questions | acc. (no rule) | coverage | acc. answered |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows in (("dev", dev), ("test", test)):
        for qtype in ("noul", "choice", "score"):
            sub = [r for r in rows if r.qtype == qtype]
            if not sub:
                continue
            base, ruled = measure(sub, AbstainRule()), measure(sub, chosen)
            lines.append(
                f"| {name} | {qtype} | {len(sub)} | {base['accuracy_all']:.3f} | {ruled['coverage']:.2f} | "
                f"{ruled['accuracy_answered']:.3f} |"
            )
    lines += ["", f"dev: {len(dev)} questions; test: {len(test)} questions."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
