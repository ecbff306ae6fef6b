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
    cal = _by_model()["qwen2.5-coder-1.5b"]
    assert cal.default_readout == ReadoutSpec("letters", 1) and cal.covers(cal.default_readout)
    assert cal.default_abstain is not None
    for qtype in ("noul", "choice", "score"):  # a temperature per type, no position prior
        fit = cal.fit_for(cal.default_readout, qtype)
        assert fit is not None and fit.bias == ()
    # the embedded model keeps the global defaults: its file names none
    assert _by_model()["smollm2-135m-instruct"].default_readout is None
