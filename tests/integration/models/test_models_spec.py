"""A user's model file cannot take geotrain down: sys.exit() at import or in the builder, and a
builder that never returns (bounded by ModelOptions.build_timeout_s), are one-line ModelSpecErrors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from geotrain.models import ModelOptions, load_model_spec
from geotrain.models.options import ModelSpecError

from runtime_2x2 import CLUSTER_YAML, PLAN

USER_FILE = """
import sys
import time
if "{when}" == "import":
    sys.exit("bye at import")

def exits():
    sys.exit(3)

def sleeps():
    time.sleep(3600)

def spins():
    while True:
        pass
"""


@pytest.mark.parametrize("when, name, message", [
    ("import", "exits", "importing .*user.py raised SystemExit: bye at import"),
    ("call", "exits", "exits\\(\\) raised SystemExit: 3"),
])
def test_sys_exit_in_a_user_model_is_a_model_spec_error(tmp_path, when, name, message):
    path = tmp_path / "user.py"
    path.write_text(USER_FILE.format(when=when))
    with pytest.raises(ModelSpecError, match=f"^model spec '{path}:{name}': {message}$"):
        load_model_spec(f"{path}:{name}")


@pytest.mark.parametrize("name", ["sleeps", "spins"])
def test_a_builder_that_never_returns_is_bounded(tmp_path, name):
    path = tmp_path / "user.py"
    path.write_text(USER_FILE.format(when="call"))
    started = time.monotonic()
    with pytest.raises(ModelSpecError, match=(f"^model spec '{path}:{name}': importing {path} and calling "
                                              f"{name}\\(\\) did not return within 1.5 s$")):
        load_model_spec(f"{path}:{name}", ModelOptions(build_timeout_s=1.5))
    assert 1.5 <= time.monotonic() - started < 10


def test_build_timeout_must_be_finite_and_positive():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ModelSpecError, match="build_timeout_s must be a finite number > 0"):
            ModelOptions(build_timeout_s=bad)


@pytest.mark.timeout(240)
def test_train_with_a_builder_calling_sys_exit_ends_in_one_line(tmp_path):
    (tmp_path / "user.py").write_text(USER_FILE.format(when="call"))
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    done = subprocess.run([sys.executable, "-m", "geotrain", "train", "--cluster", str(tmp_path / "cluster.yaml"),
                           "--plan", str(tmp_path / "plan.json"), "--steps", "2", "--time-scale", "0",
                           "--model", f"{tmp_path / 'user.py'}:exits"], capture_output=True, text=True, timeout=200)
    assert done.returncode == 2, done.stderr
    # which rank the launcher names first (its own error, or a peer that lost it) is timing: the
    # builder's error is reported by the workers, and nothing is a traceback
    assert done.stderr.strip().splitlines()[-1].startswith("geotrain: error: rank ")
    assert f"model spec '{tmp_path / 'user.py'}:exits': exits() raised SystemExit: 3" in done.stderr
    assert "Traceback" not in done.stderr
