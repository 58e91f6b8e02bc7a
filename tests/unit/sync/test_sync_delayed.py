"""Delayed gradients (geotrain.sync.delayed): every step's exchange overlapped with the next tau steps.

In-process: two replicas share a `Board` that stands in for the DP group (an exchange posts a copy of this
replica's gradients; landing takes the mean over both replicas' posts of that step, in replica order) and
records the order of posts and landings. A last test runs the factory's real StageExchange on a gloo
group of one rank against AdamW fed the same gradients one step late."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from geotrain.sync.base import ComputeTimer
from geotrain.runtime.sections import OptimSection
from geotrain.sync import (BETAS, WEIGHT_DECAY, DelayedPerStepSync, DPGroup, PerStepSync, SyncError, SyncOptions,
                           SyncResult, make_gradient_sync)

REPLICAS = 2


class Board:
    """The DP group of the in-process replicas (one thread each): posted gradients per step, a mean that
    waits until every replica posted (as a collective does), and the order of posts and landings."""

    def __init__(self) -> None:
        self.posted: dict[int, dict[int, list[torch.Tensor]]] = {}
        self.events: list[tuple[str, int, int]] = []
        self.ready = threading.Condition()

    def post(self, step: int, replica: int, grads: list[torch.Tensor]) -> None:
        with self.ready:
            self.posted.setdefault(step, {})[replica] = grads
            self.events.append(("start", replica, step))
            self.ready.notify_all()

    def mean(self, step: int) -> list[torch.Tensor]:
        with self.ready:
            assert self.ready.wait_for(lambda: len(self.posted.get(step, {})) == REPLICAS, timeout=10)
            posts = self.posted[step]
        return [sum(posts[r][i] for r in range(REPLICAS)) / REPLICAS for i in range(len(posts[0]))]


class BoardExchange:
    """A DPExchange of replica `replica` over `board` (blocking `exchange` or posted `start`); 8 bytes a post."""

    def __init__(self, params: list[torch.nn.Parameter], board: Board, replica: int) -> None:
        self.params, self.board, self.replica = params, board, replica

    def _post(self, step: int) -> None:
        self.board.post(step, self.replica, [p.grad.detach().clone() for p in self.params])

    def _write_mean(self, step: int) -> int:
        means = self.board.mean(step)
        with self.board.ready:
            self.board.events.append(("land", self.replica, step))
        for p, mean in zip(self.params, means, strict=True):
            p.grad = mean.clone()
        return 8

    def exchange(self, step, timer) -> int:
        self._post(step)
        return self._write_mean(step)

    def start(self, step, timer):
        self._post(step)
        return lambda landing_timer: self._write_mean(step)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        return None


def _replicas(delay: int | None, total_steps: int | None, optimizer: str = "sgd", clip: float | None = None):
    """Two replicas of one 4-value parameter; delay None: PerStepSync. Returns (params, syncs, board)."""
    board = Board()
    params, syncs = [], []
    for r in range(REPLICAS):
        param = torch.nn.Parameter(torch.zeros(4))
        opt = (torch.optim.SGD([param], lr=1.0) if optimizer == "sgd"
               else torch.optim.AdamW([param], lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY))
        exchange = BoardExchange([param], board, r)
        syncs.append(PerStepSync([param], exchange, opt, clip) if delay is None
                     else DelayedPerStepSync([param], exchange, opt, delay, total_steps, clip))
        params.append(param)
    return params, syncs, board


def _gradient(step: int, replica: int, param: torch.Tensor) -> torch.Tensor:
    """Weight-dependent and different per replica, so staleness and averaging both show."""
    generator = torch.Generator().manual_seed(1000 * step + replica)
    return torch.randn(4, generator=generator) + param.detach() * (replica + 1)


def _train(params, syncs, steps: int, first: int = 0) -> tuple[list[list[torch.Tensor]], list[list[SyncResult]]]:
    """Each replica in its own thread: per step (`first` to `steps` - 1) its gradient, then its sync. Returns
    the parameters after each step ([step][replica]; steps before `first` empty) and the sync results
    ([replica][step - first])."""
    after = [[torch.empty(0)] * len(params) for _ in range(steps)]
    results: list[list[SyncResult]] = [[] for _ in params]
    errors: list[BaseException] = []

    def replica(r: int) -> None:
        try:
            for step in range(first, steps):
                params[r].grad = _gradient(step, r, params[r])
                results[r].append(syncs[r].step(step, ComputeTimer()))
                after[step][r] = params[r].detach().clone()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(len(params))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    assert results[0] == results[1]  # every replica reports the same bytes and norms
    return after, results


def test_delay_0_is_per_step_sync_bit_for_bit():
    reference, _ = _train(*_replicas(None, 6, "adamw")[:2], 6)
    delayed, _ = _train(*_replicas(0, 6, "adamw")[:2], 6)
    for ref, got in zip(reference, delayed, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_delay_1_applies_the_mean_of_step_t_minus_1_at_step_t_and_lands_everything_at_the_end():
    steps = 5
    params, syncs, board = _replicas(1, steps)
    after, results = _train(params, syncs, steps)
    # each replica's order: post step t, then land step t-1; the last step lands t-1 and t
    for r in range(REPLICAS):
        assert [(kind, step) for kind, replica, step in board.events if replica == r] == [
            ("start", 0), ("start", 1), ("land", 0), ("start", 2), ("land", 1), ("start", 3), ("land", 2),
            ("start", 4), ("land", 3), ("land", 4)]
    # bytes are counted when an exchange lands: none at step 0, two at the last step
    assert [res.dp_bytes for res in results[0]] == [0, 8, 8, 8, 16]
    # SGD lr 1: the parameter moves by exactly the landed means, in their order
    expected = torch.zeros(4)
    assert torch.equal(after[0][0], expected)  # step 0: nothing has landed, no update
    for step in range(1, steps):
        expected = expected - board.mean(step - 1)[0]
        if step == steps - 1:
            expected = expected - board.mean(step)[0]
        assert torch.allclose(after[step][0], expected, atol=1e-6)
    assert all(sync.in_flight == 0 for sync in syncs)


@pytest.mark.parametrize("delay", [1, 2])
def test_replicas_stay_bit_identical_at_every_step_and_end_with_as_many_updates_as_ddp(delay):
    steps = 7
    params, syncs, _ = _replicas(delay, steps, "adamw")
    after, _ = _train(params, syncs, steps)
    assert all(torch.equal(a, b) for a, b in after)
    # AdamW counted one step per landed mean: as many as a blocking run (steps), none before the first lands
    for sync in syncs:
        assert sync.optimizer.state[sync.params[0]]["step"].item() == steps
    assert torch.equal(after[delay - 1][0], torch.zeros(4)) and not torch.equal(after[delay][0], torch.zeros(4))
    # the staleness changes the trajectory: a blocking run ends elsewhere
    blocking, _ = _train(*_replicas(None, steps, "adamw")[:2], steps)
    assert not torch.allclose(blocking[-1][0], after[-1][0], atol=1e-6)


def test_the_clip_acts_on_the_landed_mean_and_reports_its_norm():
    steps = 4
    params, syncs, board = _replicas(1, steps, clip=1e-3)
    _, results = _train(params, syncs, steps)
    norms = [res.grad_norm for res in results[0]]
    assert norms[0] is None  # nothing landed at step 0
    for step in range(1, steps):  # the last step reports the last landed mean's (its own step's)
        landed = step if step == steps - 1 else step - 1
        assert norms[step] == pytest.approx(float(board.mean(landed)[0].norm()), rel=1e-6)
        assert norms[step] > 1e-3  # so every update was clipped
    # each of the `steps` updates moved the parameter by a clipped mean (SGD lr 1): at most the clip each
    assert 0 < float(params[0].detach().norm()) <= steps * 1e-3 * (1 + 1e-6)


def test_a_checkpoint_is_refused_while_an_exchange_is_in_flight_and_taken_at_the_end():
    steps = 3
    params, syncs, _ = _replicas(1, steps)
    _train(params, syncs, steps - 1)
    with pytest.raises(SyncError, match=r"^state_dict with 1 gradient exchange\(s\) in flight \(delay 1\)"):
        syncs[0].state_dict()
    _train(params, syncs, steps, first=steps - 1)
    assert set(syncs[0].state_dict()) == {"optimizer", "exchange"}


def test_flush_lands_everything_in_flight_without_a_total_step_count():
    params, syncs, _ = _replicas(2, total_steps=None)
    _train(params, syncs, 3)
    assert syncs[0].in_flight == 2
    assert [sync.flush(2, ComputeTimer()).dp_bytes for sync in syncs] == [16, 16]
    assert syncs[0].in_flight == 0 and torch.equal(params[0], params[1])


@pytest.mark.parametrize("options, message", [
    ({"delay": 1, "optimizer": "onebit-adam", "onebit_warmup_steps": 2, "codec": "none"},
     "delay 1 (delayed gradients) steps AdamW on the landed mean; onebit-adam does its own exchange"),
    ({"delay": 1, "codec": "powersgd"}, "delay 1 overlaps the exchange, which only a codec of geotrain.codecs can"),
    ({"delay": 4}, "StreamingOptions.delay (steps between a gradient and its update) must be an integer in 0..3"),
    ({"delay": -1}, "must be an integer in 0..3 (below total_steps), got -1"),
    ({"delay": 1, "fragments": 2}, "are Streaming DiLoCo's: they need sync_every"),
])
def test_combinations_delayed_gradients_cannot_run_are_refused_in_one_line(options, message):
    with pytest.raises(SyncError) as info:
        SyncOptions.of(**{"codec": "int8-block", "optimizer": "adamw", "lr": 1e-2, "total_steps": 4, **options})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_optim_section_takes_sync_delay_without_sync_every_and_keeps_refusing_streaming_keys():
    assert OptimSection(sync_delay=2).sync_delay == 2
    with pytest.raises(Exception, match="optim.sync_mix is Streaming DiLoCo's: it needs optim.sync_every"):
        OptimSection(sync_delay=1, sync_mix=0.5)


class Transport:
    def collective(self, group, devices, nbytes, run, posted=False):
        return run()


def test_the_factory_runs_adamw_on_the_previous_steps_gradient_through_the_real_exchange(world_of_one):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference.load_state_dict(model.state_dict())
    steps = 5
    options = SyncOptions.of(codec="none", optimizer="adamw", lr=1e-2, total_steps=steps, error_feedback=False, delay=1)
    sync = make_gradient_sync(options, list(model.named_parameters()), Transport(),
                              DPGroup(dist.group.WORLD, (0,), (0,)))
    assert type(sync) is DelayedPerStepSync
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=BETAS, weight_decay=WEIGHT_DECAY)
    pending = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        model.zero_grad(set_to_none=True)
        model(torch.randn(5, 8)).square().mean().backward()
        pending.append([p.grad.clone() for p in model.parameters()])
        sync.step(step, ComputeTimer())
        while pending and (len(pending) > 1 or step == steps - 1):  # the reference: one step late, all at the end
            for p, g in zip(reference.parameters(), pending.pop(0), strict=True):
                p.grad = g
            optimizer.step()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(p, q)
    assert sync.in_flight == 0
