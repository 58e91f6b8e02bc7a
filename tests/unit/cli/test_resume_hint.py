"""The command a Ctrl-C prints resumes the same run: the user's words, --resume added once, --overwrite
(which would delete the checkpoints) dropped, one line a POSIX shell splits back into the same words."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from geotrain.cli.resume_hint import interrupted_lines, resume_banner, resume_command
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


def _config(directory, resume=False, every=5):
    return SimpleNamespace(checkpoint=SimpleNamespace(checkpoint_dir=None if directory is None else str(directory),
                                                      checkpoint_every=every, resume=resume),
                           run=SimpleNamespace(steps=40))


def test_a_ctrl_c_names_the_last_checkpoint_and_the_resume_command(tmp_path):
    (tmp_path / "step-000010").mkdir()
    (tmp_path / "step-000010" / ckpt.MANIFEST).write_text("{}")
    (tmp_path / ckpt.LATEST).write_text("step-000010\n")
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
