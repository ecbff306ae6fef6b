"""Readout and calibration chosen per request through headers; what the server says it applied."""

import pytest

from tests.api.conftest import running_app
from tests.api.test_systemone import VALID
from tests.support.calibration_files import fake_model_calibration


async def test_default_readout_and_no_calibration_are_named_in_headers(api):
    client, engine = api
    r = await client.post("/v1/systemone", json=VALID)
    assert r.status_code == 200
    # The default (canonical): a noul read once, a scale both ways, a choice once in the
    # canonical order (this one has two options: both orders); the header says what was read.
    assert r.headers["x-openjev-readout"] == "canonical"
    assert r.headers["x-openjev-calibration"] == "none"  # the fake model has no shipped calibration
    answers = r.json()["answers"]
    agreement = {qid: "x_order_agreement" in answers[qid] for qid in ("refund", "team", "anger")}
    assert agreement == {"refund": False, "team": True, "anger": True}
    assert len(engine.plans[0].branches) == 1 + 2 + 2
    r = await client.post("/v1/systemone", json=VALID, headers={"x-openjev-rotations": "4"})
    # 2 options (or a scale) read in 2 orders each
    assert r.headers["x-openjev-readout"] == "letters;rotations=2"
    assert all("x_order_agreement" in a for a in r.json()["answers"].values())
    assert len(engine.plans[-1].branches) == 2 + 2 + 2


async def test_headers_override_the_readout_per_request(api):
    client, engine = api
    r = await client.post("/v1/systemone", json=VALID, headers={"x-openjev-readout": "yesno"})
    assert r.status_code == 200, r.text
    assert r.headers["x-openjev-readout"] == "yesno"
    assert len(engine.plans[-1].branches) == 1 + 2 + 3
    r = await client.post("/v1/systemone", json=VALID, headers={"x-openjev-rotations": "2"})
    assert r.headers["x-openjev-readout"] == "letters;rotations=2"
    answers = r.json()["answers"]
    assert all(0 <= a["x_order_agreement"] <= 1 for a in answers.values())
    assert set(answers["team"]["probabilities"]) == {"billing", "technical"}


@pytest.mark.parametrize(
    "headers",
    [
        {"x-openjev-readout": "words"},
        {"x-openjev-rotations": "0"},
        {"x-openjev-rotations": "9"},
        {"x-openjev-rotations": "two"},
        {"x-openjev-rotations": "0_0_4"},  # int() reads it as 4
        {"x-openjev-rotations": "+4"},
        {"x-openjev-rotations": "\u0664".encode()},  # ARABIC-INDIC DIGIT FOUR, UTF-8 on the wire
        {"x-openjev-calibration": "maybe"},
    ],
)
async def test_bad_override_headers_are_422_and_never_reach_the_engine(api, headers):
    client, engine = api
    r = await client.post("/v1/systemone", json=VALID, headers=headers)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail[0]["loc"][0] == "header" and detail[0]["loc"][1] == next(iter(headers))
    assert "rotations" in detail[0]["msg"] or "readout" in detail[0]["msg"] or "expected" in detail[0]["msg"]
    assert engine.plans == []
    assert (await client.post("/v1/systemone", json=VALID)).status_code == 200  # the next one is answered


def _choice(n: int) -> dict:
    return {
        "type": "choice",
        "instructions": "Which one?",
        "criteria": {f"option{i}": f"the option number {i}" for i in range(n)},
    }


@pytest.mark.parametrize(
    ("questions", "asked", "read", "branches"),
    [
        ({"four": _choice(4)}, "4", "letters;rotations=4", 4),
        ({"three": _choice(3)}, "4", "letters;rotations=3", 3),  # 3 options: 3 distinct orders
        ({"two": _choice(2), "five": _choice(5)}, "4", "letters;rotations=4", 2 + 4),  # the most any got
        ({"many": _choice(30)}, "4", "letters", 1),  # past --rotation-max-options: one order
        ({"four": _choice(4)}, "1", "letters", 1),
    ],
)
async def test_the_readout_header_names_the_rotations_really_read(api, questions, asked, read, branches):
    client, engine = api
    body = {"model": "jev-latest", "state": "A ticket.", "questions": questions}
    r = await client.post("/v1/systemone", json=body, headers={"x-openjev-rotations": asked})
    assert r.status_code == 200, r.text
    assert r.headers["x-openjev-readout"] == read
    assert len(engine.plans[-1].branches) == branches  # what the header says is what was read


