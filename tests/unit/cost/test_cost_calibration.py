"""The calibration file: the utilisation it gives the cost models, by hand; bad files in one line."""

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from geotrain.cost.calibration import Calibration, CalibrationError, load_calibration
from geotrain.cost.gpus import gpu_peak_flops
from geotrain.errors import GeotrainError

TINY = dict(model="tiny", params=816_896, tokens_per_step=768, seconds=(0.2, 0.1, 0.4), device="cpu",
            stands_for="A100")


def test_utilisation_is_the_measured_flops_over_the_gpu_peak():
    calibration = Calibration(**TINY)
    assert calibration.seconds_per_step == 0.2  # the median of 0.1, 0.2, 0.4
    assert calibration.flops_per_step == 6 * 816_896 * 768
    assert calibration.utilisation == pytest.approx(6 * 816_896 * 768 / 0.2 / gpu_peak_flops("A100"), rel=1e-12)
    assert Calibration(**{**TINY, "seconds": (0.1, 0.3)}).seconds_per_step == pytest.approx(0.2)


def test_a_file_round_trips_and_bad_ones_are_named(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(Calibration(**TINY).to_json()))
    assert load_calibration(path) == Calibration(**TINY)
    cases = {"not json": "{", "another version": json.dumps({"version": 2}),
             "missing key": json.dumps({"version": 1, "model": "tiny"}),
             "unknown gpu": json.dumps({**Calibration(**TINY).to_json(), "stands_for": "H1000"}),
             "zero seconds": json.dumps({**Calibration(**TINY).to_json(), "seconds": [0.0]})}
    for name, text in cases.items():
        path.write_text(text)
        with pytest.raises(CalibrationError, match="--calibration") as refused:
            load_calibration(path)
        assert "\n" not in str(refused.value), name
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path / "missing.json")


values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5),
                   st.lists(st.floats(allow_nan=True), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["version", "model", "params", "tokens_per_step", "seconds", "device",
                                        "stands_for"]), values))
@example({"version": True, "model": None, "params": float("inf")})  # found by CI: True == 1, int(inf) overflowed
@example({"version": 1, "model": "m", "params": float("inf"), "tokens_per_step": 1, "seconds": [1.0], "device": "d",
          "stands_for": "x"})
def test_any_object_is_read_or_refused_in_one_line(doc):
    try:
        Calibration.from_json(doc, "f.json")
    except GeotrainError as exc:
        assert "\n" not in str(exc)
