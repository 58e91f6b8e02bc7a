"""Pipeline schedules (GPipe, 1F1B) over a generic stage, with activations sent through a codec.

A schedule is an order of micro-batch operations ("F", m) / ("B", m) for one stage; executing it
receives inputs from the previous stage, runs the stage, sends outputs to the next, and in the
backward pass sends input gradients back. Sends never block (the transport posts them), receives
do, so both orders are deadlock-free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from geotrain.codecs.base import Codec
from geotrain.codecs.wire import pack_payload, unpack_payload
from geotrain.cost.schedule import pipeline_order as schedule_order  # one op order for runtime and cost model
from geotrain.runtime.stages import Stage
from geotrain.runtime.transport import Transport

SCHEDULES = ("gpipe", "1f1b")


@dataclass
class ComputeTimer:
    """Accumulates wall seconds spent computing (forward, backward, codecs, optimizer)."""

    seconds: float = 0.0
    _started: float | None = field(default=None, repr=False)

    def __enter__(self) -> ComputeTimer:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._started is not None
        self.seconds += time.perf_counter() - self._started
        self._started = None


class ActivationPeer:
    """The link to one pipeline neighbour: encodes tensors with the pipeline codec and moves the bytes."""

    def __init__(self, transport: Transport, codec: Codec, peer_rank: int, cut: int, timer: ComputeTimer) -> None:
        self.transport = transport
        self.codec = codec
        self.peer_rank = peer_rank
        self.cut = cut
        self.timer = timer  # encoding and decoding count as compute, not communication
        self._specs: dict[tuple[int, ...], object] = {}
        self.sent_bytes = 0

    @staticmethod
    def tag(kind: str, micro: int) -> int:
        return 2 * micro + (0 if kind == "fwd" else 1)

    def send(self, tensor: torch.Tensor, kind: str, micro: int) -> None:
        with self.timer:
            data = pack_payload(self.codec.encode(tensor.detach()))
        self.sent_bytes += data.numel()
        self.transport.send(data, self.peer_rank, self.tag(kind, micro))

    def recv(self, shape: tuple[int, ...], kind: str, micro: int) -> torch.Tensor:
        spec = self._specs.get(shape)
        if spec is None:
            spec = self._specs[shape] = self.codec.expected_spec(shape, torch.float32)
        data = self.transport.recv(spec.nbytes, self.peer_rank, self.tag(kind, micro),
                                   kind=kind, cut=self.cut, micro=micro)
        with self.timer:
            return self.codec.decode(unpack_payload(data, spec)).to(torch.float32)


def run_schedule(order: Sequence[tuple[str, int]], stage: Stage, prev: ActivationPeer | None,
                 next_: ActivationPeer | None, inputs: Sequence[torch.Tensor] | None,
                 targets: Sequence[torch.Tensor] | None, activation_shape: tuple[int, ...],
                 timer: ComputeTimer) -> float | None:
    """Run one iteration's forward/backward micro-batch operations; gradients accumulate in the
    stage's parameters. Returns the mean loss over micro-batches on the last stage, else None.
    Micro-batch losses are scaled by 1/M so the accumulated gradient is that of the mean loss."""
    microbatches = sum(1 for op, _ in order if op == "F")
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    total_loss = 0.0
    for op, micro in order:
        if op == "F":
            if stage.is_first:
                assert inputs is not None
                x = inputs[micro]
            else:
                assert prev is not None
                x = prev.recv(activation_shape, "fwd", micro).requires_grad_(True)
            with timer:
                y = stage(x)
                if stage.is_last:
                    assert targets is not None
                    y = stage.loss(y, targets[micro]) / microbatches
                    total_loss += float(y.detach())
            if not stage.is_last:
                assert next_ is not None
                next_.send(y, "fwd", micro)
            saved[micro] = (x, y)
        else:
            x, y = saved.pop(micro)
            if stage.is_last:
                with timer:
                    y.backward()
            else:
                assert next_ is not None
                grad = next_.recv(activation_shape, "bwd", micro)
                with timer:
                    y.backward(grad)
            if not stage.is_first:
                assert prev is not None
                prev.send(x.grad, "bwd", micro)
    return total_loss if stage.is_last else None
