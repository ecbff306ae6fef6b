"""`openjev outcome post` against a real server on loopback (the FakeEngine at the engine
seam, a real SQLite file): one outcome by flags, many from a file, and the exit statuses."""

import json

import httpx

from openjev.cli import main
from tests.api.test_connections import serving

QUESTION = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}}


def run(capsys, *argv):
    code = main(["outcome", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_outcome_post_drives_a_server(tmp_path, capsys):
    with serving(api_keys=("k1",), tasks_db=str(tmp_path / "t.sqlite3")) as (url, _):
        ids = []
        for i in range(3):
            r = httpx.post(
                url + "/v1/systemone",
                json={"state": f"ticket {i}", "questions": {"team": QUESTION}},
                headers={"Authorization": "Bearer k1"},
            )
            ids.append(r.headers["x-typesafe-request-id"])
        common = ("--url", url, "--key", "k1")
        code, out, _ = run(capsys, "post", "--decision", ids[0], "--question", "team", "--answer", "billing", *common)
        assert code == 0 and out["accepted"] == 1 and out["outcomes"][0]["status"] == "new"
        lines = tmp_path / "outcomes.jsonl"
        lines.write_text("".join(json.dumps({"decision_id": d, "question": 0, "answer": "tech"}) + "\n" for d in ids))
        code, out, _ = run(capsys, "post", "--file", str(lines), *common)
        assert code == 0 and [o["status"] for o in out["outcomes"]] == ["changed", "new", "new"]
        code, _, err = run(capsys, "post", "--decision", ids[0], "--question", "team", "--answer", "sales", *common)
        assert code == 1 and "422" in err
        code, _, err = run(capsys, "post", "--decision", ids[0], "--question", "team", "--answer", "tech", "--url", url)
        assert code == 1 and "401" in err
    code, _, err = run(capsys, "post", "--decision", "x")
    assert code == 2 and "--answer" in err
