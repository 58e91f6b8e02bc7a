"""A checkpoint directory belongs to one run at a time and to one run's shards only: an advisory lock
held by the launcher (a second `geotrain train` is refused naming the holder), a run header in
every shard (a shard of another run, copied in with the manifest re-hashed, is refused by name),
partial files of an interrupted checkpoint removed by the next run (which says so), and a full
disk reported as "no space left on <dir>"."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from geotrain.cli.main import build_parser
from geotrain.cli.main import main as cli_main
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.checkpoint import CheckpointError
from geotrain.runtime.checkpoint_lock import LOCK_FILE, hold_directory

from runtime_2x2 import PLAN, write_job_files

pytestmark = pytest.mark.timeout(400)

GEOTRAIN = [sys.executable, "-m", "geotrain"]
STEP = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return write_job_files(tmp_path_factory.mktemp("job"))


def _train(files: dict[str, str], directory: Path, *extra: str) -> list[str]:
    return [*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"], "--time-scale", "0",
            "--checkpoint-dir", str(directory), "--json", *extra]


@pytest.fixture(scope="module")
def two_runs(files, tmp_path_factory) -> tuple[Path, Path]:
    """Step-2 checkpoints of two 2 x 2 runs that differ only in their seed (0 and 1), run side by side."""
    root = tmp_path_factory.mktemp("runs")
    dirs = (root / "seed0", root / "seed1")
    procs = [subprocess.Popen(_train(files, directory, "--steps", "4", "--stop-after", str(STEP), "--seed", str(seed)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed, directory in enumerate(dirs)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    return dirs


def _slot(rank: int) -> dict[str, int]:
    return {"rank": rank, "stage": rank // 2, "replica": rank % 2}


def test_a_shard_of_another_run_with_the_manifest_rehashed_is_refused_by_its_header(two_runs, tmp_path):
    ours = tmp_path / "ours"
    shutil.copytree(two_runs[0], ours)
    shard = ckpt.shard_path(ours, STEP, 1)
    shutil.copyfile(ckpt.shard_path(two_runs[1], STEP, 1), shard)  # same slot, the seed-1 run's weights
    manifest_path = ckpt.step_dir(ours, STEP) / ckpt.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    data = shard.read_bytes()
    manifest["shards"][1].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest))
    manifest = ckpt.read_manifest(ours, STEP)
    ckpt.verify_shards(ours, STEP, manifest)  # sizes and hashes agree now: only the header can tell
    assert ckpt.load_shard(ours, STEP, 0, manifest, _slot(0))["completed"] == STEP  # our own shard loads
    with pytest.raises(CheckpointError, match=f"^{shard}: shard header names run .* a shard of another run or step"):
        ckpt.load_shard(ours, STEP, 1, manifest, _slot(1))


def test_a_shard_names_its_run_and_step_in_its_header(two_runs):
    manifests = [ckpt.read_manifest(directory, STEP) for directory in two_runs]
    headers = [torch.load(ckpt.shard_path(directory, STEP, 3), weights_only=True)["run"] for directory in two_runs]
    assert headers == [{"identity_sha256": ckpt.identity_digest(m["identity"]), "step": STEP} for m in manifests]
    assert headers[0]["identity_sha256"] != headers[1]["identity_sha256"]  # seeds 0 and 1


def test_a_second_run_on_a_held_checkpoint_dir_is_refused_naming_the_holder(files, tmp_path, capsys):
    """The second `geotrain train` runs in this process (its refusal comes before any launch), within
    moments of the first's lock: the first, still starting its workers, outlives it even with a few steps."""
    build_parser(["train"])  # imports the command's modules now, not between the lock and the refusal
    directory = tmp_path / "ck"
    steps = 10
    first = subprocess.Popen(_train(files, directory, "--steps", str(steps), "--seed", "0"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = directory / LOCK_FILE
        deadline = time.monotonic() + 120
        while not (lock.is_file() and lock.read_text().startswith(f"{first.pid} ")):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() else "slow"
            time.sleep(0.05)
        # --overwrite would delete the first run's checkpoints if the second got past the lock
        code = cli_main(_train(files, directory, "--steps", "4", "--seed", "1", "--overwrite")[len(GEOTRAIN):])
        err = capsys.readouterr().err
        assert first.poll() is None, "the first run ended before the second was refused: test inconclusive"
        assert code == 2, err
        assert err.strip() == (f"geotrain: error: {directory}: --checkpoint-dir is in use by another run "
                               f"(pid {first.pid} on host {socket.gethostname()}); wait for it to end or "
                               f"choose another directory")
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    finally:
        first.kill()
        first.wait()
    manifest = ckpt.read_manifest(directory, steps)
    assert manifest["identity"]["seed"] == 0 and ckpt.has_checkpoints(directory) == ["latest", f"step-{steps:06d}"]
    with hold_directory(directory) as held:  # the lock went with the first run
        assert held.removed == ()


def test_the_lock_is_refused_in_the_same_process_and_free_after_release(tmp_path):
    held = hold_directory(tmp_path / "d")
    with pytest.raises(CheckpointError, match=rf"in use by another run \(pid {os.getpid()} on host "):
        hold_directory(tmp_path / "d")
    held.release()
    hold_directory(tmp_path / "d").release()


def test_the_lock_of_a_killed_run_does_not_block_the_next(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from geotrain.runtime.checkpoint_lock import "
                               "hold_directory; h = hold_directory(sys.argv[1]); print('held', flush=True); "
                               "time.sleep(600)", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(CheckpointError, match=f"pid {holder.pid} on host"):
            hold_directory(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    hold_directory(tmp_path).release()


def test_partial_files_of_an_interrupted_checkpoint_are_removed_by_the_next_run_which_says_so(tmp_path, capsys):
    from geotrain.cluster import make_network
    from geotrain.runtime.config import RuntimeConfig
    from geotrain.runtime.launcher import check_before_launch

    directory = tmp_path / "ck"
    (directory / "step-000004").mkdir(parents=True)
    partial = [directory / "step-000004" / f".rank-0002.pt.tmp-{os.getpid() + 7}", directory / ".latest.tmp-12",
               directory / ".geotrain-write-test-99"]
    kept = [directory / "notes.txt", directory / "rank-0000.pt.tmp-3"]  # not of our temporary names
    for path in partial + kept:
        path.write_bytes(b"x" * 100)
    config = RuntimeConfig.of(make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0),
                              np.array(PLAN["assignment"]), checkpoint_dir=str(directory), overwrite=True)
    with check_before_launch(config):
        err = capsys.readouterr().err
    assert not any(path.exists() for path in partial) and all(path.exists() for path in kept)
    assert err.strip() == (f"geotrain: note: removed 3 partial checkpoint file(s) of an interrupted run in {directory}: "
                           f".geotrain-write-test-99, .latest.tmp-12, step-000004/{partial[0].name}")


def test_a_full_disk_during_a_checkpoint_says_no_space_left_and_leaves_no_temp_file(tmp_path, monkeypatch):
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError) as info:
        ckpt.save_shard(tmp_path, 3, 1, {"slot": {"rank": 1}, "x": torch.ones(1000)}, {"seed": 0})
    assert str(info.value).startswith(f"no space left on {ckpt.step_dir(tmp_path, 3)} (writing rank-0001.pt, ")
    assert list(ckpt.step_dir(tmp_path, 3).iterdir()) == []


def _complete_steps(directory: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in directory.glob("step-*") if (p / ckpt.MANIFEST).is_file())


@pytest.mark.slow
def test_ctrl_c_names_the_last_checkpoint_and_its_resume_command_which_resumes_saying_so(files, tmp_path):
    """Ctrl-C of a run checkpointing every step (--keep-checkpoints 2): two lines naming the latest checkpoint
    and the command that resumes it; that command, run, says in its banner where it resumed, and pruning
    keeps the checkpoint it resumed from."""
    from proctree import default_signals

    directory = tmp_path / "ck"
    words = ["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"], "--time-scale", "0",
             "--steps", "5000", "--checkpoint-dir", str(directory), "--checkpoint-every", "1", "--keep-checkpoints", "2"]
    launcher = subprocess.Popen([*GEOTRAIN, *words], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 150
        while (ckpt.latest_step(directory) or 0) < 4:
            assert launcher.poll() is None and time.monotonic() < deadline, "no 4th checkpoint"
            time.sleep(0.1)
        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C in a terminal
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 130 and "Traceback" not in err, err
    step = ckpt.latest_step(directory)
    assert err.strip().splitlines() == [
        f"geotrain: interrupted; last checkpoint: {ckpt.step_dir(directory, step)} (step {step} of 5000)",
        f"geotrain: resume with: geotrain {shlex.join(words)} --resume"]
    # The newest 2 that `latest` names, and a third where the Ctrl-C fell between a manifest and its pruning
    # (step - 2 not yet deleted) or between a manifest and the `latest` pointer (step + 1 complete, not named).
    kept = _complete_steps(directory)
    assert step >= 4 and {step - 1, step} <= set(kept) <= {step - 2, step - 1, step, step + 1}, (step, kept)
    assert len(kept) <= 3, (step, kept)
    resume = shlex.split(err.strip().splitlines()[-1].split(": ", 2)[2])
    assert resume[0] == "geotrain"
    resumed = subprocess.run([*GEOTRAIN, *resume[1:], "--stop-after", "2"], capture_output=True, text=True,
                             timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumes from checkpoint {ckpt.step_dir(directory, step)}: step {step} of 5000" in resumed.stdout
    assert _complete_steps(directory) == [step, step + 1, step + 2]  # the resumed-from one stays
