"""`openjev ask`: argument parsing into a request, bars and the table (no server)."""

import pytest

from openjev import ask
from openjev.cli import build_parser


def _args(*argv):
    return build_parser().parse_args(["ask", *argv])


def test_questions_keep_flag_order_and_become_a_request():
    args = _args(
        "--state",
        "hello",
        "--score",
        "How angry?",
        "calm",
        "furious",
        "--noul",
        "urgent=Is it urgent?",
        "--choice",
        "Team?",
        "billing=Payments",
        "technical",
    )
    body = ask.build_request(args)
    assert body == {
        "model": "jev-latest",
        "state": "hello",
        "questions": {
            "q1": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "furious"]},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "q3": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "Payments", "technical": None}},
        },
    }


def test_state_from_a_file(tmp_path):
    f = tmp_path / "ticket.txt"
    f.write_text("from a file")
    assert ask.build_request(_args("--state", f"@{f}", "--noul", "Is it?"))["state"] == "from a file"


def test_a_choice_needs_two_options(capsys):
    with pytest.raises(SystemExit) as e:
        _args("--state", "x", "--choice", "Team?", "billing")
    assert e.value.code == 2 and "at least two options" in capsys.readouterr().err


def test_duplicate_ids_are_refused():
    with pytest.raises(ValueError, match="used twice"):
        ask.build_request(_args("--state", "x", "--noul", "a=One?", "--noul", "a=Two?"))


@pytest.mark.parametrize(("p", "filled"), [(0.0, 0), (1.0, 24), (0.5, 12)])
def test_bars_are_proportional(p, filled):
    b = ask.bar(p)
    assert len(b) == ask.BAR_WIDTH and b.count("█") == filled


def test_table_marks_the_chosen_option():
    request = {"questions": {"t": {"instructions": "Team?"}}}
    response = {
        "model": "m",
        "usage": {"input_tokens": 3},
        "answers": {
            "t": {
                "type": "choice",
                "choice": "b",
                "probabilities": {"a": 0.25, "b": 0.75},
                "confidence": 0.5,
                "x_label_mass": 0.9,
            }
        },
    }
    text = ask.render(request, response, "engine;dur=1.0")
    assert "t: Team?  ->  b  (confidence 0.50, label mass 0.90)" in text
    assert "  > b  " in text and "    a  " in text and "75.0%" in text and "engine;dur=1.0" in text
