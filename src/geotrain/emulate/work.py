"""The Work objects the emulating process group returns: `wait()` runs the emulation of the operation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class EmulatedWork(dist.Work):
    """Completes by calling `finish` once (real wait, emulated timing, sleep); result: the output tensors.

    `get_future()` completes the operation at once (DDP's reducer asks for the future when it issues an
    all-reduce), so gradient all-reduces do not overlap the rest of the backward pass in wall time.
    """

    def __init__(self, finish: Callable[[], None], result: list[torch.Tensor]) -> None:
        super().__init__()
        self._finish = finish
        self._result = result
        self._done = False
        self.emulated_span: tuple[float, float] | None = None  # a receive's (start, arrival) on its link

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._finish()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future
