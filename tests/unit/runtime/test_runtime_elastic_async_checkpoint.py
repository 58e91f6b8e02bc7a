"""Checkpoints of an elastic asynchronous run (runtime/elastic/async_checkpoint.py), without a launch: the global
model's host writes each due step once, at the update that reaches its count; an elected host skips what its
predecessor wrote; `--resume` takes up the model, its counts and the outer momentum; `--stop-after` lowers the
launch's budget to its step's count."""

from __future__ import annotations

import torch
from torch.distributed import HashStore

from geotrain.cluster import load_cluster
from geotrain.optim.delayed_nesterov import DelayedNesterov
from geotrain.runtime import RuntimeConfig
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.elastic.async_checkpoint import CHECKPOINTED_KEY, ServerCheckpoints, launch_budget, load_resumed
from geotrain.sync.async_server import OuterServer, Request
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))
ASYNC = {"elastic": True, "time_scale": 0.0, "sync_every": 3, "outer_sync": "async", "steps": 30}


def _update(server: OuterServer, write, times: int) -> None:
    for _ in range(times):
        client = server.updates % 2
        server.submit(Request(client, server.base[client], torch.ones(6)))
        write(server.updates)


def test_the_host_writes_each_due_step_once_at_its_count_and_a_resume_takes_it_up(tmp_path):
    """R = 2, H = 3, --checkpoint-every 6 of 30 steps: steps 6, 12, 18, 24 at 4, 8, 12, 16 outer gradients."""
    config = RuntimeConfig.of(CLUSTER, [[0, 1]], **ASYNC, checkpoint_dir=str(tmp_path), checkpoint_every=6)
    store, module = HashStore(), torch.nn.Linear(2, 2)  # 6 values, as the server's flat model
    checkpoints = ServerCheckpoints(config, 0, module, [0, 1], 0, 30, ())
    assert checkpoints.points == [(4, 6), (8, 12), (12, 18), (16, 24)]
    server = OuterServer(torch.zeros(6), DelayedNesterov(1, 0.7, 0.9, 0.0), [0, 1], 8)
    _update(server, checkpoints.writer(store, server), 9)
    assert [step for step, _ in checkpoints.take_events()] == [6, 12] and checkpoints.take_events() == []
    assert ckpt.latest_step(tmp_path) == 12 and store.get(CHECKPOINTED_KEY) == b"12"
    # an elected host from an older copy (7 updates) skips step 12, written already, and writes 18 at 12
    elected = OuterServer(torch.zeros(6), DelayedNesterov(1, 0.7, 0.9, 0.0), [0, 1], 8)
    elected.start_from(7, 7, {0: 4, 1: 3}, {0: 7, 1: 7})
    _update(elected, checkpoints.writer(store, elected), 5)
    assert [step for step, _ in checkpoints.take_events()] == [18] and ckpt.latest_step(tmp_path) == 18
    resumed = load_resumed(RuntimeConfig.of(CLUSTER, [[0, 1]], **ASYNC, checkpoint_dir=str(tmp_path), resume=True))
    assert resumed.step == 18 and resumed.held is not None and resumed.optimizer is not None
    assert (resumed.held.version, resumed.held.updates) == (12, 12)
    torch.testing.assert_close(resumed.held.model, elected.model)
    torch.testing.assert_close(resumed.optimizer["momentum_buffer"], elected.optimizer.momentum_buffer)


def test_stop_after_lowers_the_launchs_budget_to_its_steps_count():
    assert launch_budget(RuntimeConfig.of(CLUSTER, [[0, 1]], **ASYNC), 0) == (30, 20)
    assert launch_budget(RuntimeConfig.of(CLUSTER, [[0, 1]], **ASYNC, stop_after=12), 0) == (12, 8)
    assert launch_budget(RuntimeConfig.of(CLUSTER, [[0, 1]], **ASYNC, stop_after=7), 18) == (25, 17)
    assert launch_budget(RuntimeConfig.of(CLUSTER, [[0, 1]], **ASYNC, stop_after=40), 18) == (30, 20)
