"""Order debiasing, weighed on real readings: which cheap method keeps answers order-free?

Every choice question of the dev and test splits is read by the embedded model (in this
process, no server) in all 2n orders of its n options (the n cyclic rotations and the n
reflections), each a plain letters reading, and once with the parallel readout. From
those readings, each method's answer is assembled exactly as it would read it, for the
request's own order and for the request rotated by one position (what `openjev eval`'s
order-flip rate compares):

- `letters R=1`: the request's order;
- `letters R=2 (given+reversed)` and `letters R=4` (evenly spaced rotations, as served);
- `adaptive`: given and reversed; only where their top options differ, the R=4 rotations
  are added (mean of every reading made);
- `PriDe`: one reading divided by a position prior, estimated per option count on dev
  from all n rotations of each question (mean log-probability per position, normalised:
  the question's own content averages out over the rotations);
- `parallel`: the parallel readout (core/readouts.py);
- `parallel + label prior`: parallel divided by a prior over its canonical label
  positions, estimated on dev from the parallel readings alone (the canonical order is
  unrelated to the answer, so no permuted readings are needed).

Reported on test, per method: choice accuracy, ECE, Brier (raw, and with a temperature
fitted on dev), order flips, readings per question and the question-part tokens read per
question (the state is shared by every reading). Nothing is fitted on test.

    .venv/bin/python evals/debias_study.py [--out evals/results/debias_study.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from openjev.api.contract.jev.convert import request_of
from openjev.api.contract.jev.schemas import SystemOneRequest
from openjev.config import load_settings
from openjev.core import scoring
from openjev.core.prompts import PromptCompiler
from openjev.core.readouts import LettersReadout, ParallelReadout, canonical_order
from openjev.core.types import ChoiceQuestion, DecisionRequest
from openjev.engines.torch import engine as inprocess
from openjev.evals.dataset import load_items
from openjev.evals.fit import fit_type
from openjev.evals.metrics import Scored, summarize


@dataclass
class QuestionReadings:
    n: int
    correct: int
    rot: list[list[float]]  # rot[k][j]: P(position j) reading rotation k (position j shows (k + j) % n)
    ref: list[list[float]]  # ref[k][j]: reflection k (position j shows (k - j) % n)
    head_tokens: int  # the question's text before its options: read once, whatever the readings
    rot_tokens: list[int]
    ref_tokens: list[int]
    parallel: list[float]  # P(option i), request order
    parallel_shown: list[float]  # P(canonical label position j)
    parallel_order: tuple[int, ...]
    parallel_tokens: int


def rot_order(n: int, k: int) -> tuple[int, ...]:
    return tuple((k + j) % n for j in range(n))


def ref_order(n: int, k: int) -> tuple[int, ...]:
    return tuple((k - j) % n for j in range(n))


async def read_split(engine, compiler: PromptCompiler, path: str, limit: int | None) -> list[QuestionReadings]:
    labels = compiler.labels
    letters = LettersReadout(labels.texts, labels.ids)
    parallel = ParallelReadout(labels.texts, labels.ids)
    out = []
    for item in load_items(path)[:limit]:
        request = request_of(SystemOneRequest.model_validate(item.request))
        state_len = len(compiler_state_ids(compiler, request))
        for qid, q in request.questions:
            if not isinstance(q, ChoiceQuestion) or qid not in item.expected:
                continue
            n = len(q.options)
            orders = [rot_order(n, k) for k in range(n)] + [ref_order(n, k) for k in range(n)]
            questions = tuple(
                (f"o{i}", ChoiceQuestion(q.instructions, tuple(q.options[o] for o in order)))
                for i, order in enumerate(orders)
            )
            compiled = compiler.compile(DecisionRequest(request.state, questions), letters)
            result = await engine.run(compiled.plan)
            shared = compiled.plan.shared_prefix_len
            shown = [scoring.softmax(b.logprobs) for b in result.branches]
            # each reading's own tokens; the question's head (shared by its readings) goes to the first
            tokens = [len(b.input_ids) - shared for b in compiled.plan.branches]
            head = shared - state_len
            one = DecisionRequest(request.state, ((qid, q),))
            pc = compiler.compile(one, parallel)
            pr = await engine.run(pc.plan)
            names = [o.name for o in q.options]
            combined = parallel.combine(q, [pr.branches[0].logprobs])
            out.append(
                QuestionReadings(
                    n=n,
                    correct=names.index(item.expected[qid]),
                    rot=shown[:n],
                    ref=shown[n:],
                    rot_tokens=tokens[:n],
                    head_tokens=head,
                    ref_tokens=tokens[n:],
                    parallel=list(combined.probs),
                    parallel_shown=scoring.softmax(pr.branches[0].logprobs),
                    parallel_order=canonical_order(q),
                    parallel_tokens=len(pc.plan.branches[0].input_ids) - state_len,
                )
            )
        print(f"  {item.id}", file=sys.stderr)
    return out


def compiler_state_ids(compiler: PromptCompiler, request: DecisionRequest) -> list[int]:
    """The state's own tokens (what every reading shares), for the question-part counts."""
    from openjev.core.types import NoulQuestion

    probe = compiler.compile(DecisionRequest(request.state, (("a", NoulQuestion("x")), ("b", NoulQuestion("y")))))
    return list(probe.plan.branches[0].input_ids[: probe.plan.shared_prefix_len])


