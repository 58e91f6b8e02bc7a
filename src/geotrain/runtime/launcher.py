"""Launch S x R workers on this machine, watch them, and never leave one behind.

The launcher plays torchrun's agent: it hosts the rendezvous TCPStore on a free localhost port and
starts one process per rank (a forkserver that has already imported torch, so starts are cheap) with
the env:// variables set. It polls the processes; when one fails it gives the others a bounded grace
period to notice through their watchdogs and exit, then SIGKILLs whoever is left, joins them all, and
raises WorkerFailure naming the first failed rank, how it ended, its last completed step and the
error it reported (start-up errors included). Before any process starts, the checkpoint directory
is checked (writable; not another run's unless resuming or overwriting; a resumed checkpoint intact).
Every worker dies with the launcher (geotrain.procs.die_with_parent), even when it is SIGKILLed.
On several hosts (runtime/hosts.py) each host's launcher starts a subset of the ranks and meets the
others at an external rendezvous: the store lives on rank 0's host, which alone gets the report.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from geotrain.comm.launch import FORKSERVER_PRELOAD
from geotrain.errors import GeotrainError
from geotrain.procs import (LaunchResult, Supervisor, Target, WorkerFailure, forkserver_context,
                            set_process_name, torchrun_env)
from geotrain.runtime.checkpoint import (CheckpointError, latest_step, prepare_directory, read_manifest, step_dir,
                                         verify_shards)
from geotrain.runtime.checkpoint_lock import DirectoryLock, hold_directory
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.hosts import Rendezvous
from geotrain.runtime.replan import check_resume_identity
from geotrain.runtime.report import build_report

ProgressCallback = Callable[[int, int], None]
RECORDS = "records.json"


def _child(rank: int, config: RuntimeConfig, port: int, result_dir: str, tokens: Any,
           addr: str = "127.0.0.1", ranks: tuple[int, ...] | None = None) -> None:
    """Entry point of a launched worker process (one of `ranks`, all by default), started by the
    supervisor (so it dies with the launcher); an error of its own is written to `error-<rank>.txt`
    in `result_dir` so that the launcher's final line can name it."""
    ranks = tuple(range(config.world_size)) if ranks is None else ranks
    os.environ.update(torchrun_env(rank, config.world_size, addr, port, local_rank=ranks.index(rank),
                                   local_world_size=len(ranks), group_rank=None, base={}, single_thread=False,
                                   TORCHELASTIC_USE_AGENT_STORE="True"))
    set_process_name(f"geotrain-r{rank}")
    try:
        from geotrain.runtime.worker import run_worker

        records = run_worker(config, tokens)
    except Exception as exc:  # noqa: BLE001 - report it by name (start-up failures included)
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        line = first if isinstance(exc, GeotrainError) else f"{type(exc).__name__}: {first}"
        _write_text(Path(result_dir) / f"error-{rank}.txt", line)
        print(f"geotrain worker rank {rank}: error: {line}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(exc, GeotrainError) else 1)
    if records is not None:
        _write_text(Path(result_dir) / RECORDS, json.dumps(records))


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def check_resumable(config: RuntimeConfig) -> int:
    """The step a resumed run starts from; CheckpointError (before any process starts) if there is
    no complete checkpoint, it belongs to a different run (a re-plan with the same S and global batch is
    this run: runtime/replan.py), or a shard differs from its manifest."""
    assert config.checkpoint.checkpoint_dir is not None
    step = latest_step(config.checkpoint.checkpoint_dir)
    if step is None:
        raise CheckpointError(f"{config.checkpoint.checkpoint_dir}: no complete checkpoint to resume from")
    manifest = read_manifest(config.checkpoint.checkpoint_dir, step)
    check_resume_identity(manifest, config.identity(), str(step_dir(config.checkpoint.checkpoint_dir, step)))
    verify_shards(config.checkpoint.checkpoint_dir, step, manifest)
    return step


def check_before_launch(config: RuntimeConfig, clear: bool = True) -> DirectoryLock | nullcontext[None]:
    """Everything about the checkpoint directory that can fail, checked before any worker starts:
    held by no other run (`clear`: this process takes its lock, held until the returned context
    exits, and removes partial files of interrupted checkpoints, saying so on stderr), writable,
    not another run's unless resuming or overwriting (`clear`: remove the old steps), and a resumed
    checkpoint complete, of this run and intact."""
    if config.checkpoint.checkpoint_dir is None:
        return nullcontext()
    held: DirectoryLock | nullcontext[None] = nullcontext()
    if clear:  # one host (rank 0's) holds a shared directory
        held = hold_directory(config.checkpoint.checkpoint_dir)
        if held.removed:
            print(f"geotrain: note: removed {len(held.removed)} partial checkpoint file(s) of an interrupted run "
                  f"in {config.checkpoint.checkpoint_dir}: {', '.join(held.removed[:3])}{', ...' if len(held.removed) > 3 else ''}",
                  file=sys.stderr)
    try:
        prepare_directory(config.checkpoint.checkpoint_dir, config.checkpoint.resume, config.checkpoint.overwrite, clear)
        if config.checkpoint.resume:
            check_resumable(config)
    except BaseException:
        held.__exit__(None, None, None)
        raise
    return held


def _store_read(store: Any, key: str) -> str | None:
    try:
        return store.get(key).decode() if store.check([key]) else None
    except Exception:  # noqa: BLE001 - diagnostics only
        return None


def _read_error(result_dir: Path, rank: int) -> str | None:
    """The error line rank `rank` wrote before exiting, if any."""
    try:
        return (result_dir / f"error-{rank}.txt").read_text().strip() or None
    except OSError:
        return None


def _completed_steps(store: Any, rank: int) -> int:
    value = _store_read(store, f"step/{rank}")
    return int(value) if value else 0


def launch(config: RuntimeConfig, progress: ProgressCallback | None = None, poll_s: float = 0.05,
           tokens: Any = None, rendezvous: Rendezvous | None = None,
           on_start: Callable[[], None] | None = None) -> LaunchResult:
    """Run `config` to the end on this machine; raises WorkerFailure if any worker fails.

    `tokens`: the WorldTokens of world `config.data.data_seed` (built here if None and no --data), handed
    to the workers so that they do not all build the world at once. `rendezvous`: run only this host's
    ranks and meet the other hosts there (None: every rank here, a store on a free localhost port).
    The checkpoint directory is held (locked) for the run's life. `on_start`: called once the checks have
    passed, before any worker starts (the CLI opens the run directory there)."""
    with check_before_launch(config, clear=rendezvous is None or rendezvous.is_host):  # one host clears a shared dir
        if on_start is not None:
            on_start()
        return _launch_checked(config, progress, poll_s, tokens, rendezvous)


def _launch_checked(config: RuntimeConfig, progress: ProgressCallback | None, poll_s: float, tokens: Any,
                    rendezvous: Rendezvous | None) -> LaunchResult:
    started = time.perf_counter()
    if rendezvous is None:
        store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
        ranks, addr = tuple(range(config.world_size)), "127.0.0.1"
    else:  # met (or failed to) before any process starts
        store = rendezvous.open_store()
        ranks, addr = rendezvous.hosts.node(rendezvous.node).ranks, rendezvous.addr
    # Workers are forks of a server that has imported torch (and its lazily imported optimizer
    # machinery) once; started now, so it imports while the tokens are built.
    context = forkserver_context(FORKSERVER_PRELOAD)
    if tokens is None and config.data.data is None:  # built while the fork server imports torch
        from geotrain.data import world_tokens

        tokens = world_tokens(config.data.data_seed)
    prefixed = dist.PrefixStore("geotrain/0/", store)
    with tempfile.TemporaryDirectory(prefix="geotrain-run-") as tmp:
        specs = [Target(context, _child, (rank, config, store.port, tmp, tokens, addr, ranks), f"geotrain-rank-{rank}")
                 for rank in ranks]
        # Peers notice a lost rank within one heartbeat timeout plus a check interval; allow a few more. A rank
        # killed by a signal is the culprit already (its peers could only say they lost it): they stop at once,
        # without waiting out their heartbeat timeout (a --chaos kill's restart starts sooner).
        grace_s = config.reliability.heartbeat_timeout_s + 4 * config.reliability.heartbeat_interval_s + 2.0
        with Supervisor(specs, grace_s=grace_s, term_s=0.0, poll_s=poll_s, cleanup_paths=[Path(tmp)],
                        signal_grace_s=0.0) as supervisor:
            verdict = supervisor.wait(_progress_reporter(ranks, prefixed, config, progress))
        if not verdict.ok:
            culprit = verdict.culprit()
            rank, how = (ranks[culprit[0]], culprit[1]) if culprit else (ranks[0], verdict.message)
            abort = _store_read(prefixed, "abort")
            own = _read_error(Path(tmp), rank)
            message = (f"{config.layout.describe(rank, config.cluster.device_names)} {how} "
                       f"after {_completed_steps(prefixed, rank)} completed steps")
            if own:
                message += f": {own}"
            if abort and not (own and own in abort):
                message += f"; workers reported: {abort}"
            raise WorkerFailure(message)
        if rendezvous is not None:
            rendezvous.finish(store)
        report = build_report(config, json.loads((Path(tmp) / RECORDS).read_text())) if 0 in ranks else None
    return LaunchResult(verdict, report, time.perf_counter() - started)


def _progress_reporter(ranks: tuple[int, ...], store: Any, config: RuntimeConfig,
                       progress: ProgressCallback | None) -> Callable[[], None] | None:
    """A supervisor tick that reports the least completed step of `ranks` whenever it changes."""
    if progress is None:
        return None
    last = [-1]

    def tick() -> None:
        done = min(_completed_steps(store, rank) for rank in ranks)
        if done != last[0]:
            progress(done, config.run.steps)
            last[0] = done
    return tick
