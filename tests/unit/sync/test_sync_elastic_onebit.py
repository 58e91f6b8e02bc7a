"""geotrain.sync.elastic_onebit in process: 1-bit Adam's exchange on a torchft quorum (a fake Manager and a process
group of one member). A try that does not commit leaves the optimizer as it was (the retry steps it as a clean try
does, bit for bit); the state handed on holds the shared part and zero residuals; a quorum that changes size keeps
what the live groups had not yet delivered (the reducer relaid: OneBitMomentumReducer.relaid)."""

from __future__ import annotations

import pytest
import torch

from geotrain.comm import OneBitMomentumReducer, SimulatedCollective
from geotrain.optim import OneBitAdam
from geotrain.sync.base import ComputeTimer
from geotrain.sync.elastic import ManagerExchange
from geotrain.sync.elastic_onebit import ElasticOneBitSync
from fake_torchft import Done, FakeManager

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors: bit-reproducible
SHAPES = [(6, 5), (40,), (3,)]


class _AlonePG:
    """torchft's process group with this group alone in the quorum; its first `failures` collectives fail."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures

    def _done(self) -> Done:
        self.failures -= 1
        return Done(self.failures >= 0)

    def allreduce(self, tensors, opts):
        return self._done()

    def allgather(self, outputs, inputs, opts):
        outputs[0][0].copy_(inputs[0])
        return self._done()


def _sync(pg: _AlonePG) -> tuple[ElasticOneBitSync, list[torch.nn.Parameter], FakeManager]:
    params = [torch.nn.Parameter(torch.full(shape, 0.5)) for shape in SHAPES]
    manager = FakeManager()
    exchange = ManagerExchange(params, manager, healed=lambda: False, pg=pg, start_quorum=manager.start_quorum)
    return ElasticOneBitSync(params, OneBitAdam(params, lr=0.01, warmup_steps=1), exchange), params, manager


def _train(sync: ElasticOneBitSync, params: list[torch.nn.Parameter], steps: range) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        sync.step(step, ComputeTimer())


def test_a_try_that_does_not_commit_leaves_the_optimizer_and_the_retry_steps_as_a_clean_try():
    clean, clean_params, _ = _sync(_AlonePG())
    pg = _AlonePG()
    failing, failing_params, manager = _sync(pg)
    _train(clean, clean_params, range(4))
    _train(failing, failing_params, range(2))  # warm-up, then one 1-bit step
    pg.failures = 1  # step 2's first try (1-bit: its all-gather) fails, then a new quorum commits it
    _train(failing, failing_params, range(2, 4))
    assert manager.quorums == 1 and failing.exchange.failed_quorums == 1
    assert clean.optimizer.step_count == failing.optimizer.step_count == 4
    for a, b in ((clean_params, failing_params), ([clean.optimizer.exp_avg, *clean.optimizer.worker_errors],
                                                  [failing.optimizer.exp_avg, *failing.optimizer.worker_errors])):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert float(clean.optimizer.worker_errors[0].abs().max()) > 0  # 1-bit left something behind


def test_the_state_handed_on_holds_the_shared_part_and_zero_residuals():
    sync, params, _ = _sync(_AlonePG())
    _train(sync, params, range(3))
    state = sync.state_dict()["optimizer"]["onebit"]
    assert state["step_count"] == 3 and torch.equal(state["exp_avg"], sync.optimizer.exp_avg)
    assert torch.equal(state["exp_avg_sq"], sync.optimizer.exp_avg_sq)
    assert all(float(e.abs().max()) == 0 for e in [*state["worker_errors"], *state["server_errors"]])
    peer, peer_params, _ = _sync(_AlonePG())
    peer.load_state_dict(sync.state_dict())
    assert peer.optimizer.step_count == 3 and torch.equal(peer.optimizer.exp_avg, sync.optimizer.exp_avg)
    assert peer.laid == (1, 0) and float(peer.optimizer.worker_errors[0].abs().max()) == 0


def _owed(reducer: OneBitMomentumReducer, rank: int, numel: int) -> torch.Tensor:
    """What worker `rank`'s residuals still owe the mean: its worker residual / p and its chunk's server residual."""
    layout = reducer.layout
    owed = reducer.worker_errors[0] / layout.world_size
    owed[rank * layout.chunk_numel:(rank + 1) * layout.chunk_numel] += reducer.server_errors[0]
    return owed[:numel]


def _undelivered(reducers: list[OneBitMomentumReducer], numel: int) -> torch.Tensor:
    return sum(_owed(reducer, rank, numel) for rank, reducer in enumerate(reducers))


def _run(reducers: list[OneBitMomentumReducer], steps: int, generator: torch.Generator, numel: int):
    """`steps` 1-bit averages of random vectors on one reducer per worker: (sum delivered, sum of the true means)."""
    p = len(reducers)
    joint = OneBitMomentumReducer([numel], p, p)
    joint.worker_errors = [r.worker_errors[0] for r in reducers]
    joint.server_errors = [r.server_errors[0] for r in reducers]
    sent, true = torch.zeros(numel), torch.zeros(numel)
    for _ in range(steps):
        vectors = [torch.randn(numel, generator=generator) * 0.01 for _ in range(p)]
        averaged, residuals = joint.average(vectors, SimulatedCollective(p))
        joint.commit(residuals)
        sent += averaged
        true += sum(vectors) / p
    for rank, reducer in enumerate(reducers):
        reducer.worker_errors, reducer.server_errors = [joint.worker_errors[rank]], [joint.server_errors[rank]]
    return sent, true


def test_a_quorum_that_shrinks_keeps_what_the_live_groups_had_not_delivered():
    numel, generator = 203, torch.Generator().manual_seed(7)
    three = [OneBitMomentumReducer([numel], 3) for _ in range(3)]
    sent, true = _run(three, 6, generator, numel)
    assert torch.allclose(sent + _undelivered(three, numel), true, atol=1e-5)  # error feedback's ledger
    lost = _owed(three[1], 1, numel)  # group 1 dies: what it owed goes with it
    two = [three[0].relaid(2, 0, [numel]), three[2].relaid(2, 2, [numel])]  # groups 0 and 2: quorum ranks 0, 1
    assert all(float(r.server_errors[0].abs().max()) == 0 for r in two)
    assert torch.allclose(_undelivered(two, numel), _undelivered(three, numel) - lost, atol=1e-6)
    more_sent, more_true = _run(two, 6, generator, numel)
    # everything the live groups were owed is delivered (or still owed): only group 1's own part is gone
    assert torch.allclose(sent + more_sent + _undelivered(two, numel), true + more_true - lost, atol=1e-5)
    assert float(lost.abs().max()) > 1e-3  # (a part worth keeping: not zero)
