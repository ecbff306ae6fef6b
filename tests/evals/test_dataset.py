import json
from pathlib import Path

import pytest

from openjev.evals.dataset import DataError, load_items, rotated_choices

DATA = Path(__file__).resolve().parents[2] / "evals" / "data"


def test_the_repos_labelled_set_loads_with_a_fixed_split():
    dev, test = load_items(DATA / "dev.jsonl"), load_items(DATA / "test.jsonl")
    questions = [(i, qid) for part in (dev, test) for i in part for qid in i.expected]
    assert len(questions) >= 300
    types = {
        t: sum(1 for i, q in questions if i.request["questions"][q]["type"] == t) for t in ("noul", "choice", "score")
    }
    assert min(types.values()) >= 100
    # the split rule: odd id numbers in dev, even in test
    assert all(int(i.id.rsplit("-", 1)[1]) % 2 == 1 for i in dev)
    assert all(int(i.id.rsplit("-", 1)[1]) % 2 == 0 for i in test)
    assert not {i.id for i in dev} & {i.id for i in test}


def test_rotated_choices_keeps_only_choices_rotated_by_one():
    (item,) = load_items(DATA / "dev.jsonl")[:1]
    rotated = rotated_choices(item)
    for qid, q in rotated["questions"].items():
        names = list(item.request["questions"][qid]["criteria"])
        assert q["type"] == "choice" and list(q["criteria"]) == names[1:] + names[:1]
        assert q["criteria"] == item.request["questions"][qid]["criteria"]  # same descriptions


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{", "not JSON"),
        ('{"id": "a", "request": {}}', "needs id, request and expected"),
        ('{"id": "a", "request": {"questions": {}}, "expected": {}}', "non-empty"),
        ('{"id": "a", "request": {"questions": {"q": {"type": "noul"}}}, "expected": {"q": "yes"}}', "does not fit"),
        (
            '{"id": "a", "request": {"questions": {"q": {"type": "choice", "criteria": {"x": null}}}}, "expected": {"q": "y"}}',
            "does not fit",
        ),
        (
            '{"id": "a", "request": {"questions": {"q": {"type": "score", "criteria": ["lo", "hi"]}}}, "expected": {"q": 2}}',
            "does not fit",
        ),
        ('{"id": "a", "request": {"questions": {"q": {"type": "noul"}}}, "expected": {"z": true}}', "unknown question"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "d.jsonl"
    path.write_text("\n" + line + "\n")
    with pytest.raises(DataError, match=match) as e:
        load_items(path)
    assert f"{path}:2" in str(e.value)


def test_duplicate_ids_are_refused(tmp_path):
    line = json.dumps({"id": "a", "request": {"questions": {"q": {"type": "noul"}}}, "expected": {"q": True}})
    (tmp_path / "d.jsonl").write_text(line + "\n" + line + "\n")
    with pytest.raises(DataError, match="duplicate"):
        load_items(tmp_path / "d.jsonl")
