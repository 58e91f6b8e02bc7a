"""1-bit Adam on elastic replica groups (--elastic --optimizer onebit-adam): geotrain.optim.OneBitAdam's exchange
run each step over the current torchft quorum (geotrain.sync.elastic's `QuorumCollective` on the Manager's process
group: its fp32 all-reduce in the warm-up, its all-to-all and all-gather of 1-bit messages after), committed and
retried as every elastic exchange is (`ManagerExchange.committed`). Every group weighs 1 and contributes its own
gradient, a group that just healed included (runtime/elastic/rules.py refuses batch shares).

State, shared and per group. After a committed step every group of the quorum holds the same step count, momentum
(the 1-bit average every member decodes alike), variance (the mean warm-up gradients' moment, then frozen) and
learning rate: that is the state a rejoining group recovers from its peer (torchft's live recovery) and what a
checkpoint holds. The residuals are each group's own: the worker residual is what this group's encodings have not
delivered, the server residual what it has not delivered of the chunk it owns as the quorum's rank r. They are never
handed on (`state_dict` holds zeros): a group that recovers a peer's state starts from zero residuals, as a codec's
residuals do (geotrain.sync.elastic "Codecs"): copying the peer's would deliver the peer's undelivered part twice,
and a group that leaves takes its own with it (at most one encoding's error of its momentum and of its chunk).

Quorum changes. The chunks depend on the quorum's size p, a server residual on its owner's rank r. Before a try over a
quorum whose (p, r) differs from the last committed step's, the reducer is relaid (OneBitMomentumReducer.relaid):
the worker residual is kept value for value and the server residual is folded into it times p, so that whoever owns
those values now receives them through this group's next encoding, with its error feedback: nothing a live group
had not yet delivered is dropped.

A try that does not commit (`should_commit` false) changes nothing: `OneBitAdam.exchange_step` computes the averaged
gradient or momentum and the new residuals aside (on the relaid reducer, if any), and only a committed try's
`commit_step` moves the moments, residuals, step count and parameters; the retry (perhaps over another quorum: other
p and r) starts from the same state and the same local gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from geotrain.comm import OneBitMomentumReducer
from geotrain.optim import OneBitAdam
from geotrain.optim.onebit_adam import OneBitExchanged
from geotrain.sync.base import CollectivePause, GradientSync, StepTimer, SyncError, SyncResult


class QuorumExchange(Protocol):
    """What this sync needs of geotrain.sync.elastic.ManagerExchange."""

    weight: float
    contributors: float
    pause: CollectivePause

    def quorum_collective(self, weight: float) -> Any: ...

    def committed(self, step: int, attempt: Any, rollback: Any = None) -> Any: ...


class ElasticOneBitSync(GradientSync):
    """Steps `optimizer` (a OneBitAdam of `params`, built on no collective: the quorum's comes per try) with its
    exchange over `exchange`'s quorum (module doc). `laid`: the (quorum size, rank) its reducer is laid out for."""

    def __init__(self, params: Sequence[torch.nn.Parameter], optimizer: OneBitAdam, exchange: QuorumExchange) -> None:
        if exchange.weight != 1.0:
            raise SyncError(f"elastic 1-bit Adam: every replica group weighs 1 in the quorum's mean, this one "
                            f"{exchange.weight:g} (batch shares)")
        self.params = list(params)
        self.optimizer = optimizer
        self.exchange = exchange
        self.clip = optimizer.max_grad_norm
        self.laid = (optimizer.layout.world_size, 0)

    def _reducer(self, world_size: int, rank: int) -> OneBitMomentumReducer:
        """The reducer for a try over a quorum of `world_size` where this group is `rank` (relaid aside if the
        quorum differs from the last committed step's)."""
        if (world_size, rank) == self.laid:
            return self.optimizer.reducer
        return self.optimizer.reducer.relaid(world_size, self.laid[1], [p.numel() for p in self.params])

    def step(self, step: int, timer: StepTimer) -> SyncResult:
        with timer:
            grads = [self.optimizer.flat_grad()]
        warmup = not self.optimizer.frozen

        def attempt() -> tuple[OneBitExchanged, Any]:
            collective = self.exchange.quorum_collective(1.0)
            reducer = self._reducer(collective.world_size, collective.local_ranks[0])
            with self.exchange.pause.timing(timer):
                return self.optimizer.exchange_step(grads, collective, reducer), collective

        exchanged, collective = self.exchange.committed(step, attempt)
        self.exchange.contributors = collective.contributors
        with timer:
            self.optimizer.commit_step(exchanged)
        if exchanged.reducer is not None:
            self.laid = (collective.world_size, collective.local_ranks[0])
        norm = exchanged.grad_norm if warmup and self.clip is not None else None
        return SyncResult(collective.ledger.handed_bytes, norm)

    def _fresh_reducer(self) -> OneBitMomentumReducer:
        """Zero residuals on the layout of one rank (what a state handed on holds)."""
        return OneBitMomentumReducer([p.numel() for p in self.params], 1, 1, self.optimizer.device)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state with zero residuals of a one-rank layout (module doc: the residuals are never
        handed on)."""
        state = self.optimizer.state_dict()
        fresh = self._fresh_reducer()
        state["onebit"] = {**state["onebit"], "worker_errors": fresh.worker_errors,
                           "server_errors": fresh.server_errors}
        return {"optimizer": state, "exchange": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A peer's or a checkpoint's state: its shared part, this group's residuals from zero."""
        self.optimizer.reducer = self._fresh_reducer()
        self.optimizer.load_state_dict(state["optimizer"])
        self.laid = (1, 0)