def to_options(shown: Sequence[float], order: Sequence[int]) -> list[float]:
    """Probabilities by position -> by option index."""
    probs = [0.0] * len(order)
    for j, o in enumerate(order):
        probs[o] = shown[j]
    return probs


def mean(rows: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(r[i] for r in rows) / len(rows) for i in range(len(rows[0]))]


def normalise(p: Sequence[float]) -> list[float]:
    t = math.fsum(p)
    return [x / t for x in p]


def position_prior(readings: Sequence[QuestionReadings], shown_of) -> dict[int, list[float]]:
    """Per option count: softmax of the mean log-probability at each position."""
    by_n: dict[int, list[list[float]]] = {}
    for q in readings:
        for shown in shown_of(q):
            by_n.setdefault(q.n, []).append([math.log(max(p, 1e-12)) for p in shown])
    return {n: scoring.softmax(mean(rows)) for n, rows in by_n.items()}


class Methods:
    """Each method: (probabilities by option index, readings, question tokens) for a
    question asked in the order rotated by `shift` (0: as given, 1: the flip request)."""

    def __init__(self, prior: dict[int, list[float]], label_prior: dict[int, list[float]]) -> None:
        self.prior = prior
        self.label_prior = label_prior

    def names(self) -> list[str]:
        return ["letters R=1", "letters R=2 (given+reversed)", "letters R=4", "adaptive", "PriDe", "parallel",
                "parallel + label prior"]  # fmt: skip

    def answer(self, name: str, q: QuestionReadings, shift: int) -> tuple[list[float], int, int]:
        n = q.n
        k0 = shift % n

        def rot(k: int) -> tuple[list[float], int]:  # the request's order rotated by k more
            kk = (k0 + k) % n
            return to_options(q.rot[kk], rot_order(n, kk)), q.rot_tokens[kk]

        def rev() -> tuple[list[float], int]:  # the request's order reversed: reflection k0 + n - 1
            kk = (k0 + n - 1) % n
            return to_options(q.ref[kk], ref_order(n, kk)), q.ref_tokens[kk]

        def rotations(r: int) -> list[tuple[list[float], int]]:
            r = min(r, n)
            return [rot((k * n) // r) for k in range(r)]

        h = q.head_tokens
        if name == "letters R=1":
            p, t = rot(0)
            return p, 1, h + t
        if name == "letters R=2 (given+reversed)":
            reads = [rot(0), rev()]
            return mean([r[0] for r in reads]), 2, h + sum(r[1] for r in reads)
        if name == "letters R=4":
            reads = rotations(4)
            return mean([r[0] for r in reads]), len(reads), h + sum(r[1] for r in reads)
        if name == "adaptive":
            reads = [rot(0), rev()]
            if scoring.argmax(reads[0][0]) != scoring.argmax(reads[1][0]):
                reads += rotations(4)[1:]
            return mean([r[0] for r in reads]), len(reads), h + sum(r[1] for r in reads)
        if name == "PriDe":
            kk = k0
            shown = normalise([p / w for p, w in zip(q.rot[kk], self.prior[n], strict=True)])
            return to_options(shown, rot_order(n, kk)), 1, h + q.rot_tokens[kk]
        if name == "parallel":
            return list(q.parallel), 1, q.parallel_tokens
        if name == "parallel + label prior":
            shown = normalise([p / w for p, w in zip(q.parallel_shown, self.label_prior[n], strict=True)])
            return to_options(shown, q.parallel_order), 1, q.parallel_tokens
        raise ValueError(name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", default="evals/data/dev.jsonl")
    ap.add_argument("--test", default="evals/data/test.jsonl")
    ap.add_argument("--out", default="evals/results/debias_study.json")
    ap.add_argument("--limit", type=int, help="only the first N items of each split (a bounded run)")
    args = ap.parse_args()
    settings = load_settings({"engine": "transformers", "model": "embedded", "prefix_cache_bytes": 0})
    loaded = inprocess.load(settings.served, settings.inprocess)
    compiler = PromptCompiler(loaded.tokenizer, max_labels=255)

    async def read_all():
        try:
            return (
                await read_split(loaded.engine, compiler, args.dev, args.limit),
                await read_split(loaded.engine, compiler, args.test, args.limit),
            )
        finally:
            await loaded.engine.close()

    dev, test = asyncio.run(read_all())
    methods = Methods(
        position_prior(dev, lambda q: q.rot),
        position_prior(dev, lambda q: [q.parallel_shown]),
    )
    rows = []
    for name in methods.names():

        def scored(split: Sequence[QuestionReadings], name: str = name) -> list[Scored]:
            out = []
            for q in split:
                p, _, _ = methods.answer(name, q, 0)
                flipped, _, _ = methods.answer(name, q, 1)
                out.append(Scored("choice", tuple(p), q.correct, scoring.argmax(flipped) != scoring.argmax(p)))
            return out

        fit = fit_type(scored(dev), prior=False)
        raw = scored(test)
        cal = [replace(s, probs=tuple(_temper(s.probs, fit["temperature"]))) for s in raw]
        reads = [methods.answer(name, q, 0) for q in test]
        m_raw, m_cal = summarize(raw), summarize(cal)
        rows.append(
            {
                "method": name,
                "readings_per_question": sum(r[1] for r in reads) / len(reads),
                "question_tokens_per_question": sum(r[2] for r in reads) / len(reads),
                "raw": m_raw,
                "calibrated": m_cal,
                "dev_temperature": fit["temperature"],
            }
        )
    doc = {
        "items_limit": args.limit,
        "questions": {"dev": len(dev), "test": len(test)},
        "position_prior": {str(n): p for n, p in methods.prior.items()},
        "label_prior": {str(n): p for n, p in methods.label_prior.items()},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(markdown(doc))
    return 0


def _temper(probs: Sequence[float], t: float) -> list[float]:
    return scoring.softmax([math.log(max(p, 1e-12)) for p in probs], t)


def markdown(doc: dict) -> str:
    lines = [
        f"Choice questions of test ({doc['questions']['test']}; priors and temperatures from dev, "
        f"{doc['questions']['dev']})"
        + (f", the first {doc['items_limit']} items of each split." if doc.get("items_limit") else "."),
        "",
        "| method | readings / question | question tokens / question | accuracy | ECE raw | ECE cal | Brier raw "
        "| Brier cal | order flips |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        raw, cal = r["raw"], r["calibrated"]
        lines.append(
            f"| {r['method']} | {r['readings_per_question']:.2f} | {r['question_tokens_per_question']:.0f} | "
            f"{raw['accuracy']:.3f} | {raw['ece']:.3f} | {cal['ece']:.3f} | {raw['brier']:.3f} | "
            f"{cal['brier']:.3f} | {raw['order_flip_rate']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
