"""Checkpoints cannot be corrupted, swapped or hijacked unnoticed: sha256 per shard in the manifest,
weights_only loads (a crafted pickle runs nothing), a (rank, stage, replica) header per shard, checked
manifests and `latest` pointers, and a checkpoint directory checked before any worker starts.

One real 2 x 2 run (module fixture) writes the checkpoint; each test damages a copy of it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geotrain.cli.main import main
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.checkpoint import CheckpointError

from runtime_2x2 import write_job_files

pytestmark = pytest.mark.timeout(300)

GEOTRAIN = [sys.executable, "-m", "geotrain"]
STEP = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return write_job_files(tmp_path_factory.mktemp("job"))


def _train_args(files: dict[str, str], checkpoint_dir: Path, *extra: str) -> list[str]:
    return ["train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"], "--steps", "4",
            "--time-scale", "0", "--checkpoint-dir", str(checkpoint_dir), "--json", *extra]


@pytest.fixture(scope="module")
def pristine(files, tmp_path_factory) -> Path:
    """A complete checkpoint of step 2 of a 2 x 2 run (4 steps planned), written by the CLI."""
    directory = tmp_path_factory.mktemp("pristine") / "ckpt"
    done = subprocess.run([*GEOTRAIN, *_train_args(files, directory, "--stop-after", str(STEP))],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert ckpt.latest_step(directory) == STEP
    return directory


@pytest.fixture
def copy(pristine, tmp_path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(pristine, target)
    return target


def _resume_error(files, directory: Path, capsys) -> str:
    """Run `train --resume` in this process; the one-line error it prints (exit status 2 asserted)."""
    code = main(_train_args(files, directory, "--resume"))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def _rewrite_manifest_entry(directory: Path, rank: int) -> None:
    """What an attacker who also edits the manifest does: make the entry match the file again."""
    manifest_path = ckpt.step_dir(directory, STEP) / ckpt.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    data = ckpt.shard_path(directory, STEP, rank).read_bytes()
    manifest["shards"][rank].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest))


def _slot(rank: int) -> dict[str, int]:
    return {"rank": rank, "stage": rank // 2, "replica": rank % 2}


def test_the_manifest_records_each_shards_size_and_sha256(pristine):
    manifest = ckpt.read_manifest(pristine, STEP)
    assert manifest["format"] == ckpt.FORMAT
    for rank, entry in enumerate(manifest["shards"]):
        data = ckpt.shard_path(pristine, STEP, rank).read_bytes()
        assert entry == {"rank": rank, "file": f"rank-{rank:04d}.pt", "bytes": len(data),
                         "sha256": hashlib.sha256(data).hexdigest()}
        state = ckpt.load_shard(pristine, STEP, rank, manifest, _slot(rank))
        assert state["slot"] == _slot(rank) and state["completed"] == STEP


def test_one_flipped_byte_is_refused_naming_the_shard_exit_2(files, copy, capsys):
    shard = ckpt.shard_path(copy, STEP, 0)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    err = _resume_error(files, copy, capsys)
    assert err == f"geotrain: error: {shard}: sha256 does not match the manifest (corrupted or replaced); refusing it"


def test_a_truncated_shard_is_refused_naming_it(copy):
    shard = ckpt.shard_path(copy, STEP, 3)
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:
        handle.truncate(size // 3)
    manifest = ckpt.read_manifest(copy, STEP)
    with pytest.raises(CheckpointError, match=f"{shard}: shard is {size // 3} bytes, the manifest says {size}"):
        ckpt.verify_shards(copy, STEP, manifest)


def test_rank0_shard_copied_over_rank1_is_refused_by_hash_and_by_its_header(copy):
    rank1 = ckpt.shard_path(copy, STEP, 1)
    shutil.copyfile(ckpt.shard_path(copy, STEP, 0), rank1)
    with pytest.raises(CheckpointError, match=f"{rank1}: .*(sha256 does not match|the manifest says)"):
        ckpt.verify_shards(copy, STEP, ckpt.read_manifest(copy, STEP))
    _rewrite_manifest_entry(copy, 1)  # the manifest edited to match: the shard's own header still tells
    with pytest.raises(CheckpointError, match=(f"{rank1}: shard header is .*'rank': 0.*expected "
                                               r"\{'rank': 1, 'stage': 0, 'replica': 1\}")):
        ckpt.load_shard(copy, STEP, 1, ckpt.read_manifest(copy, STEP), _slot(1))


class _Exploit:
    """Unpickling this calls open(marker, 'w'): it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant_exploit(directory: Path, marker: Path) -> Path:
    """Rank 0's shard with a code-running object inside, the manifest updated to match it."""
    shard = ckpt.shard_path(directory, STEP, 0)
    state = torch.load(shard, weights_only=True)
    state["records"] = [_Exploit(marker)]
    torch.save(state, shard)
    _rewrite_manifest_entry(directory, 0)
    return shard


def test_a_crafted_pickle_is_refused_and_runs_nothing(copy, tmp_path):
    marker = tmp_path / "pwned"
    shard = _plant_exploit(copy, marker)
    manifest = ckpt.read_manifest(copy, STEP)
    ckpt.verify_shards(copy, STEP, manifest)  # the hashes match: only weights_only stands in the way
    with pytest.raises(CheckpointError, match=f"^{shard}: refused \\(not a plain tensor checkpoint\\): "
                                              "WeightsUnpickler error: Unsupported global: GLOBAL io.open was not an "
                                              "allowed global by default$"):
        ckpt.load_shard(copy, STEP, 0, manifest, _slot(0))
    assert not marker.exists()
    torch.load(shard, weights_only=False)  # the exploit is real: a plain load runs it
    assert marker.exists()


