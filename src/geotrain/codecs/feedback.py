"""Error feedback: remember what compression dropped and add it to the next tensor before compressing.

    ef = ErrorFeedback(get_codec("topk"))
    payload = ef.encode(grad)     # corrected = grad + residual; payload = codec.encode(corrected)
                                  # residual  = corrected - codec.decode(payload)
    sent = ef.decode(payload)

Nothing is lost, only delayed: after T steps, sum of sent + residual == sum of inputs (up to float
rounding). One ErrorFeedback holds the residual of ONE tensor stream of one worker (a parameter, a
flat gradient or a DDP bucket); `ErrorFeedbackBank` keeps one per key. The residual has the input's
shape and dtype; `state_dict()` / `load_state_dict()` save and restore it exactly, for checkpoints.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from geotrain.codecs.base import Codec, CodecError, Payload


class ErrorFeedback:
    """A codec wrapper with a per-worker residual (see module doc). Not thread-safe."""

    def __init__(self, codec: Codec) -> None:
        if not isinstance(codec, Codec):
            raise CodecError(f"ErrorFeedback wraps a Codec, got {type(codec).__name__}")
        self.codec = codec
        self._residual: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return f"{self.codec.name}+ef"

    @property
    def summable(self) -> bool:
        """As the wrapped codec: payloads still have the codec's format."""
        return self.codec.summable

    def set_step(self, step: int) -> None:
        """Forward the step counter to the codec (randk masks, powersgd starts)."""
        self.codec.set_step(step)

    @property
    def residual(self) -> torch.Tensor | None:
        """What has not been sent yet (None before the first encode or after reset)."""
        return self._residual

    def encode(self, tensor: torch.Tensor) -> Payload:
        """Encode tensor + residual; the residual becomes what this payload fails to carry.

        If the codec raises (non-finite input, bad type), the residual is left unchanged.
        """
        corrected = self.codec._check_input(tensor)
        if self._residual is not None:
            if self._residual.shape != corrected.shape or self._residual.dtype != corrected.dtype:
                raise CodecError(f"error feedback residual is {self._residual.dtype} {tuple(self._residual.shape)} "
                                 f"but the tensor is {corrected.dtype} {tuple(corrected.shape)}; "
                                 f"use one ErrorFeedback per tensor stream (ErrorFeedbackBank)")
            corrected = corrected + self._residual
        payload = self.codec.encode(corrected)
        self._residual = corrected - self.codec.decode(payload)
        return payload

    def decode(self, payload: Payload) -> torch.Tensor:
        return self.codec.decode(payload)

    def reset(self) -> None:
        """Forget the residual."""
        self._residual = None

    def state_dict(self) -> dict[str, Any]:
        """{'codec': name, 'residual': a copy of the residual or None}."""
        residual = None if self._residual is None else self._residual.clone()
        return {"codec": self.codec.name, "residual": residual}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.codec.name:
            raise CodecError(f"error feedback state is for codec {state.get('codec')!r}, not {self.codec.name!r}")
        residual = state.get("residual")
        if residual is not None and not isinstance(residual, torch.Tensor):
            raise CodecError(f"error feedback residual must be a tensor or None, got {type(residual).__name__}")
        self._residual = None if residual is None else residual.detach().cpu().clone()


class ErrorFeedbackBank:
    """One ErrorFeedback per key (parameter name, bucket index...), all around one codec."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._feedbacks: dict[Hashable, ErrorFeedback] = {}

    def __getitem__(self, key: Hashable) -> ErrorFeedback:
        if key not in self._feedbacks:
            self._feedbacks[key] = ErrorFeedback(self.codec)
        return self._feedbacks[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._feedbacks

    def __len__(self) -> int:
        return len(self._feedbacks)

    def keys(self) -> list[Hashable]:
        return list(self._feedbacks)

    def encode(self, key: Hashable, tensor: torch.Tensor) -> Payload:
        return self[key].encode(tensor)

    def decode(self, payload: Payload) -> torch.Tensor:
        return self.codec.decode(payload)

    def reset(self) -> None:
        """Forget every residual."""
        self._feedbacks.clear()

    def state_dict(self) -> dict[str, Any]:
        """{'codec': name, 'residuals': {key: residual copy or None}}."""
        residuals = {key: feedback.state_dict()["residual"] for key, feedback in self._feedbacks.items()}
        return {"codec": self.codec.name, "residuals": residuals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("codec") != self.codec.name:
            raise CodecError(f"error feedback state is for codec {state.get('codec')!r}, not {self.codec.name!r}")
        self._feedbacks = {}
        for key, residual in dict(state.get("residuals", {})).items():
            self[key].load_state_dict({"codec": self.codec.name, "residual": residual})
