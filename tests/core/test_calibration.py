import json
import math

import pytest

from openjev.core import calibration as calib
from openjev.core.abstain import AbstainRule
from openjev.core.readouts import ReadoutSpec
from openjev.errors import ConfigError

DOC = {
    "format": calib.FORMAT,
    "id": "cal-1",
    "model": {"name": "m", "fingerprint": "sha256:abc"},
    "prompt_version": "2",
    "base_temperature": 1.0,
    "fits": [
        {
            "readout": "letters",
            "rotations": 4,
            "types": {"choice": {"temperature": 2.0, "bias": [0.0, 0.5]}, "noul": {"temperature": 0.5}},
        }
    ],
}


def test_apply_identity_softening_and_prior():
    p = (0.7, 0.2, 0.1)
    assert calib.apply(calib.TypeFit(1.0), p) == pytest.approx(p)
    soft = calib.apply(calib.TypeFit(2.0), p)
    assert soft[0] < 0.7 and soft[2] > 0.1 and math.fsum(soft) == pytest.approx(1.0)
    assert soft == pytest.approx([math.sqrt(x) / sum(math.sqrt(y) for y in p) for x in p])
    shifted = calib.apply(calib.TypeFit(1.0, (0.0, math.log(2.0))), (0.5, 0.25, 0.25))
    assert shifted == pytest.approx((0.4, 0.4, 0.2))  # position 1 doubled, position 2 untouched
    assert calib.apply(calib.TypeFit(1.0), (1.0, 0.0)) == pytest.approx((1.0, 0.0))


def test_a_document_loads_and_finds_its_fits(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(DOC))
    cal = calib.load(path)
    spec = ReadoutSpec("letters", 4)
    assert cal.covers(spec) and not cal.covers(ReadoutSpec("letters", 1))
    assert cal.fit_for(spec, "choice") == calib.TypeFit(2.0, (0.0, 0.5))
    assert cal.fit_for(spec, "score") is None and cal.fit_for(ReadoutSpec("yesno"), "choice") is None


@pytest.mark.parametrize(
    ("broken", "match"),
    [
        ({"format": "other"}, "format"),
        ({"fits": [{"readout": "words", "types": {}}]}, "unknown readout"),
        ({"fits": [{"readout": "yesno", "types": {"choice": {"temperature": -1}}}]}, "temperature"),
        ({"fits": [{"readout": "yesno", "types": {"essay": {"temperature": 1}}}]}, "question type"),
        ({"model": {}}, "name"),
        ({"fits": [{"readout": "letters", "types": ["choice"]}]}, "not a valid calibration"),
        ({"fits": "letters"}, "not a valid calibration"),
        (
            {"fits": [{"readout": "canonical", "types": {"choice": {"temperature": 1, "position_prior": {"3": [1]}}}}]},
            "position prior",
        ),
    ],
)
def test_malformed_documents_are_refused_clearly(broken, match):
    with pytest.raises(ConfigError, match=match):
        calib.from_dict({**DOC, **broken}, "x.json")


def test_unreadable_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        calib.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        calib.load(tmp_path / "bad.json")


def test_binding_names_what_differs():
    cal = calib.from_dict(DOC, "cal.json")
    calib.check_binding(cal, fingerprint="sha256:abc", prompt_version="2", base_temperature=1.0)
    with pytest.raises(ConfigError, match=r"weights fingerprint sha256:abc.*sha256:zzz"):
        calib.check_binding(cal, fingerprint="sha256:zzz", prompt_version="2", base_temperature=1.0)
    with pytest.raises(ConfigError, match=r"prompt version '2'.*'3'"):
        calib.check_binding(cal, fingerprint="sha256:abc", prompt_version="3", base_temperature=1.0)
    with pytest.raises(ConfigError, match="--temperature"):
        calib.check_binding(cal, fingerprint="sha256:abc", prompt_version="2", base_temperature=0.5)


def test_a_document_may_name_the_models_measured_defaults():
    doc = {**DOC, "defaults": {"readout": "letters", "rotations": 4, "abstain": {"min_label_mass": 0.6}}}
    cal = calib.from_dict(doc)
    assert cal.default_readout == ReadoutSpec("letters", 4)
    assert cal.default_abstain is not None and cal.default_abstain.describe() == {
        "min_label_mass": 0.6,
        "min_order_agreement": 0.0,
        "min_confidence": 0.0,
    }
    confident = calib.from_dict({**DOC, "defaults": {"abstain": {"min_confidence": 0.7}}})
    assert confident.default_abstain == AbstainRule(min_confidence=0.7)
    plain = calib.from_dict(DOC)
    assert plain.default_readout is None and plain.default_abstain is None