async def test_server_flags_set_the_default_and_models_describe_it():
    async with running_app(readout="letters", rotations=4) as (client, _engine):
        r = await client.post("/v1/systemone", json={**VALID, "questions": {"q": _choice(5)}})
        assert r.headers["x-openjev-readout"] == "letters;rotations=4"
        model = (await client.get("/v1/models")).json()["models"][0]
        assert model["x_readout"] == "letters;rotations=4"
        assert model["x_calibration"] is None
        assert model["x_prompt_version"] and "x_fingerprint" in model and model["x_temperature"] == 1.0
        limits = (await client.get("/v1/limits")).json()
        assert limits["max_rotations"] == 8


async def test_parallel_falls_back_on_an_engine_without_layouts_and_models_say_so():
    # the fake engine, like every remote engine, cannot run parallel layouts
    async with running_app(readout="parallel", rotations=4) as (client, engine):
        model = (await client.get("/v1/models")).json()["models"][0]
        assert model["x_readout"] == "canonical"
        assert model["x_readouts"]["parallel"] == "canonical"
        assert model["x_readouts"]["letters"] == "letters;rotations=4"
        r = await client.post("/v1/systemone", json=VALID, headers={"x-openjev-readout": "parallel"})
        # parallel's sequential twin: one reading of the options in the canonical order
        assert r.status_code == 200 and r.headers["x-openjev-readout"] == "canonical"
        assert not any(b.parallel for plan in engine.plans for b in plan.branches)
        assert len(engine.plans[-1].branches) == 1 + 2 + 2  # noul once; two options and the scale both ways
        # rotations asked for alone ask for letters
        r = await client.post("/v1/systemone", json=VALID, headers={"x-openjev-rotations": "2"})
        assert r.status_code == 200 and r.headers["x-openjev-readout"] == "letters;rotations=2"


async def test_the_canonical_readout_answers_the_same_for_any_option_order():
    async with running_app(readout="canonical") as (client, engine):
        options = {"billing": "Payments", "shipping": "Delivery", "returns": None}
        asked = {"type": "choice", "instructions": "Which team?", "criteria": options}
        flipped = {**asked, "criteria": dict(reversed(list(options.items())))}
        a = await client.post("/v1/systemone", json={**VALID, "questions": {"q": asked}})
        b = await client.post("/v1/systemone", json={**VALID, "questions": {"q": flipped}})
        assert a.status_code == b.status_code == 200 and a.headers["x-openjev-readout"] == "canonical"
        first, second = engine.plans[-2:]
        assert [x.input_ids for x in first.branches] == [x.input_ids for x in second.branches]  # the same plan
        assert a.json()["answers"]["q"] == b.json()["answers"]["q"]


def _model_calibration(tmp_path, **defaults) -> str:
    """A calibration bound to the fake model (empty fingerprint) that names its defaults."""
    fit = {"types": {"noul": {"temperature": 1.0}}}
    fits = [
        {"readout": "letters", "rotations": 1, **fit},
        {"readout": "letters", "rotations": 4, **fit},
        {"readout": "yesno", "types": {"choice": {"temperature": 4.0}}},
    ]
    return fake_model_calibration(tmp_path, "fake-model-measured", fits, defaults)


