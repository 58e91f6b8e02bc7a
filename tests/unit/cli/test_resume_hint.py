"""The command a Ctrl-C prints resumes the same run: the user's words, --resume added once, --overwrite
(which would delete the checkpoints) dropped, one line a POSIX shell splits back into the same words; a run
directory the user named, which holds the stopped run's metrics, replaced by a new one beside it."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geotrain.cli.resume_hint import interrupted_lines, resume_banner, resume_command
from geotrain.observe.rundir import CREATED_MARKER, RunDirError, check_run_dir
from geotrain.runtime import checkpoint as ckpt

WORDS = st.lists(st.one_of(st.sampled_from(["train", "--resume", "--overwrite", "--steps", "40", "--data",
                                            "my corpus.txt", "--json"]),
                           st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                                   max_size=12)), max_size=10)


@given(WORDS)
def test_the_resume_command_splits_back_into_the_words_with_resume_once_and_no_overwrite(words):
    line = resume_command(words)
    assert "\n" not in line or any("\n" in w for w in words)  # one line unless a word itself holds one
    split = shlex.split(line)
    expected = [w for w in words if w != "--overwrite"]
    assert split == ["geotrain", *expected, *([] if "--resume" in expected else ["--resume"])]


def _config(directory, resume=False, every=5, run_dir=None):
    return SimpleNamespace(checkpoint=SimpleNamespace(checkpoint_dir=None if directory is None else str(directory),
                                                      checkpoint_every=every, resume=resume),
                           run=SimpleNamespace(steps=40, run_dir=None if run_dir is None else str(run_dir)))


def _checkpoint_at_10(tmp_path):
    (tmp_path / "step-000010").mkdir()
    (tmp_path / "step-000010" / ckpt.MANIFEST).write_text("{}")
    (tmp_path / ckpt.LATEST).write_text("step-000010\n")


def test_a_ctrl_c_names_the_last_checkpoint_and_the_resume_command(tmp_path):
    _checkpoint_at_10(tmp_path)
    words = ["train", "--cluster", "c.yaml", "--checkpoint-dir", str(tmp_path), "--overwrite"]
    assert interrupted_lines(_config(tmp_path), words) == [
        f"geotrain: interrupted; last checkpoint: {tmp_path}/step-000010 (step 10 of 40)",
        f"geotrain: resume with: geotrain train --cluster c.yaml --checkpoint-dir {tmp_path} --resume"]
    assert resume_banner(_config(tmp_path, resume=True)) == (
        f"resumes from checkpoint {tmp_path}/step-000010: step 10 of 40")
    assert resume_banner(_config(tmp_path)) is None


def test_a_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(tmp_path):
    assert interrupted_lines(_config(tmp_path), ["train"]) == [
        f"geotrain: interrupted before the first checkpoint (--checkpoint-every 5: every 5 steps); nothing to "
        f"resume from in {tmp_path}"]
    assert interrupted_lines(_config(None), ["train"]) == [
        "geotrain: interrupted (no --checkpoint-dir: nothing to resume from)"]


def _run_dir_with_metrics(path, default=False):
    (path / "metrics").mkdir(parents=True)
    (path / "metrics" / "rank-0.jsonl").write_text("{}\n")
    if default:
        (path / CREATED_MARKER).write_text("")
    return path


def test_the_resume_command_names_a_new_run_directory_beside_one_the_user_named(tmp_path):
    """`--run-dir runs/a` holds the stopped run's metrics (a launch into it is refused): the command writes to
    runs/a-from-step-10 (-2 when that exists), wherever the words named it, or adds it (a --config file's)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    _checkpoint_at_10(ck)
    named = _run_dir_with_metrics(tmp_path / "runs" / "a")
    with pytest.raises(RunDirError, match="already holds a run's metrics"):
        check_run_dir(named)
    fresh = f"{named}-from-step-10"
    for words, expected in (
            (["train", "--run-dir", str(named), "--steps", "40"], ["train", "--run-dir", fresh, "--steps", "40"]),
            (["train", f"--run-dir={named}"], ["train", f"--run-dir={fresh}"]),
            (["train", "--config", "run.toml"], ["train", "--config", "run.toml", "--run-dir", fresh])):
        line = interrupted_lines(_config(ck, run_dir=named), words)[-1]
        assert shlex.split(line.removeprefix("geotrain: resume with: ")) == ["geotrain", *expected, "--resume"]
    (tmp_path / "runs" / "a-from-step-10").mkdir()
    line = interrupted_lines(_config(ck, run_dir=named), ["train", "--run-dir", str(named)])[-1]
    assert line.endswith(f"--run-dir {named}-from-step-10-2 --resume")
    check_run_dir(f"{named}-from-step-10-2")  # the new one is accepted


@pytest.mark.parametrize("case", ["default", "empty", "none"])
def test_the_resume_command_keeps_the_words_when_their_run_directory_takes_the_resumed_run(tmp_path, case):
    """A default run directory (the resumed run makes a new one), a named one with no metrics yet, or none."""
    ck = tmp_path / "ck"
    ck.mkdir()
    _checkpoint_at_10(ck)
    run_dir = {"default": _run_dir_with_metrics(tmp_path / "geotrain-runs" / "x", default=True),
               "empty": tmp_path / "fresh", "none": None}[case]
    words = ["train", "--checkpoint-dir", str(ck)]
    assert interrupted_lines(_config(ck, run_dir=run_dir), words)[-1] == (
        f"geotrain: resume with: geotrain train --checkpoint-dir {ck} --resume")
