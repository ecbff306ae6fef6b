"""`openjev task` against a real server on loopback (the FakeEngine at the engine seam, a
real SQLite file): create and wait, add, show, list, delete, and the exit statuses."""

import json

from openjev.cli import main
from tests.api.test_connections import serving

QUESTION = '{"type": "noul", "instructions": "Is it seven?"}'


def run(capsys, *argv):
    code = main(["task", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_the_task_commands_drive_a_server(tmp_path, capsys):
    examples = tmp_path / "examples.jsonl"
    examples.write_text("".join(json.dumps({"state": f"s {i}", "answer": i % 3 == 0}) + "\n" for i in range(12)))
    with serving(api_keys=("k1",), tasks_db=str(tmp_path / "t.sqlite3")) as (url, _):
        common = ("--url", url, "--key", "k1")
        code, task, _ = run(capsys, "create", "--question", QUESTION, "--examples", str(examples), "--wait", *common)
        assert code == 0 and task["status"] == "ready" and task["examples"] == 12
        code, more, _ = run(capsys, "add", task["id"], "--examples", str(examples), "--wait", *common)
        assert code == 0 and more["examples"] == 24 and more["fit"]["after"]["n"] == 24
        code, shown, _ = run(capsys, "show", task["id"], *common)
        assert code == 0 and shown["id"] == task["id"]
        code, listed, _ = run(capsys, "list", *common)
        assert [t["id"] for t in listed["tasks"]] == [task["id"]]
        assert run(capsys, "delete", task["id"], *common)[0] == 0
        code, _, err = run(capsys, "show", task["id"], *common)
        assert code == 1 and "404" in err
        code, _, err = run(capsys, "show", task["id"], "--url", url, "--key", "wrong")
        assert code == 1 and "401" in err
    code, _, err = run(capsys, "show")
    assert code == 2 and "TASK_ID" in err
