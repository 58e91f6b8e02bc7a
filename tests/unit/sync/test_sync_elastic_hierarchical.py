"""geotrain.sync.elastic's hierarchical exchange (--elastic --dp-hierarchical), in process: each member of a
torchft quorum is a thread with its own ManagerExchange, a fake Manager and a fake process group whose
point-to-point messages go through shared queues (what torchft's flat group carries). Every member gets the same
bits, the mean over the contributors up to fp32 summation order, only the owners' payloads (and their regions'
weights) cross regions, and the error-feedback residuals follow the shards' owners when the quorum changes:
nothing is lost or delivered twice."""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from geotrain.codecs import get_codec
from geotrain.comm.hierarchical import HierarchicalGroups, expected_link_bytes
from geotrain.sync.base import ComputeTimer
from geotrain.sync.elastic import ManagerExchange
from geotrain.sync.elastic_hierarchical import quorum_regions
from fake_torchft import Done, FakeManager

SHAPES = [(6, 5), (7,)]
NUMEL = sum(torch.Size(s).numel() for s in SHAPES)
REGION = {0: 0, 1: 0, 2: 1, 3: 1, 4: 0}  # replica group -> region


class _Received:
    def __init__(self, box: queue.Queue, tensor: torch.Tensor) -> None:
        self.box, self.tensor = box, tensor

    def wait(self) -> None:
        self.tensor.copy_(self.box.get(timeout=20))


class _Mail:
    """The quorum's flat group: one queue per (sender, receiver, tag)."""

    def __init__(self) -> None:
        self.boxes: dict[tuple[int, int, int], queue.Queue] = {}
        self.lock = threading.Lock()

    def box(self, key: tuple[int, int, int]) -> queue.Queue:
        with self.lock:
            return self.boxes.setdefault(key, queue.Queue())


class _PG:
    def __init__(self, mail: _Mail, rank: int, groups: tuple[int, ...]) -> None:
        self.mail, self.rank, self._global_ranks = mail, rank, list(groups)  # torchft's configure sets these

    def send(self, tensors, dst, tag):
        self.mail.box((self.rank, dst, tag)).put(tensors[0].clone())
        return Done()

    def recv(self, tensors, src, tag):
        return _Received(self.mail.box((src, self.rank, tag)), tensors[0])


def _exchanges(groups, codec: str) -> dict[int, ManagerExchange]:
    params = {g: [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES] for g in groups}
    return {g: ManagerExchange(params[g], None, lambda: False, start_quorum=lambda: None, codec=codec,
                               hierarchy=REGION.__getitem__) for g in groups}


def _sync(exchanges: dict[int, ManagerExchange], quorum: tuple[int, ...], grads: dict[int, list[torch.Tensor]],
          step: int, weights: dict[int, float] | None = None,
          refused_commits: int = 0) -> dict[int, list[torch.Tensor]]:
    """One exchange of the groups of `quorum` (quorum rank order), each in its thread: every group's mean
    (`refused_commits`: tries whose commit the quorum refuses first, each retried)."""
    mail = _Mail()
    means, errors = {}, []

    def member(rank: int, group: int) -> None:
        try:
            exchange = exchanges[group]
            exchange.manager, exchange.pg = FakeManager(len(quorum), rank, refused_commits), _PG(mail, rank, quorum)
            exchange.weight = 1.0 if weights is None else weights[group]
            for p, g in zip(exchange.params, grads[group], strict=True):
                p.grad = g.clone()
            exchange.exchange(step, ComputeTimer())
            means[group] = [p.grad.clone() for p in exchange.params]
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(rank, group)) for rank, group in enumerate(quorum)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return means


