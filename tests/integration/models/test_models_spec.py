"""A user's model file cannot take geotrain down: sys.exit() at import or in the builder, and a
builder that never returns (bounded by ModelOptions.build_timeout_s), are one-line ModelSpecErrors."""

from __future__ import annotations

import json
import subprocess
import sys

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


BOUNDED_CALL = """
import sys, time
from geotrain.models import ModelOptions, load_model_spec
from geotrain.models.options import ModelSpecError
started = time.monotonic()
try:
    load_model_spec(sys.argv[1], ModelOptions(build_timeout_s=1.5))
except ModelSpecError as exc:
    print(exc)
    print(time.monotonic() - started)
"""


@pytest.mark.parametrize("name", ["sleeps", "spins"])
def test_a_builder_that_never_returns_is_bounded(tmp_path, name):
    # in a child process: the abandoned thread (a `while True` one holds the GIL) must not stay in
    # pytest's process and slow every later test
    path = tmp_path / "user.py"
    path.write_text(USER_FILE.format(when="call"))
    done = subprocess.run([sys.executable, "-c", BOUNDED_CALL, f"{path}:{name}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    message, seconds = done.stdout.strip().splitlines()
    assert message == (f"model spec '{path}:{name}': importing {path} and calling {name}() did not return "
                       f"within 1.5 s")
    assert 1.5 <= float(seconds) < 10


def test_build_timeout_must_be_finite_and_positive():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ModelSpecError, match="build_timeout_s must be a finite number > 0"):
            ModelOptions(build_timeout_s=bad)


@pytest.mark.timeout(240)
def test_train_with_a_builder_calling_sys_exit_ends_in_one_line(tmp_path):
    (tmp_path / "user.py").write_text(USER_FILE.format(when="call"))
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    done = subprocess.run([sys.executable, "-m", "geotrain", "train", "--run-dir", "none", "--cluster", str(tmp_path / "cluster.yaml"),
                           "--plan", str(tmp_path / "plan.json"), "--steps", "2", "--time-scale", "0",
                           "--model", f"{tmp_path / 'user.py'}:exits"], capture_output=True, text=True, timeout=200)
    assert done.returncode == 2, done.stderr
    # which rank the launcher names first (its own error, or a peer that lost it) is timing: the
    # builder's error is reported by the workers, and nothing is a traceback
    assert done.stderr.strip().splitlines()[-1].startswith("geotrain: error: rank ")
    assert f"model spec '{tmp_path / 'user.py'}:exits': exits() raised SystemExit: 3" in done.stderr
    assert "Traceback" not in done.stderr
