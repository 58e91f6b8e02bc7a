"""`geotrain train --sync-every H --sync-moments` on the 2x2 test plan, real processes over gloo: the syncs
carry the moments beside the outer gradients (bytes as the codecs declare), replicas agree, a checkpoint
holds the first moment's anchor (stop and resume = one run), and the flag's misuse is refused.

A launch costs seconds of start-up and its steps a fraction of one: every run is 12 steps (three syncs), one after
another in one process (tests/one_interpreter.py: its later launches skip the seconds of imports and fork server
start-up; two such processes side by side took 45 s on one core against one process's 33 s)."""

from __future__ import annotations

import json

import pytest

from geotrain.cli.main import main as cli_main
from geotrain.codecs import get_codec
from one_interpreter import OneInterpreter
from runtime_2x2 import write_job_files

STEPS = 12


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return write_job_files(tmp_path_factory.mktemp("job"))


def _train(files: dict[str, str], *extra: str) -> list[str]:
    """The words of a 12-step `geotrain train` of the 2x2 plan with H=4 and int8-block, plus `extra`."""
    return ["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"], "--time-scale", "0",
            "--steps", str(STEPS), "--dp-codec", "int8-block", "--json", "--sync-every", "4", "--outer-lr", "1",
            "--outer-momentum", "0", *extra]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_moment_sync_bytes_replicas_and_resume(files, tmp_path):
    checkpoints = ("--checkpoint-dir", str(tmp_path / "b"), "--checkpoint-every", "4")
    # 12 steps, stopped after 4: the sync after step 7 needs the first moment's anchor and the residuals the
    # checkpoint restored, and steps 8-11 show it
    commands = [_train(files, "--sync-moments", *checkpoints, "--stop-after", "4"),
                _train(files, "--sync-moments", *checkpoints, "--resume"), _train(files),
                _train(files, "--sync-moments", "--checkpoint-dir", str(tmp_path / "a"), "--checkpoint-every", "4"),
                _train(files, "--sync-moments", "--moment-syncs", "1")]
    done = OneInterpreter(commands, tmp_path, "runs").results()
    for run in done:
        assert run.returncode == 0, run.stderr[-2000:]
    stopped, resumed, plain, report, first_only = [json.loads(run.stdout) for run in done]
    assert report["summary"]["replicas_in_sync"]
    assert report["losses"][:4] == plain["losses"][:4]  # the same until the first sync lands
    assert report["losses"][4:] != plain["losses"][4:]  # the moments changed the next period
    # a sync step carries the outer gradients and first moments (int8-block) plus the second moments (log-block);
    # a report row's dp_bytes: the most one rank handed (the larger stage's, in both runs)
    sync_bytes, plain_bytes = report["iterations"][3]["dp_bytes"], plain["iterations"][3]["dp_bytes"]
    assert report["iterations"][2]["dp_bytes"] == 0
    int8 = get_codec("int8-block")
    numel = next(n for n in range(plain_bytes // 2, plain_bytes + 1) if int8.wire_nbytes((n,)) == plain_bytes)
    assert sync_bytes == 2 * int8.wire_nbytes((numel,)) + get_codec("log-block").wire_nbytes((numel,))
    # --moment-syncs 1: the first sync carries the moments, the second and third the outer gradients alone
    assert first_only["summary"]["replicas_in_sync"]
    assert first_only["losses"][:8] == report["losses"][:8]  # the same until the second sync lands
    assert [row["dp_bytes"] for row in first_only["iterations"]][3::4] == [sync_bytes, plain_bytes, plain_bytes]
    assert stopped["losses"] == report["losses"][:4]
    assert resumed["losses"] == report["losses"]  # the resumed report holds the checkpoint's steps too


def _refusal(files: dict[str, str], capsys, *extra: str) -> str:
    """`geotrain train` in this process (the refusal comes before any launch): its stderr, after exit 2."""
    code = cli_main(["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"],
                     "--time-scale", "0", "--steps", "2", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    return err


def test_moment_syncs_without_sync_moments_is_refused_in_one_line(files, capsys):
    err = _refusal(files, capsys, "--sync-every", "2", "--moment-syncs", "1")
    assert "--moment-syncs says how many outer syncs carry the moments: it needs optim.sync_moments" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


def test_moment_sync_without_sync_every_is_refused_in_one_line(files, capsys):
    err = _refusal(files, capsys, "--sync-moments")
    assert "--sync-moments is Streaming DiLoCo's: it needs optim.sync_every" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
