"""`train --run-dir`: which run directory a launch writes (geotrain.observe), said at start, finished at the end.

    config, held = settle_run_dir(config, local)   # the path (the default made, locked by `held`), checked
    launch(config, on_start=lambda: open_run_dir(config))   # once the launch's own checks pass: old default runs
                                              # swept, run.json written, the path printed on stderr
    with watching(config): launch(...)        # trace.json + TensorBoard from the ranks' files, even on failure
    run_dir_json(config)                      # {"run_dir": path} for --json ({} without one)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from geotrain.observe.rundir import (CREATED_MARKER, DEFAULT_ROOT, NO_RUN_DIR, RUN_MARKER, RunDirError, RunLock,
                                     check_run_dir, default_run_dir, keep_runs, sweep_old_runs)


def add_bench_run_dir(parser: Any) -> None:
    """A bench's --run-dir: one run directory per row under DIR (geotrain.observe.run.row_run_dir)."""
    parser.add_argument("--run-dir", default=None, metavar="DIR", type=_bench_directory,
                        help="write each row's run directory (per-rank metrics, trace.json, TensorBoard; read one with "
                             f"`geotrain report DIR/<row>`) under DIR, named by the row ('{NO_RUN_DIR}', the default: "
                             "none, as train's --run-dir none)")


def _bench_directory(text: str) -> str | None:
    """A bench's --run-dir: None for 'none' (no run directory, as `train --run-dir none`), else a directory path."""
    return None if text == NO_RUN_DIR else _directory_text(text)


def _directory_text(text: str) -> str:
    """A directory path that is not empty text (an unset shell variable would mean the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset variable?): name a directory")
    return text


def _with_run_dir(config: Any, run_dir: str | None) -> Any:
    return dataclasses.replace(config, run=dataclasses.replace(config.run, run_dir=run_dir))


def settle_run_dir(config: Any, local: bool, default: bool = True) -> tuple[Any, RunLock | None]:
    """The config with its run directory settled, and the lock of a default one (hold it for the launch's life:
    retention elsewhere leaves the directory alone while it is held). 'none' -> None; not given ->
    DEFAULT_ROOT/<time>-<plan> made here (`default` False: None; elastic runs write one only when asked, their
    launcher checks come later), or None with a one-line note where it cannot be made (a read-only working
    directory, a file named geotrain-runs); `local` False (torchrun, several hosts): none, with a note if one
    was asked for (each host would need its own). An empty path, or a directory that already holds a run's
    metrics, is refused here, before anything starts."""
    given = config.run.run_dir
    if given == NO_RUN_DIR:
        return _with_run_dir(config, None), None
    if given is not None:
        check_run_dir(given)  # an empty path is refused on any launch, local or not
    if not local:
        if given is not None:
            print("geotrain: note: --run-dir is written by a local launch only (not under torchrun or --node): "
                  "no run directory", file=sys.stderr)
        return _with_run_dir(config, None), None
    if given is not None:
        return config, None
    if not default:
        return config, None
    keep_runs()  # a bad GEOTRAIN_KEEP_RUNS is refused before anything is made
    try:
        held = default_run_dir(config.plan_name)
    except RunDirError as exc:
        print(f"geotrain: note: no run directory: {exc} (name one with --run-dir DIR, or --run-dir none)",
              file=sys.stderr)
        return _with_run_dir(config, None), None
    return _with_run_dir(config, str(held.path)), held


def open_run_dir(config: Any) -> None:
    """Make config.run.run_dir with its run.json and say so on stderr; for a default run directory, first remove
    the oldest finished default ones beside it beyond keep_runs() (geotrain.observe.rundir)."""
    from geotrain.observe.run import start_run

    run_dir = config.run.run_dir
    if run_dir is None:
        return
    if (Path(run_dir) / CREATED_MARKER).is_file():  # a default run directory, made and locked by settle_run_dir
        keep = keep_runs()
        removed = sweep_old_runs(Path(run_dir).parent, keep)
        if removed:
            print(f"geotrain: removed {len(removed)} old run director{'y' if len(removed) == 1 else 'ies'} under "
                  f"{Path(run_dir).parent}/ (keeping the newest {keep}, running ones always; GEOTRAIN_KEEP_RUNS)",
                  file=sys.stderr)
    start_run(config)
    print(f"geotrain: run directory {run_dir} (metrics, trace.json, tensorboard; read it with "
          f"`geotrain report {run_dir}`)", file=sys.stderr)


@contextmanager
def watching(config: Any) -> Iterator[None]:
    """Finish the run directory (trace, TensorBoard) when the block ends, whether the run failed or not
    (nothing when the launch stopped before opening it)."""
    try:
        yield
    finally:
        if config.run.run_dir is not None:
            _finish(Path(config.run.run_dir), config)


def _finish(run_dir: Path, config: Any) -> None:
    if not (run_dir / RUN_MARKER).is_file():
        if run_dir.parent == Path(DEFAULT_ROOT):
            with contextlib.suppress(OSError):  # the empty default directory of a launch that never started
                if [p.name for p in run_dir.iterdir()] == [CREATED_MARKER]:
                    (run_dir / CREATED_MARKER).unlink()
                    run_dir.rmdir()
        return
    from geotrain.observe.run import finish_run

    try:
        done = finish_run(run_dir, config)
        if done["skipped_lines"] or done["notes"]:
            print(f"geotrain: note: run directory {run_dir}: {done['skipped_lines']} unreadable metrics lines "
                  f"skipped ({'; '.join(done['notes'][:3])})", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more than its trace
        print(f"geotrain: note: run directory {run_dir}: trace not written: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def run_dir_json(config: Any) -> dict[str, Any]:
    return {} if config.run.run_dir is None else {"run_dir": config.run.run_dir}
