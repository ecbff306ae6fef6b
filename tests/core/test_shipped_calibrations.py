"""The calibration files shipped in openjev/calibrations: each loads, `--calibration auto`
picks each for its own model's weights only, and the quality model's file names the
default readout and abstain floors measured for it (docs/quality-model.md)."""

from openjev import calibrations
from openjev.core.readouts import ReadoutSpec
from openjev.core.wording import PROMPT_VERSION


def _by_model() -> dict:
    return {cal.model_name: cal for cal in calibrations.shipped()}


def test_each_shipped_file_is_chosen_for_its_own_model_only():
    shipped = _by_model()
    assert {"smollm2-135m-instruct", "qwen2.5-coder-1.5b"} <= set(shipped)
    for name, cal in shipped.items():
        chosen = calibrations.select(
            "auto", fingerprint=cal.fingerprint, prompt_version=PROMPT_VERSION, base_temperature=1.0
        )
        assert chosen is not None and chosen.model_name == name
    assert (
        calibrations.select(
            "auto", fingerprint="sha256:another-model", prompt_version=PROMPT_VERSION, base_temperature=1.0
        )
        is None
    )


def test_the_quality_models_file_names_its_measured_defaults():
    """Readouts chosen per type on dev (docs/quality-model.md): choice options and scales read
    in two orders, noul once; a floor on the calibrated top probability."""
    cal = _by_model()["qwen2.5-coder-1.5b"]
    spec = cal.default_readout
    assert spec == ReadoutSpec("letters", 2, (("noul", ReadoutSpec("letters", 1)),)) and cal.covers(spec)
    assert cal.default_abstain is not None and cal.default_abstain.min_confidence > 0
    for qtype in ("noul", "choice", "score"):  # a fit for each type's own readout: a temperature, no prior
        fit = cal.fit_for(spec.for_type(qtype), qtype)
        assert fit is not None and fit.bias == () and not fit.position_prior
    # chosen leave-one-source-out (evals/source_table.py): choice divides out its content-free
    # answer before a temperature; yes/no and scales are read as they are
    choice = cal.fit_for(spec.for_type("choice"), "choice")
    assert choice is not None and choice.content_free and choice.temperature < 1
    for qtype in ("noul", "score"):
        fit = cal.fit_for(spec.for_type(qtype), qtype)
        assert fit is not None and not fit.content_free and fit.temperature == 1.0


def test_the_embedded_models_canonical_fit_divides_out_its_position_prior():
    """The embedded model keeps the global default (canonical: one reading per choice, a scale
    both ways); chosen on leave-one-domain-out figures (docs/quality-readouts.md), its choice fit
    divides each letter by the model's prior for it (PriDe, per option count, from dev's permuted
    readings) and its score fit each level by the scale's prior (symmetrised, as it is read both
    ways) before a temperature; none has a prior for two (read both ways, it would cancel), and
    no fit corrects a request position."""
    cal = _by_model()["smollm2-135m-instruct"]
    assert cal.default_readout is None and cal.default_abstain is None
    choice = cal.fit_for(ReadoutSpec("canonical"), "choice")
    score = cal.fit_for(ReadoutSpec("canonical"), "score")
    assert choice is not None and choice.bias == () and set(choice.position_prior) == set(range(3, 9))
    assert score is not None and score.bias == () and set(score.position_prior) == set(range(3, 6))
    for n, prior in [*choice.position_prior.items(), *score.position_prior.items()]:
        assert len(prior) == n and abs(sum(prior) - 1) < 1e-9
    noul = cal.fit_for(ReadoutSpec("canonical"), "noul")
    assert noul is not None and noul.bias == () and not noul.position_prior


def test_canonical_scales_are_calibrated_as_the_two_orders_they_are_read_in():
    """canonical reads a scale both ways, the readings and combination of letters R=2: its
    score fit in each shipped file must be that one (a one-reading fit would mis-state it),
    unless the file fitted canonical's scales on their own with the scale's position prior
    (the embedded model's, checked above)."""
    for cal in calibrations.shipped():
        canonical = cal.fit_for(ReadoutSpec("canonical"), "score")
        assert canonical is not None
        if not canonical.position_prior:
            assert canonical == cal.fit_for(ReadoutSpec("letters", 2), "score")
