"""`train --run-dir`: which run directory a launch writes (geotrain.observe), said at start, finished at the end.

    config = open_run_dir(config, local)      # the default when not given; run.json written; path printed
    with watching(config): launch(...)        # trace.json + TensorBoard from the ranks' files, even on failure
    run_dir_json(config)                      # {"run_dir": path} for --json ({} without one)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from geotrain.observe.rundir import DEFAULT_ROOT, NO_RUN_DIR, default_run_dir, keep_runs, sweep_old_runs


def _with_run_dir(config: Any, run_dir: str | None) -> Any:
    return dataclasses.replace(config, run=dataclasses.replace(config.run, run_dir=run_dir))


def open_run_dir(config: Any, local: bool) -> Any:
    """The config with its run directory settled: 'none' -> None; not given -> DEFAULT_ROOT/<time>-<plan> (old
    default runs swept beyond keep_runs()); `local` False (torchrun, several hosts): none, with a note if one
    was asked for (each host would need its own). Prints the directory on stderr."""
    from geotrain.observe.run import start_run

    given = config.run.run_dir
    if given == NO_RUN_DIR:
        return _with_run_dir(config, None)
    if not local:
        if given is not None:
            print("geotrain: note: --run-dir is written by a local launch only (not under torchrun or --node): "
                  "no run directory", file=sys.stderr)
        return _with_run_dir(config, None)
    if given is None:
        removed = sweep_old_runs(DEFAULT_ROOT, keep_runs())
        if removed:
            print(f"geotrain: removed {len(removed)} old run director{'y' if len(removed) == 1 else 'ies'} under "
                  f"{DEFAULT_ROOT}/ (keeping the newest {keep_runs()}; GEOTRAIN_KEEP_RUNS)", file=sys.stderr)
        given = str(default_run_dir(config.plan_name))
    config = _with_run_dir(config, given)
    start_run(config)
    print(f"geotrain: run directory {given} (metrics, trace.json, tensorboard; read it with "
          f"`geotrain report {given}`)", file=sys.stderr)
    return config


@contextmanager
def watching(config: Any) -> Iterator[None]:
    """Finish the run directory (trace, TensorBoard) when the block ends, whether the run failed or not."""
    try:
        yield
    finally:
        if config.run.run_dir is not None:
            from geotrain.observe.run import finish_run

            try:
                finish_run(Path(config.run.run_dir), config)
            except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more than its trace
                print(f"geotrain: note: run directory {config.run.run_dir}: trace not written: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)


def run_dir_json(config: Any) -> dict[str, Any]:
    return {} if config.run.run_dir is None else {"run_dir": config.run.run_dir}