def _grads(groups, seed: int) -> dict[int, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return {g: [torch.randn(s, generator=generator) for s in SHAPES] for g in groups}


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def test_every_member_gets_the_fp32_mean_of_the_contributors_and_only_owners_payloads_cross_regions():
    quorum = (0, 2, 1, 3)  # quorum ranks 0 and 2 in region 0, 1 and 3 in region 1
    exchanges = _exchanges(quorum, "none")
    grads = _grads(quorum, 0)
    weights = {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}  # group 3 healed into this quorum: left out
    means = _sync(exchanges, quorum, grads, 1, weights)
    first = _flat(means[0])
    assert all(torch.equal(_flat(means[g]), first) for g in quorum)  # fixed summation orders: the same bits
    exact = sum(_flat(grads[g]).double() for g in (0, 1, 2)) / 3
    # fp32: four partial sums of values |x| < 5 and two divisions, each within half an ulp of 12
    assert float((first.double() - exact).abs().max()) <= 8 * 12 * 2 ** -24
    assert all(exchanges[g].contributors == 3.0 for g in quorum)
    regions = quorum_regions(quorum, REGION.__getitem__)
    assert regions.members == ((0, 2), (1, 3))
    plan = HierarchicalGroups.plan(regions)
    for rank, group in enumerate(quorum):  # the non-elastic reducer's inter-region bytes, and 4 bytes of weight
        expected = expected_link_bytes(get_codec("none"), plan, rank, NUMEL, segments=[30, 7])
        owned = len(regions.owned_shards(rank))
        assert exchanges[group].inter_region_bytes == expected.inter_bytes + 4 * owned


def test_residuals_follow_the_owners_when_the_quorum_changes_and_nothing_is_lost_or_sent_twice():
    """int8-block with error feedback over three quorums whose shard owners differ ((0, 1, 2): group 2 owns both
    shards of region 1; then group 3 joins it and owns one): what was delivered plus what the residuals still
    hold is what was sent."""
    exchanges = _exchanges((0, 1, 2, 3), "int8-block")
    delivered, sent = torch.zeros(NUMEL, dtype=torch.float64), torch.zeros(NUMEL, dtype=torch.float64)
    for step, quorum in enumerate([(0, 1, 2), (0, 1, 2), (0, 1, 2, 3), (3, 0, 2, 1)]):
        grads = _grads(quorum, step)
        means = _sync(exchanges, quorum, grads, step)
        delivered += _flat(means[quorum[0]]).double()
        sent += sum(_flat(grads[g]).double() for g in quorum) / len(quorum)
    held = sum(ex.reducer.residuals[0]["carry"].double() for ex in exchanges.values() if ex.reducer.residuals[0])
    assert float((sent - delivered).abs().max()) > 1e-3  # the codec's error is real ...
    assert float((sent - delivered - held).abs().max()) < 1e-5  # ... and every bit of it is still held once


def test_a_try_that_does_not_commit_leaves_the_residuals_and_the_retry_delivers_the_same_bits():
    quorum = (0, 1, 2)
    once, retried = _exchanges(quorum, "int8-block"), _exchanges(quorum, "int8-block")
    for step in range(2):
        grads = _grads(quorum, step)
        expected = _sync(once, quorum, grads, step)
        means = _sync(retried, quorum, grads, step, refused_commits=1)
        assert all(torch.equal(_flat(means[g]), _flat(expected[g])) for g in quorum)
    assert all(retried[g].failed_quorums == 2 for g in quorum)
    assert all(torch.equal(retried[g].reducer.residuals[0]["carry"], once[g].reducer.residuals[0]["carry"])
               for g in quorum)


def test_a_loaded_state_starts_a_group_from_zero_residuals():
    exchanges = _exchanges((0, 2), "int8-block")
    _sync(exchanges, (0, 2), _grads((0, 2), 0), 0)
    assert exchanges[0].reducer.residuals[0]
    exchanges[0].load_state_dict({})
    assert exchanges[0].reducer.residuals == [{}]


@pytest.mark.parametrize("groups", [(0, 1), (4, 0, 1)])
def test_a_quorum_in_one_region_averages_inside_it_without_a_codec(groups):
    exchanges = _exchanges(groups, "int8-block")
    grads = _grads(groups, 3)
    means = _sync(exchanges, groups, grads, 0)
    exact = sum(_flat(grads[g]).double() for g in groups) / len(groups)
    assert float((_flat(means[groups[0]]).double() - exact).abs().max()) < 1e-5  # no int8 error: one region
    assert all(ex.inter_region_bytes == 0 for ex in exchanges.values())
