"""geotrain.sync.elastic's compressed exchange, in process: the codec reducer on a torchft quorum (a fake
Manager and process group standing in for a peer group), each group's weight beside its payload. The mean
is the non-elastic reducer's, bit for bit; a group of weight 0 is left out of it; a try that does not commit
leaves the residuals as they were; a peer's or a checkpoint's state starts the residuals from zero."""

from __future__ import annotations

import torch

from geotrain.codecs import CodecSpec
from geotrain.comm.codec_reducer import CodecReducer
from geotrain.comm.collectives import SimulatedCollective
from geotrain.sync.base import ComputeTimer
from geotrain.sync.elastic import ManagerExchange
from fake_torchft import Done, FakeManager

SHAPES = [(6, 5), (7,)]


class _PeerPG:
    """A process group of two members whose other member (rank 1) sends `peer_bytes()` (packed payload and
    weight, what its QuorumCollective hands); `failures` first collectives fail."""

    def __init__(self, peer_bytes, failures: int = 0) -> None:
        self.peer_bytes, self.failures, self.gathers = peer_bytes, failures, 0

    def allgather(self, outputs, inputs, opts):
        self.gathers += 1
        outputs[0][0].copy_(inputs[0])
        outputs[0][1].copy_(self.peer_bytes())
        failing = self.failures > 0
        self.failures -= 1
        return Done(failing)


def _grads(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def _params(grads: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    return params


def _peer(grads: list[torch.Tensor], weight: float, step: int):
    """The peer's bytes for step `step`: its own reducer's packed int8-block payload of weight x grads, its weight."""
    reducer = CodecReducer(CodecSpec.parse("int8-block").build(), [(str(i), s) for i, s in enumerate(SHAPES)], 2)
    payloads, _ = reducer.encode_all([[g * weight for g in grads]], step, None)
    return lambda: torch.cat([reducer.packed(payloads)[0], torch.tensor([weight]).view(torch.uint8)])


def _exchange(pg, manager, params) -> ManagerExchange:
    return ManagerExchange(params, manager, healed=lambda: False, codec="int8-block", pg=pg,
                           start_quorum=manager.start_quorum)


def test_the_quorum_mean_is_the_non_elastic_reducers_bit_for_bit_and_a_weight_0_peer_is_left_out():
    mine, theirs = _grads(0), _grads(1)
    reference = CodecReducer(CodecSpec.parse("int8-block").build(), [(str(i), s) for i, s in enumerate(SHAPES)], 2,
                             local_workers=2)
    expected = reference.reduce([mine, theirs], SimulatedCollective(2), 3)
    manager, params = FakeManager(2), _params(mine)
    exchange = _exchange(_PeerPG(_peer(theirs, 1.0, 3)), manager, params)
    nbytes = exchange.exchange(3, ComputeTimer())
    assert exchange.contributors == 2.0 and nbytes > 0
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected, strict=True))
    # the peer recovered in this quorum (weight 0, zeros sent): the mean is this group's decoded gradient alone
    alone = CodecReducer(CodecSpec.parse("int8-block").build(), [(str(i), s) for i, s in enumerate(SHAPES)], 1)
    own = alone.reduce([mine], SimulatedCollective(1), 3)
    params = _params(mine)
    exchange = _exchange(_PeerPG(_peer(theirs, 0.0, 3)), FakeManager(2), params)
    exchange.exchange(3, ComputeTimer())
    assert exchange.contributors == 1.0
    assert all(torch.allclose(p.grad, o, rtol=0, atol=1e-6) for p, o in zip(params, own, strict=True))


def test_a_try_that_does_not_commit_leaves_the_residuals_and_the_retry_delivers_the_same_mean():
    mine, theirs = _grads(2), _grads(3)
    clean_params, failing_params = _params(mine), _params(mine)
    clean = _exchange(_PeerPG(_peer(theirs, 1.0, 0)), FakeManager(2), clean_params)
    clean.exchange(0, ComputeTimer())
    manager = FakeManager(2)
    failing = _exchange(_PeerPG(_peer(theirs, 1.0, 0), failures=1), manager, failing_params)
    failing.exchange(0, ComputeTimer())
    assert failing.failed_quorums == 1 and manager.quorums == 1  # one new quorum, then committed
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(clean_params, failing_params, strict=True))
    (clean_residuals,), (failing_residuals,) = clean.reducer.residuals, failing.reducer.residuals
    assert clean_residuals.keys() == failing_residuals.keys() == {"0", "1"}  # flat: one unit, a residual per name
    assert all(torch.equal(clean_residuals[k], failing_residuals[k]) for k in clean_residuals)
    assert any(float(r.abs().max()) > 0 for r in clean_residuals.values())  # int8-block left something behind


def test_residuals_are_never_handed_on_and_a_loaded_state_starts_from_zero():
    params = _params(_grads(4))
    exchange = _exchange(_PeerPG(_peer(_grads(5), 1.0, 0)), FakeManager(2), params)
    exchange.exchange(0, ComputeTimer())
    assert exchange.reducer.residuals[0] and exchange.state_dict() == {}
    exchange.load_state_dict({})
    assert exchange.reducer.residuals == [{}]
    fragment = exchange.over(params[:1])
    (_, reducer), = fragment.parts
    assert reducer is not exchange.reducer and fragment.state_dict() == {}