@pytest.mark.parametrize(
    ("defaults", "match"),
    [
        ({"readout": "letters", "rotations": 1}, "has no fit"),  # only letters R=4 is fitted
        ({"readout": "words"}, "unknown readout"),
        ({"abstain": {"min_label_mass": 2}}, "between 0 and 1"),
    ],
)
def test_defaults_without_a_fit_or_out_of_range_are_refused(defaults, match):
    with pytest.raises(ConfigError, match=match):
        calib.from_dict({**DOC, "defaults": defaults})


def test_a_position_prior_applies_symmetrised_to_a_scale_read_both_ways():
    """A scale read both ways (Combined.mirrored): position j showed level j in one reading
    and level n-1-j in the other, so what the position preference left on each level is the
    geometric mean of the prior at j and n-1-j. A model that only prefers middle letters is
    flattened, and the reversed scale (levels listed the other way) gets the mirrored answer,
    which an unsymmetrised prior would break."""
    prior = (0.1, 0.4, 0.3, 0.2)  # middle letters preferred, B over C: not symmetric
    fit = calib.TypeFit(1.0, position_prior={4: prior})
    sym = [math.sqrt(prior[j] * prior[3 - j]) for j in range(4)]
    probs = tuple(v / sum(sym) for v in sym)  # the averaged readings of a model with no view
    assert calib.apply(fit, probs, (0, 1, 2, 3), mirrored=True) == pytest.approx((0.25,) * 4)
    answer = (0.1, 0.2, 0.3, 0.4)
    forward = calib.apply(fit, answer, (0, 1, 2, 3), mirrored=True)
    reverse = calib.apply(fit, answer[::-1], (0, 1, 2, 3), mirrored=True)  # the scale listed reversed
    assert reverse == pytest.approx(forward[::-1])
    one_way = calib.apply(fit, answer[::-1], (0, 1, 2, 3))
    assert one_way != pytest.approx(calib.apply(fit, answer, (0, 1, 2, 3))[::-1])
    # two options both ways: the symmetrised prior is the same for both, so it changes nothing
    two = calib.TypeFit(1.0, position_prior={2: (0.7, 0.3)})
    assert calib.apply(two, (0.6, 0.4), (1, 0), mirrored=True) == pytest.approx((0.6, 0.4))


def test_a_position_prior_divides_the_letters_of_the_one_ordering_read():
    """PriDe: a model that puts 0.6 on the first letter whatever it shows; divided out by
    position, then the temperature. The prior follows the letters (Combined.shown), not the
    request's option order; without the ordering, or for another option count, nothing."""
    fit = calib.TypeFit(1.0, position_prior={3: (0.6, 0.3, 0.1)})
    shown = (2, 0, 1)  # the letters A, B, C showed options 2, 0, 1
    probs = (0.3, 0.1, 0.6)  # option 2 got A's 0.6, option 0 B's 0.3, option 1 C's 0.1: pure position
    assert calib.apply(fit, probs, shown) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert calib.apply(fit, probs) == pytest.approx(probs)  # no ordering given: no prior
    assert calib.apply(fit, (0.5, 0.5), (0, 1)) == pytest.approx((0.5, 0.5))  # no prior for 2 options
    # clones (the same text at two letters) keep one probability: their letters' prior is shared
    clones = calib.apply(fit, (0.4, 0.4, 0.2), (0, 2, 1), ((0, 2),))
    assert clones[0] == pytest.approx(clones[2]) and sum(clones) == pytest.approx(1.0)
    doc = {
        **DOC,
        "fits": [
            {
                "readout": "canonical",
                "types": {"choice": {"temperature": 2.0, "position_prior": {"3": [0.6, 0.3, 0.1]}}},
            }
        ],
    }
    cal = calib.from_dict(doc)
    assert cal.fit_for(ReadoutSpec("canonical"), "choice") == calib.TypeFit(2.0, (), {3: (0.6, 0.3, 0.1)})
