#!/usr/bin/env python3
"""Validate the hand-written Jev eval set (dev.jsonl, test.jsonl) and print its statistics.

Stdlib only. Usage: python3 evals/data/check.py [DIR]   (DIR defaults to this file's folder)
Exit status 0 when every check passes, 1 otherwise (all problems are listed).
"""

import collections
import json
import pathlib
import re
import sys

# the domain rule lives with the evals package (openjev.evals.domains, stdlib only)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "src"))
from openjev.evals.domains import domain_of_id

SPLITS = ("dev", "test")
TYPES = ("noul", "choice", "score")
ID_RE = re.compile(r"^[a-z]+-(\d{3})$")
QID_RE = re.compile(r"^[a-z][a-z0-9_]*$")

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def is_nonempty_str(x):
    return isinstance(x, str) and x.strip() != ""


def check_state(where, state):
    """Return the state's form ('text', 'chat', 'json') or None when invalid."""
    if isinstance(state, str):
        if not state.strip():
            err(where, "empty string state")
        return "text"
    if isinstance(state, list):
        if not state:
            err(where, "empty chat state")
        for i, m in enumerate(state):
            if not isinstance(m, dict) or set(m) != {"role", "content"}:
                err(where, f"chat message {i} must have exactly 'role' and 'content'")
            elif m["role"] not in ("user", "assistant", "system") or not is_nonempty_str(m["content"]):
                err(where, f"chat message {i} has a bad role or empty content")
        return "chat"
    if isinstance(state, dict):
        if not state:
            err(where, "empty object state")
        return "json"
    err(where, f"state has unsupported type {type(state).__name__}")
    return None


def check_question(where, q, ans):  # noqa: C901 - evals/ is issue 19's this round; split it after that merge
    if not isinstance(q, dict):
        err(where, "question is not an object")
        return
    extra = set(q) - {"type", "instructions", "criteria"}
    if extra:
        err(where, f"unknown question keys {sorted(extra)}")
    if not is_nonempty_str(q.get("instructions")):
        err(where, "missing or empty instructions")
    t, crit = q.get("type"), q.get("criteria")
    if t == "noul":
        if crit is not None and (
            not isinstance(crit, dict)
            or set(crit) != {"true", "false"}
            or not all(is_nonempty_str(v) for v in crit.values())
        ):
            err(where, "noul criteria must be {'true': str, 'false': str}")
        if not isinstance(ans, bool):
            err(where, f"noul answer must be a boolean, got {ans!r}")
    elif t == "choice":
        if not isinstance(crit, dict) or not 2 <= len(crit) <= 8:
            err(where, "choice criteria must be an object with 2 to 8 options")
            return
        for name, desc in crit.items():
            if not is_nonempty_str(name) or not (desc is None or is_nonempty_str(desc)):
                err(where, f"bad choice option {name!r}: {desc!r}")
        if not isinstance(ans, str) or ans not in crit:
            err(where, f"choice answer {ans!r} is not one of the options")
    elif t == "score":
        if not isinstance(crit, list) or not 2 <= len(crit) <= 5 or not all(map(is_nonempty_str, crit)):
            err(where, "score criteria must be a list of 2 to 5 non-empty levels")
            return
        if len(set(crit)) != len(crit):
            err(where, "duplicate score levels")
        if isinstance(ans, bool) or not isinstance(ans, int) or not 0 <= ans < len(crit):
            err(where, f"score answer {ans!r} is not a level index 0..{len(crit) - 1}")
    else:
        err(where, f"unknown question type {t!r}")