async def test_the_models_calibration_sets_its_default_readout_a_header_still_wins(tmp_path):
    path = _model_calibration(tmp_path, readout="letters", rotations=1, abstain={"min_label_mass": 1.0})
    async with running_app(calibration=path) as (client, engine):
        models = (await client.get("/v1/models")).json()["models"][0]
        assert models["x_readout"] == "letters" and models["x_calibration"]["applies_to_default"]
        r = await client.post("/v1/systemone", json=VALID)
        assert r.headers["x-openjev-readout"] == "letters" and len(engine.plans[-1].branches) == 3
        assert r.headers["x-openjev-calibration"] == "fake-model-measured"
        # the file's abstain floor (all of the label mass) declines every fake reading
        assert all(a["x_abstain"] for a in r.json()["answers"].values())
        r = await client.post("/v1/systemone", json=VALID, headers={"x-openjev-rotations": "4"})
        assert r.headers["x-openjev-readout"] == "letters;rotations=2"  # 2 options: 2 orders read
        assert len(engine.plans[-1].branches) == 6
        r = await client.post("/v1/systemone/batch", json={"requests": [VALID]}, headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        assert len(engine.plans[-1].branches) == 3  # a batch without headers: the model's default too


async def test_an_operators_readout_flag_wins_over_the_models_default(tmp_path):
    path = _model_calibration(tmp_path, readout="letters", rotations=1)
    async with running_app(calibration=path, rotations=2, abstain_min_label_mass=0.01) as (client, _engine):
        assert (await client.get("/v1/models")).json()["models"][0]["x_readout"] == "letters;rotations=2"
        r = await client.post("/v1/systemone", json=VALID)
        assert r.headers["x-openjev-readout"] == "letters;rotations=2"
        assert not any(a.get("x_abstain") for a in r.json()["answers"].values())


async def test_the_models_calibration_may_name_a_readout_per_question_type(tmp_path):
    """choice read as yesno (one reading per option, calibrated by the yesno fit), noul and
    score as letters R=1; responses and /v1/models say so; a header still reads all one way."""
    path = _model_calibration(tmp_path, readout="letters", rotations=1, per_type={"choice": {"readout": "yesno"}})
    async with running_app(calibration=path) as (client, engine):
        model = (await client.get("/v1/models")).json()["models"][0]
        assert model["x_readout"] == "letters;choice=yesno" and model["x_calibration"]["applies_to_default"]
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 200, r.text
        assert r.headers["x-openjev-readout"] == "letters;choice=yesno"
        assert len(engine.plans[-1].branches) == 1 + 2 + 1  # noul once, each of 2 options, the scale once
        calibrated = r.json()["answers"]["team"]["probabilities"]
        raw = (await client.post("/v1/systemone", json=VALID, headers={"x-openjev-calibration": "none"})).json()
        flat = [abs(p - 0.5) for p in calibrated.values()]
        assert all(
            f < abs(p - 0.5) or p == 0.5
            for f, p in zip(flat, raw["answers"]["team"]["probabilities"].values(), strict=True)
        )
        r = await client.post(
            "/v1/systemone", json=VALID, headers={"x-openjev-readout": "letters", "x-openjev-rotations": "1"}
        )
        assert r.headers["x-openjev-readout"] == "letters" and len(engine.plans[-1].branches) == 3


async def test_a_per_type_default_without_a_fit_for_each_part_is_refused(tmp_path):
    from openjev.core import calibration as calib
    from openjev.errors import ConfigError

    path = _model_calibration(tmp_path, readout="letters", rotations=1, per_type={"choice": {"readout": "parallel"}})
    with pytest.raises(ConfigError, match=r"parallel.*has no fit"):
        calib.load(path)


async def test_an_operator_can_drop_the_models_abstain_rule_and_keep_its_readout_and_calibration(tmp_path):
    path = _model_calibration(tmp_path, readout="letters", rotations=1, abstain={"min_confidence": 1.0})
    async with running_app(calibration=path) as (client, _engine):
        r = await client.post("/v1/systemone", json=VALID)
        assert all(a["x_abstain"] for a in r.json()["answers"].values())  # the file's floor: nothing reaches 1
    async with running_app(calibration=path, ignore_model_abstain=True) as (client, _engine):
        model = (await client.get("/v1/models")).json()["models"][0]
        assert model["x_readout"] == "letters" and model["x_abstain"]["min_confidence"] == 0.0
        r = await client.post("/v1/systemone", json=VALID)
        assert r.headers["x-openjev-calibration"] == "fake-model-measured"  # the calibration still applies
        assert not any(a.get("x_abstain") for a in r.json()["answers"].values())
