"""--keep-checkpoints: the newest N complete checkpoints stay; the latest one and the one a resume started
from are never deleted, nor incomplete step directories or those another checkpoint format wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.checkpoint import CheckpointError


def _checkpoint(root: Path, step: int, form: int = ckpt.FORMAT, manifest: bool = True) -> None:
    directory = ckpt.step_dir(root, step)
    directory.mkdir(parents=True)
    (directory / "rank-0000.pt").write_bytes(b"x" * 10)
    if manifest:
        (directory / ckpt.MANIFEST).write_text(json.dumps({"format": form, "step": step}))


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))


def test_the_newest_n_stay_and_older_ones_of_this_format_go(tmp_path):
    for step in (2, 4, 6, 8, 10):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 1, form=2)  # another format's: not ours to delete
    _checkpoint(tmp_path, 3, manifest=False)  # incomplete (a write in progress, or interrupted)
    (tmp_path / ckpt.LATEST).write_text("step-000010\n")
    assert ckpt.prune_checkpoints(tmp_path, 2) == ["step-000002", "step-000004", "step-000006"]
    assert _steps(tmp_path) == ["step-000001", "step-000003", "step-000008", "step-000010"]


def test_the_latest_and_the_resumed_from_checkpoint_always_stay(tmp_path):
    for step in (2, 4, 6, 8):
        _checkpoint(tmp_path, step)
    (tmp_path / ckpt.LATEST).write_text("step-000004\n")  # rewound by hand: latest is not the newest
    assert ckpt.prune_checkpoints(tmp_path, 1, protect=(2,)) == ["step-000006"]
    assert _steps(tmp_path) == ["step-000002", "step-000004", "step-000008"]


def test_nothing_is_deleted_without_a_readable_latest_pointer(tmp_path):
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    (tmp_path / ckpt.LATEST).write_text("garbage\n")
    assert ckpt.prune_checkpoints(tmp_path, 1) == []
    assert len(_steps(tmp_path)) == 3


def test_keeping_fewer_than_one_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="keep_checkpoints must be at least 1, got 0"):
        ckpt.prune_checkpoints(tmp_path, 0)