def main(folder):  # noqa: C901 - evals/ is issue 19's this round; split it after that merge
    ids = set()
    n_items = collections.Counter()  # split -> items
    n_q = collections.Counter()  # (split, type) -> questions
    noul = collections.Counter()  # (split, bool)
    choice = collections.Counter()  # (split, n_options, position)
    score = collections.Counter()  # (split, n_levels, index)
    forms = collections.Counter()  # state form
    long_states = 0
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        if not path.exists():
            err(path.name, "file missing")
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.name}:{lineno}"
            if not line.strip():
                err(where, "blank line")
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                err(where, f"invalid JSON ({e})")
                continue
            if not isinstance(item, dict) or set(item) != {"id", "domain", "request", "expected"}:
                err(where, "item must have exactly 'id', 'domain', 'request', 'expected'")
                continue
            iid = item["id"]
            m = ID_RE.match(iid) if isinstance(iid, str) else None
            if not m:
                err(where, f"bad id {iid!r} (want word-NNN)")
                continue
            where = f"{path.name}:{lineno} ({iid})"
            if item["domain"] != domain_of_id(iid):  # the rule, so the tag never drifts from the id
                err(where, f"domain {item['domain']!r}, but its id says {domain_of_id(iid)!r}")
            if iid in ids:
                err(where, "duplicate id")
            ids.add(iid)
            want = "dev" if int(m.group(1)) % 2 == 1 else "test"
            if want != split:
                err(where, f"numeric suffix says {want}, but the item is in {split}")
            req, exp = item["request"], item["expected"]
            if not isinstance(req, dict) or set(req) != {"model", "state", "questions"}:
                err(where, "request must have exactly 'model', 'state', 'questions'")
                continue
            if req["model"] != "jev-latest":
                err(where, f"model is {req['model']!r}")
            form = check_state(where, req["state"])
            forms[form] += 1
            text = req["state"] if isinstance(req["state"], str) else json.dumps(req["state"])
            if form != "json" and len(text.split()) >= 150:
                long_states += 1
            qs = req["questions"]
            if not isinstance(qs, dict) or not 1 <= len(qs) <= 4:
                err(where, "questions must be an object with 1 to 4 entries")
                continue
            if not isinstance(exp, dict) or set(exp) != set(qs):
                err(where, "expected must have exactly the question ids as keys")
                continue
            n_items[split] += 1
            for qid, q in qs.items():
                qwhere = f"{where} [{qid}]"
                if not QID_RE.match(qid):
                    err(qwhere, "question id is not snake_case")
                check_question(qwhere, q, exp[qid])
                t, ans = q.get("type"), exp[qid]
                n_q[(split, t)] += 1
                if t == "noul" and isinstance(ans, bool):
                    noul[(split, ans)] += 1
                elif t == "choice" and isinstance(q.get("criteria"), dict) and ans in q["criteria"]:
                    choice[(split, len(q["criteria"]), list(q["criteria"]).index(ans))] += 1
                elif t == "score" and isinstance(q.get("criteria"), list) and isinstance(ans, int):
                    score[(split, len(q["criteria"]), ans)] += 1

    # ---- counts -------------------------------------------------------------------------------
    total_q = sum(n_q.values())
    print("Items and questions per split and type")
    print(f"  {'split':6} {'items':>5} " + " ".join(f"{t:>6}" for t in TYPES) + f" {'total':>6}")
    for s in (*SPLITS, "all"):
        ss = SPLITS if s == "all" else (s,)
        row = [sum(n_q[(x, t)] for x in ss) for t in TYPES]
        print(f"  {s:6} {sum(n_items[x] for x in ss):5} " + " ".join(f"{v:6}" for v in row) + f" {sum(row):6}")
    print(f"  state forms: {dict(forms)}; text/chat states of 150+ words: {long_states}")

    if total_q < 340:
        err("counts", f"only {total_q} questions (want >= 340)")
    if not 110 <= sum(n_items.values()) <= 130:
        err("counts", f"{sum(n_items.values())} items (want 110-130)")
    for t in TYPES:
        share = sum(n_q[(s, t)] for s in SPLITS) / max(total_q, 1)
        if not 0.25 <= share <= 0.42:
            err("counts", f"{t} is {share:.0%} of the questions (want roughly a third)")
    for s in SPLITS:
        sq = sum(n_q[(s, t)] for t in TYPES)
        if sq and abs(sq - total_q / 2) > 0.1 * total_q:
            err("counts", f"{s} has {sq} of {total_q} questions (want about half)")
    if forms["chat"] < 15:
        err("counts", f"only {forms['chat']} chat-array states (want >= 15)")
    if forms["json"] < 5:
        err("counts", f"only {forms['json']} JSON-object states (want >= 5)")

    # ---- position spread ----------------------------------------------------------------------
    print("\nnoul: expected answer true / false")
    for s in SPLITS:
        t, f = noul[(s, True)], noul[(s, False)]
        print(f"  {s:5} true {t:3}  false {f:3}  ({t / max(t + f, 1):.0%} true)")
        if t + f and not 0.4 <= t / (t + f) <= 0.6:
            err("spread", f"noul in {s} is {t / (t + f):.0%} true (want 40-60%)")

    def hist(title, counter, label):
        print(f"\n{title}")
        for n in sorted({k[1] for k in counter}):
            cells = []
            for s in (*SPLITS, "all"):
                ss = SPLITS if s == "all" else (s,)
                cnt = [sum(counter[(x, n, i)] for x in ss) for i in range(n)]
                cells.append(f"{s} {cnt}")
            print(f"  {n} {label}: " + "   ".join(cells))

    hist("choice: position of the correct option (index 0 = first listed), by number of options", choice, "options")
    for s in SPLITS:
        for n in sorted({k[1] for k in choice if k[0] == s}):
            cnt = [choice[(s, n, i)] for i in range(n)]
            if sum(cnt) >= n and max(cnt) - min(cnt) > 1:
                err("spread", f"choice with {n} options in {s}: positions {cnt} are not even")

    hist("score: level index of the correct answer (0 = lowest), by number of levels", score, "levels")
    for s in SPLITS:
        for n in sorted({k[1] for k in score if k[0] == s}):
            cnt = [score[(s, n, i)] for i in range(n)]
            if sum(cnt) >= 2 * n:
                expect = sum(cnt) / n
                if min(cnt) < 0.5 * expect or max(cnt) > 1.5 * expect + 1:
                    err("spread", f"score with {n} levels in {s}: indices {cnt} are not spread evenly")
        lows = sum(score[(s, n, 0)] for n in range(2, 6))
        highs = sum(score[(s, n, n - 1)] for n in range(2, 6))
        expect = sum(score[(s, n, i)] / n for n in range(2, 6) for i in range(n))
        print(
            f"  {s}: answers at the lowest level {lows}, at the highest level {highs} "
            f"(uniform would give {expect:.1f} each)"
        )
        if lows < 0.7 * expect or highs < 0.7 * expect:
            err("spread", f"score in {s}: too few answers at the extreme levels")

    if errors:
        print(f"\nFAILED: {len(errors)} problem(s)")
        for e in errors:
            print("  " + e)
        return 1
    print("\nOK: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent))
