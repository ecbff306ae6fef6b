"""`openjev eval --report`'s pictures (openjev/evals/pictures.py): the abstain rule's curve
by hand, and the files written from a run's scored answers."""

import pytest

from openjev.evals import pictures, report
from openjev.evals.metrics import Scored


def test_the_coverage_curve_by_hand():
    scored = [
        Scored("noul", (0.9, 0.1), 0),
        Scored("noul", (0.8, 0.2), 1),
        Scored("noul", (0.8, 0.2), 0),
        Scored("noul", (0.6, 0.4), 0),
    ]
    assert pictures.coverage_curve(scored) == [
        (0.9, 0.25, 1.0),
        (0.8, 0.75, pytest.approx(2 / 3)),  # the two at 0.8 are kept or declined together
        (0.6, 1.0, 0.75),
    ]


def test_a_report_writes_every_picture_and_a_page_showing_them(tmp_path):
    scored = [Scored(t, (0.7, 0.2, 0.1), i % 3) for i, t in enumerate(["noul", "choice", "score"] * 10)]
    scored = [Scored("noul", (0.7, 0.3), i % 2) if s.qtype == "noul" else s for i, s in enumerate(scored)]
    report.reliability_png(scored, tmp_path / "reliability.png", "a run")
    page = pictures.write(tmp_path, scored, "a run", "| type | n |")
    for name in ("reliability.png", "confidence.png", "coverage.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
        assert f'src="{name}"' in page.read_text()
