"""TensorBoard scalars of a run directory, written from its metrics lines (after the run, or on demand by
`geotrain report --tensorboard`): one event file under <run dir>/tensorboard/.

Tags, with the training step as the step: `rank<r>/<metric>` for every rank (its own steps) and
`site/<name>/<metric>` per site (the mean over the site's ranks of that step of the run's progress: where ranks
take different numbers of steps, adaptive or asynchronous, a fast rank's steps 8 and 9 and a slow rank's step 2
can be the run's step 4, and a site's mean by step index would mix the run's step 4 with its step 14), for the
metrics of SCALARS. Needs the `tensorboard`
package (the extra `geotrain[tensorboard]`); without it `write_scalars` raises TensorBoardMissing.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geotrain.errors import GeotrainError

TENSORBOARD_DIR = "tensorboard"
SCALARS = ("loss", "lr", "step_s", "compute_s", "comm_s", "wait_s", "bytes_intra", "bytes_inter", "grad_norm")


class TensorBoardMissing(GeotrainError, ImportError):
    """The tensorboard package is not installed."""


def site_means(steps: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    """{(site, step of the run's progress): {metric: mean over the site's ranks' steps there}} of the SCALARS
    present (not None); a line without `progress_step` (an elastic group's) by its own step."""
    values: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in steps:
        progress = s.get("progress_step")
        for key in SCALARS:
            if s.get(key) is not None:
                values[(s["site"], int(s["step"] if progress is None else progress))][key].append(float(s[key]))
    return {where: {k: sum(v) / len(v) for k, v in by_key.items()} for where, by_key in values.items()}


class TensorBoardUnwritable(GeotrainError, OSError):
    """The run directory's tensorboard folder cannot be made or written."""


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise TensorBoardMissing("TensorBoard files need the tensorboard package: pip install "
                                 "'geotrain[tensorboard]'") from exc
    return SummaryWriter


def check_writable(run_dir: Path | str) -> Path:
    """Before any work: the package is there (TensorBoardMissing) and run_dir/tensorboard can be made and
    written (TensorBoardUnwritable: a read-only run directory, a file in the folder's place); the folder."""
    _summary_writer()
    folder = Path(run_dir) / TENSORBOARD_DIR
    probe = folder / f".geotrain-write-test-{os.getpid()}"
    try:
        folder.mkdir(exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        probe.unlink()
    except OSError as exc:
        why = "is not a directory" if isinstance(exc, (FileExistsError, NotADirectoryError)) else exc.strerror
        raise TensorBoardUnwritable(f"{folder}: cannot write TensorBoard files there: {why or exc}") from None
    return folder


EVENT_FILES = "events.out.tfevents.*"


def write_scalars(run_dir: Path | str, steps: Sequence[dict[str, Any]]) -> Path:
    """Write the scalars of `steps` (metrics step records, as geotrain.observe.lines reads them) under
    run_dir/tensorboard, in place of the event files there (TensorBoard reads every file of a folder: a rewrite
    beside the old ones would show each point twice); returns that folder. TensorBoardUnwritable where the files
    cannot be written (the old ones are then kept)."""
    summary_writer = _summary_writer()
    folder = Path(run_dir) / TENSORBOARD_DIR
    old = {path: path.stat().st_mtime_ns for path in folder.glob(EVENT_FILES)} if folder.is_dir() else {}
    try:
        _write(summary_writer(log_dir=str(folder)), steps)
        for path, written in old.items():  # (a name the new file took again has a newer time: kept)
            if path.exists() and path.stat().st_mtime_ns == written:
                path.unlink()
    except OSError as exc:
        raise TensorBoardUnwritable(f"{folder}: cannot write TensorBoard files there: {exc.strerror or exc}") from None
    return folder


def _write(writer: Any, steps: Sequence[dict[str, Any]]) -> None:
    try:
        for s in sorted(steps, key=lambda s: (s["step"], s["rank"])):
            for key in SCALARS:
                if s.get(key) is not None:
                    writer.add_scalar(f"rank{s['rank']}/{key}", float(s[key]), s["step"], walltime=s["t_wall"])
        for (site, step), means in sorted(site_means(steps).items(), key=lambda item: (item[0][1], item[0][0])):
            for key, value in means.items():
                writer.add_scalar(f"site/{site}/{key}", value, step)
    finally:
        writer.close()
