"""`geotrain train --sync-every H --fragments P --sync-delay TAU --sync-mix ALPHA` (Streaming DiLoCo in the
runtime) on the 2x2 test plan, real processes over gloo (--time-scale 0), and the flags' validation.

The four runs the first two tests read run once, one after another in one process (tests/one_interpreter.py: its
later launches skip the seconds of imports and fork server start-up)."""

from __future__ import annotations

import json

import pytest

from geotrain.cli.main import main as cli_main
from geotrain.runtime.sections import OptimSection, RuntimeConfigError
from one_interpreter import OneInterpreter
from runtime_2x2 import write_job_files


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return write_job_files(tmp_path_factory.mktemp("job"))


def _train(files: dict[str, str], *extra: str, time_scale: str = "0", steps: int = 8) -> list[str]:
    """The words of `geotrain train` of the 2x2 plan with int8-block, plus `extra`."""
    return ["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"], "--time-scale",
            time_scale, "--steps", str(steps), "--dp-codec", "int8-block", "--json", *extra]


@pytest.fixture(scope="module")
def reports(files, tmp_path_factory) -> dict[str, dict]:
    """8-step runs with H=4: blocking, streamed (P=2, tau=1, alpha=0.5 on emulated links), and fragments
    cut by layers and by bytes (tau=0)."""
    commands = {
        "blocking": _train(files, "--sync-every", "4"),
        "streamed": _train(files, "--sync-every", "4", "--fragments", "2", "--sync-delay", "1", "--sync-mix", "0.5",
                           time_scale="1e-3"),
        **{split: _train(files, "--sync-every", "4", "--fragments", "2", "--fragment-split", split)
           for split in ("layers", "bytes")}}
    runs = OneInterpreter(list(commands.values()), tmp_path_factory.mktemp("streaming"), "runs").results()
    done = {}
    for name, run in zip(commands, runs, strict=True):
        assert run.returncode == 0, f"{name}: {run.stderr[-2000:]}"
        done[name] = json.loads(run.stdout)
    return done


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_streaming_sends_one_fragment_per_sync_posted_when_it_lands_and_keeps_replicas_equal(reports):
    """H=4, P=2, tau=1 on emulated links against blocking H=4 (tau = 0 equal to blocking is
    tests/unit/sync's): fragment 1 starts after step 1 and lands after step 2, fragment 0 after
    steps 3 -> 4 and fragment 1 again 5 -> 6; the last step syncs both, blocking. Each landing step
    records the posted collective's bytes and its emulated link time as DP communication."""
    blocking, report = reports["blocking"], reports["streamed"]
    nbytes = [row["dp_bytes"] for row in report["iterations"]]
    seconds = [row["comm_measured"]["dp"] for row in report["iterations"]]
    assert [b > 0 for b in nbytes] == [False, False, True, False, True, False, True, True]
    assert [s > 0 for s in seconds] == [b > 0 for b in nbytes]
    assert nbytes[2] == nbytes[6] and nbytes[2] + nbytes[4] > nbytes[7] > max(nbytes[2], nbytes[4])
    # replicas end equal: the anchors' fingerprint agreed on every step, and the last step synced everything
    assert report["summary"]["replicas_in_sync"] and blocking["summary"]["replicas_in_sync"]
    whole = [row["dp_bytes"] for row in blocking["iterations"]]
    # before the last step (which flushes: every fragment syncs at once) a sync carries one fragment
    assert max(nbytes[:-1]) > 0 and max(nbytes[:-1]) < 0.7 * max(whole[:-1])
    assert report["losses"] != blocking["losses"]  # the overlap changed the trajectory
    assert abs(report["losses"][-1] - blocking["losses"][-1]) < 0.2
    # the report's peak DP bytes are the per-step records' (posted collectives counted when they land)
    assert max(report["bytes"]["dp_per_stage"]) == max(nbytes)


@pytest.mark.timeout(600)
def test_fragments_cut_at_equal_bytes_carry_equal_shares_and_keep_replicas_equal(reports):
    """--fragment-split bytes: the two fragments' syncs (steps 1 and 3; the last step syncs both) carry the same
    bytes to within a row of each stage's cut; cut between tensors they differ by a tensor's worth."""
    shares = {}
    for split in ("layers", "bytes"):
        report = reports[split]
        nbytes = [row["dp_bytes"] for row in report["iterations"]]
        assert [b > 0 for b in nbytes] == [False, True, False, True, False, True, False, True]
        assert max(nbytes[1], nbytes[3]) < 0.6 * nbytes[7] and report["summary"]["replicas_in_sync"]
        shares[split] = abs(nbytes[1] - nbytes[3]) / nbytes[7]  # (a step's dp_bytes: its busiest stage's)
    assert shares["bytes"] < 0.005 < 0.02 < shares["layers"], shares


@pytest.mark.parametrize(("options", "message"), [
    ({"fragment_split": "bytes"}, "optim.fragment_split is Streaming DiLoCo's: it needs optim.sync_every"),
    ({"sync_every": 4, "fragment_split": "rows"}, r"optim.fragment_split must be one of layers, bytes, got 'rows'"),
    ({"fragments": 2}, "optim.fragments is Streaming DiLoCo's: it needs optim.sync_every"),
    ({"sync_every": 4, "fragments": 5}, r"optim.fragments must be an integer in 1..4 \(optim.sync_every\), got 5"),
    ({"sync_every": 4, "sync_delay": 4}, r"optim.sync_delay must be an integer in 0..3"),
    ({"sync_every": 4, "sync_mix": 1.5}, r"optim.sync_mix must be a number in \[0, 1\], got 1.5"),
    ({"sync_every": 4, "sync_delay": -1}, r"optim.sync_delay must be an integer >= 0, got -1"),
    ({"sync_landing": "eager"}, "optim.sync_landing is Streaming DiLoCo's: it needs optim.sync_every"),
    ({"sync_every": 4, "sync_delay": 1, "sync_mix": 0.5, "sync_landing": "eager"},
     r"optim.sync_mix is the mix landing's alpha; with optim.sync_landing eager it must be 0, got 0.5"),
    ({"sync_every": 4, "sync_landing": "late"}, r"optim.sync_landing must be one of mix, eager, got 'late'"),
    ({"sync_warmup": 10}, "optim.sync_warmup is Streaming DiLoCo's: it needs optim.sync_every"),
])
def test_streaming_settings_are_refused_in_one_line_naming_the_key(options, message):
    with pytest.raises(RuntimeConfigError, match=message):
        OptimSection(**options)


def test_streaming_flags_without_sync_every_are_refused_by_train(files, capsys):
    # `geotrain train` in this process: the refusal comes before any launch
    code = cli_main(["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"],
                     "--time-scale", "0", "--steps", "2", "--sync-mix", "0.5"])
    err = capsys.readouterr().err
    assert code == 2, err  # (--sync-delay alone is delayed gradients: geotrain.sync.delayed)
    assert "--sync-mix is Streaming DiLoCo's: it needs optim.sync_every" in err  # the flag typed, named
    assert len([line for line in err.splitlines() if line.strip()]) == 1
