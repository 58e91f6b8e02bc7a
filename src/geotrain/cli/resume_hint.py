"""What `geotrain train` says about its checkpoints when it is interrupted and when it resumes.

A Ctrl-C of a run with --checkpoint-dir ends with the last complete checkpoint and the command that
continues from it: the words the user typed, with --resume (and without --overwrite, which would delete
the checkpoints), as one line for the shell. A resumed run names the checkpoint and step it starts from.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from geotrain.runtime.checkpoint import CheckpointError, latest_step, step_dir

PROGRAM = "geotrain"


def resume_command(words: Sequence[str]) -> str:
    """`geotrain WORDS` with --resume added (once) and --overwrite dropped, quoted for a POSIX shell."""
    kept = [word for word in words if word != "--overwrite"]
    if "--resume" not in kept:
        kept.append("--resume")
    return shlex.join([PROGRAM, *kept])


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
            f"geotrain: resume with: {resume_command(words)}"]


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
