"""What order debiasing costs: readouts side by side on one in-process server (embedded model).

For each readout (per-request headers: letters R=1, letters R=4, parallel, canonical; `--only`
picks some), 1- and 8-question requests on a ~1,000-token state: cold (a state never sent)
and warm (the same state again, new questions), p50 over --repeats, the readouts taking
turns within each repeat (the order rotates), so machine load hits them alike. Also the
tokens the engine computed (usage.x_computed_tokens) per request. One JSON line per row,
then a Markdown table with the ratios to letters R=1.

    .venv/bin/python bench/bench_readouts.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx

from openjev.config import EMBEDDED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, p50, payload

from openjev.config import load_settings
from openjev.evals.local import local_server

READOUTS = {
    "letters R=1": {"x-openjev-readout": "letters", "x-openjev-rotations": "1"},
    "letters R=4": {"x-openjev-readout": "letters", "x-openjev-rotations": "4"},
    "parallel": {"x-openjev-readout": "parallel"},
    "canonical": {"x-openjev-readout": "canonical"},
    "mirror": {"x-openjev-readout": "mirror"},
}
SPECS = {"letters R=1": ("letters", 1), "letters R=4": ("letters", 4), "parallel": ("parallel", 1)}
SPECS |= {"canonical": ("canonical", 1), "mirror": ("mirror", 1), "letters R=2": ("letters", 2)}


async def ask(client: httpx.AsyncClient, url: str, wire: dict, headers: dict) -> tuple[float, int, str]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await client.post(url + "/v1/systemone", json=wire, headers={**headers, "x-openjev-calibration": "none"})
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code} {r.text[:300]}")
    return (loop.time() - t0) * 1000, r.json()["usage"]["x_computed_tokens"], r.headers["x-openjev-readout"]


async def measure(url: str, readouts: dict[str, dict], repeats: int, sizes: list[int]) -> list[dict]:
    names = list(readouts)
    rows = []
    async with httpx.AsyncClient(timeout=1800) as client:
        for i, name in enumerate(names):  # warm-up: kernels, allocator, the label check
            await ask(client, url, payload(1, tag=7000 + i, paragraphs=1), readouts[name])
        for n in sizes:
            got: dict[str, dict[str, list]] = {
                k: {"cold": [], "warm": [], "cold_tok": [], "warm_tok": []} for k in names
            }
            used: dict[str, str] = {}
            for rep in range(repeats):
                shift = rep % len(names)
                for name in names[shift:] + names[:shift]:
                    tag = 9000 + 1000 * n + 100 * names.index(name) + rep
                    ms, tok, used[name] = await ask(client, url, payload(n, tag=tag), readouts[name])
                    got[name]["cold"].append(ms)
                    got[name]["cold_tok"].append(tok)
                    ms, tok, _ = await ask(client, url, payload(n, tag=tag, qtag=tag + 50_000), readouts[name])
                    got[name]["warm"].append(ms)
                    got[name]["warm_tok"].append(tok)
                    print(
                        json.dumps(
                            {
                                "readout": name,
                                "questions": n,
                                "rep": rep,
                                "cold_ms": round(g_last(got[name]["cold"])),
                                "warm_ms": round(ms),
                                "warm_tokens": tok,
                            }
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
            for name in names:
                g = got[name]
                rows.append(
                    {
                        "readout": name,
                        "served_as": used[name],
                        "questions": n,
                        "cold_p50_ms": round(p50(g["cold"])),
                        "warm_p50_ms": round(p50(g["warm"])),
                        "cold_tokens": round(p50(g["cold_tok"])),
                        "warm_tokens": round(p50(g["warm_tok"])),
                        "cold_ms": [round(x) for x in g["cold"]],
                        "warm_ms": [round(x) for x in g["warm"]],
                    }
                )
    return rows


def g_last(xs: list) -> float:
    return xs[-1]


def markdown(rows: list[dict], head: dict) -> str:
    base = {(r["questions"]): r for r in rows if r["readout"] == "letters R=1"}
    lines = [
        f"{head['machine']['cpu']}, {head['machine']['cores']} cores, {head['dtype']}, p50 of {head['repeats']} "
        "(ratio to letters R=1 in the same run)",
        "",
        "| readout | questions | tokens cold / warm | cold p50 ms | warm p50 ms |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        b = base[r["questions"]]
        lines.append(
            f"| {r['readout']} | {r['questions']} | {r['cold_tokens']} / {r['warm_tokens']} | "
            f"{r['cold_p50_ms']} ({r['cold_p50_ms'] / b['cold_p50_ms']:.2f}x) | "
            f"{r['warm_p50_ms']} ({r['warm_p50_ms'] / b['warm_p50_ms']:.2f}x) |"
        )
    return "\n".join(lines)


def warm_tokens(service, readout, n: int, tag: int, qtype: str | None) -> int:
    """Tokens a warm request computes: its plan's distinct tokens past what it shares with
    the cold request before it (the same state, other questions), as the prefix cache keeps."""
    from common import core_request

    def plan(qtag: int):
        wire = payload(n if qtype is None else 3 * n, tag=tag, qtag=qtag)
        if qtype is not None:  # n questions of one type, from the same generator
            wire["questions"] = {k: q for k, q in wire["questions"].items() if q["type"] == qtype}
            wire["questions"] = dict(list(wire["questions"].items())[:n])
        return service.prepare_now(core_request(wire), readout).plan

    cold, warm = plan(tag), plan(tag + 50_000)
    a, b = cold.branches[0].input_ids, warm.branches[0].input_ids
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return warm.unique_tokens - shared


def token_table(n: int) -> str:
    """The warm question tokens per readout and question type, from the plans alone (the
    tokenizer, no forward pass): what each readout costs on top of the shared state."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evals"))
    from quality_model_table import _service_for_tables

    from openjev.core.readouts import ReadoutSpec

    service = _service_for_tables("embedded")
    lines = [
        f"warm tokens computed, {n} questions (state cached), from the plans; ratio to letters R=1",
        "",
        "| readout | all types | noul only | choice only | score only |",
        "|---|---|---|---|---|",
    ]
    base = {}
    for label, (name, rotations) in SPECS.items():
        readout = service.readout(ReadoutSpec(name, rotations))
        cells = []
        for qtype in (None, "noul", "choice", "score"):
            tok = warm_tokens(service, readout, n, 9100, qtype)
            base.setdefault(qtype, tok)
            cells.append(f"{tok} ({tok / base[qtype]:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="1,8", help="questions per request, comma-separated")
    ap.add_argument("--out", help="also write the rows and the table to this JSON file")
    ap.add_argument("--only", help=f"comma-separated readouts of: {', '.join(READOUTS)} (letters R=1 is always read)")
    ap.add_argument("--tokens", action="store_true", help="only the warm token table, from the plans (no model run)")
    args = ap.parse_args()
    if args.tokens:
        print(token_table(8))
        return
    chosen = {"letters R=1", *(n.strip() for n in (args.only or ",".join(READOUTS)).split(","))}
    unknown = chosen - set(READOUTS)
    if unknown:
        ap.error(f"--only: unknown readouts {sorted(unknown)}")
    readouts = {name: headers for name, headers in READOUTS.items() if name in chosen}
    settings = load_settings(
        {"engine": "transformers", "model": EMBEDDED_MODEL, "calibration": "none", "engine_timeout_s": 1800}
    )
    head = {"machine": machine(), "dtype": settings.served.dtype, "repeats": args.repeats}
    sizes = [int(s) for s in args.sizes.split(",")]
    with local_server(settings) as url:
        rows = asyncio.run(measure(url, readouts, args.repeats, sizes))
    for r in rows:
        print(json.dumps({**head, **r}), flush=True)
    table = markdown(rows, head)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({**head, "rows": rows, "table": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