@pytest.mark.slow
def test_resume_from_a_crafted_shard_stops_the_run_naming_the_file_and_runs_nothing(files, copy, tmp_path):
    marker = tmp_path / "pwned"
    shard = _plant_exploit(copy, marker)
    done = subprocess.run([*GEOTRAIN, *_train_args(files, copy, "--resume", "--heartbeat-timeout", "3")],
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("geotrain: error: rank 0 (stage 0, replica 0, device 0 east-0) exited with status 2 "), last
    assert (f": {shard}: refused (not a plain tensor checkpoint): WeightsUnpickler error: Unsupported global: "
            "GLOBAL io.open was not an allowed global by default") in last
    assert last.count(str(shard)) == 1  # said once, not repeated by the abort notice
    assert not marker.exists()


@pytest.mark.parametrize("pointer, message", [
    (b"step-xyz\n", "must name a step directory like 'step-000012', got 'step-xyz'"),
    (b"\xff\xfe\x00garbage", r"unreadable checkpoint pointer \(not ASCII text\)"),
    (b"step-000099\n", "points at 'step-000099', which is not a complete checkpoint"),
    (b"../../etc\n", "must name a step directory"),
])
def test_a_bad_latest_pointer_is_one_line_error(copy, pointer, message):
    (copy / ckpt.LATEST).write_bytes(pointer)
    with pytest.raises(CheckpointError, match=message) as info:
        ckpt.latest_step(copy)
    assert str(info.value).startswith(f"{copy / ckpt.LATEST}: ") and "\n" not in str(info.value)


def test_a_fifo_in_place_of_pointer_manifest_or_shard_is_refused_without_blocking(copy):
    for path in (copy / ckpt.LATEST, ckpt.step_dir(copy, STEP) / ckpt.MANIFEST):
        manifest = ckpt.read_manifest(copy, STEP)
        path.unlink()
        os.mkfifo(path)
        with pytest.raises(CheckpointError, match=f"^{path}: .*not a regular file"):
            ckpt.latest_step(copy) if path.name == ckpt.LATEST else ckpt.read_manifest(copy, STEP)
        path.unlink()
        if path.name == ckpt.LATEST:
            path.write_text(f"step-{STEP:06d}\n")
    shard = ckpt.shard_path(copy, STEP, 2)
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(CheckpointError, match=f"^{shard}: cannot read shard: not a regular file"):
        ckpt.verify_shards(copy, STEP, manifest)


@pytest.mark.parametrize("text, message", [
    ("[1, 2, 3]", "top level: must be a JSON object, got 'list'"),
    ("{not json", "unreadable manifest: Expecting property name"),
    ("\x00\x01\x02", "unreadable manifest"),
    ('{"format": 1, "step": 2}', f"checkpoint format 1 is not {ckpt.FORMAT}"),
    ('{"format": 3, "step": 3, "world_size": 4, "identity": {}, "shards": []}', "step: must be 2"),
    ('{"format": 3, "step": 2, "world_size": 4, "identity": {}, "shards": [{}]}', "shards: must be a list of 4"),
    ('{"format": 3, "step": 2, "world_size": 1, "identity": {}, "shards": '
     '[{"rank": 0, "file": "../x.pt", "bytes": 1, "sha256": "00"}]}', r"shards\[0\]: must be rank 0"),
    ("[" * 100000, "unreadable manifest"),
])
def test_a_malformed_manifest_is_one_line_error(copy, text, message):
    path = ckpt.step_dir(copy, STEP) / ckpt.MANIFEST
    path.write_text(text)
    with pytest.raises(CheckpointError, match=message) as info:
        ckpt.read_manifest(copy, STEP)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_a_manifest_that_is_a_list_stops_the_cli_with_exit_2(files, copy, capsys):
    (ckpt.step_dir(copy, STEP) / ckpt.MANIFEST).write_text("[]")
    assert "top level: must be a JSON object" in _resume_error(files, copy, capsys)


# -- the checkpoint directory, before launch ------------------------------------------------------

def test_a_new_run_is_refused_in_another_runs_directory_unless_overwrite(files, copy, capsys):
    before = sorted(p.name for p in copy.iterdir())
    assert main(_train_args(files, copy)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"geotrain: error: {copy}: holds another run's checkpoints (latest, step-000002); "
                   "pass --resume to continue it or --overwrite to replace it")
    assert sorted(p.name for p in copy.iterdir()) == before  # nothing touched
    (copy / "notes.txt").write_text("keep me")
    ckpt.prepare_directory(copy, resume=False, overwrite=True)
    # old steps and pointer gone, the rest kept (the lock file of the run that wrote them included)
    assert sorted(p.name for p in copy.iterdir()) == [".geotrain-lock", "notes.txt"]
    ckpt.prepare_directory(copy, resume=False, overwrite=False)  # now empty of checkpoints: accepted


def test_resume_and_overwrite_together_are_refused(files, copy, capsys):
    assert main(_train_args(files, copy, "--resume", "--overwrite")) == 2
    assert "resume and overwrite exclude each other" in capsys.readouterr().err


def test_checkpoint_dir_that_is_a_file_or_unwritable_is_refused_before_launch(files, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(_train_args(files, a_file)) == 2
    assert capsys.readouterr().err.strip() == (f"geotrain: error: {a_file}: --checkpoint-dir exists and is "
                                               "not a directory")
    assert main(_train_args(files, a_file / "sub")) == 2
    assert capsys.readouterr().err.strip() == (f"geotrain: error: {a_file / 'sub'}: --checkpoint-dir is not "
                                               "writable (Not a directory)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_checkpoint_dir_is_refused(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="is not writable"):
            ckpt.prepare_directory(read_only, resume=False, overwrite=False)
    finally:
        read_only.chmod(0o700)
