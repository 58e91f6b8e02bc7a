"""What `geotrain train` says about its checkpoints when it is interrupted and when it resumes.

A Ctrl-C of a run with --checkpoint-dir ends with the last complete checkpoint and the command that
continues from it: the words the user typed, with --resume (and without --overwrite, which would delete
the checkpoints), as one line for the shell. A run directory the user named (--run-dir, or a --config
file's) holds the stopped run's metrics, so a second launch into it is refused: the command names a new one
beside it, DIR-from-step-S (a default run directory needs nothing: the resumed run makes its own). A resumed
run names the checkpoint and step it starts from.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geotrain.observe.rundir import CREATED_MARKER, RunDirError, check_run_dir
from geotrain.runtime.checkpoint import CheckpointError, latest_step, step_dir

PROGRAM = "geotrain"
RUN_DIR_FLAG = "--run-dir"


def resume_command(words: Sequence[str], run_dir: str | None = None) -> str:
    """`geotrain WORDS` with --resume added (once) and --overwrite dropped, quoted for a POSIX shell; with
    `run_dir`, every `--run-dir DIR` (or `--run-dir=DIR`) of the words names it instead (added if none does)."""
    kept = [word for word in words if word != "--overwrite"]
    if run_dir is not None:
        kept = _writing_to(kept, run_dir)
    if "--resume" not in kept:
        kept.append("--resume")
    return shlex.join([PROGRAM, *kept])


def _writing_to(words: list[str], run_dir: str) -> list[str]:
    out: list[str] = []
    named = False
    at = 0
    while at < len(words):
        word = words[at]
        if word == RUN_DIR_FLAG and at + 1 < len(words):
            out += [word, run_dir]
            named, at = True, at + 2
            continue
        if word.startswith(f"{RUN_DIR_FLAG}="):
            out.append(f"{RUN_DIR_FLAG}={run_dir}")
            named = True
        else:
            out.append(word)
        at += 1
    return out if named else [*out, RUN_DIR_FLAG, run_dir]


def resumed_run_dir(run_dir: str | None, step: int) -> str | None:
    """Where the resumed run writes its metrics: None (as the words say) unless `run_dir` is one the user named
    that now holds the stopped run's metrics (a launch into it is refused); then the first of DIR-from-step-S,
    DIR-from-step-S-2, ... that does not exist."""
    if run_dir is None or (Path(run_dir) / CREATED_MARKER).exists():
        return None
    try:
        check_run_dir(run_dir)
        return None
    except RunDirError:
        pass
    base = f"{run_dir.rstrip('/')}-from-step-{step}"
    for n in itertools.count(1):
        name = base if n == 1 else f"{base}-{n}"
        if not Path(name).exists():
            return name
    raise AssertionError("unreachable")


def _last_checkpoint(config: Any) -> int | None:
    """The newest complete checkpoint's step; None when there is none (or no readable pointer)."""
    try:
        return latest_step(config.checkpoint.checkpoint_dir)
    except (CheckpointError, OSError):
        return None


def interrupted_lines(config: Any, words: Sequence[str]) -> list[str]:
    """The lines a Ctrl-C of `geotrain WORDS` ends with (after its workers have stopped)."""
    directory = config.checkpoint.checkpoint_dir
    if directory is None:
        return ["geotrain: interrupted (no --checkpoint-dir: nothing to resume from)"]
    step = _last_checkpoint(config)
    if step is None:
        every = config.checkpoint.checkpoint_every
        when = f"every {every} steps" if every else "at the end only"
        return [f"geotrain: interrupted before the first checkpoint (--checkpoint-every {every}: {when}); "
                f"nothing to resume from in {directory}"]
    return [f"geotrain: interrupted; last checkpoint: {step_dir(directory, step)} (step {step} of "
            f"{config.run.steps})",
            f"geotrain: resume with: {resume_command(words, resumed_run_dir(config.run.run_dir, step))}"]


def resume_banner(config: Any) -> str | None:
    """The banner's line of a resumed run: the checkpoint and the step it starts from (None: not resuming).
    CheckpointError when there is no complete checkpoint to resume (the launch would refuse it too)."""
    if not config.checkpoint.resume:
        return None
    directory = config.checkpoint.checkpoint_dir
    step = latest_step(directory)
    if step is None:
        raise CheckpointError(f"{directory}: no complete checkpoint to resume from")
    return f"resumes from checkpoint {step_dir(directory, step)}: step {step} of {config.run.steps}"
