"""The spec of the per-sample activation delta wire (AQ-SGD, runtime/delta_wire.py): which codecs it uses
and what it costs on the wire in steady state.

`delta:codec=int2-block,first=int8-block,grad=int2-block,max_state_mb=1024`: deltas against the state both
sides of a pipeline cut keep per training sample in `codec`, a sample's first sight (and evaluation) in
`first`, activation gradients in `grad` (each a codec of CARRIED_CODECS, its parameters nested with `/`
for `:` and `,`:
`grad=topk-lowbit/fraction=0.0625/bits=4`, CodecSpec.parse_nested), at most `max_state_mb` (1e6 bytes)
of per-sample state per side. `feedback=true`: per-sample error feedback on the gradients (the receiving
stage keeps what `grad` dropped of sample i's gradient and adds it to that sample's gradient at its next
visit; as many state bytes again on that side). Not a Codec of the registry: it keeps state per sample and
crosses a cut only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

from geotrain.codecs.base import CodecError, parse_flag
from geotrain.codecs.carrier import CARRIED_CODECS, cut_bytes_per_value
from geotrain.codecs.spec import CodecSpec

DELTA = "delta"
"""The --pp-codec name of the per-sample delta wire."""


@dataclass(frozen=True)
class DeltaSpec:
    """The codecs of a delta wire (nested specs of CARRIED_CODECS) and its state cap (1e6 bytes per side)."""

    codec: str = "int2-block"
    first: str = "int8-block"
    grad: str = "int2-block"
    max_state_mb: float = 1024.0
    feedback: bool = False
    """Per-sample error feedback on the activation gradients (runtime/delta_wire.py)."""

    @classmethod
    def of(cls, spec: CodecSpec) -> "DeltaSpec":
        """The delta spec of a parsed `delta:k=v,...`; CodecError names the bad parameter."""
        known = {f.name for f in fields(cls)}
        for key, _ in spec.params:
            if key not in known:
                raise CodecError(f"codec {str(spec)!r}: unknown parameter {key!r} (known: {', '.join(sorted(known))})")
        kwargs = spec.kwargs()
        if "feedback" in kwargs:
            kwargs["feedback"] = parse_flag(kwargs["feedback"], f"codec {str(spec)!r}: feedback")
        found = cls(**kwargs)
        for key in ("codec", "first", "grad"):
            try:
                nested = found.codec_spec(key)
                nested.build()
            except (CodecError, TypeError) as exc:
                raise CodecError(f"codec {str(spec)!r}: {key}: {exc}") from None
            if nested.name not in CARRIED_CODECS:
                raise CodecError(f"codec {str(spec)!r}: {key} must be one of {', '.join(CARRIED_CODECS)}, "
                                 f"got {getattr(found, key)!r}")
        cap = found.max_state_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise CodecError(f"codec {str(spec)!r}: max_state_mb must be a number > 0, got {cap!r}")
        return found

    def codec_spec(self, key: str) -> CodecSpec:
        """The parsed spec of `key` ("codec", "first" or "grad"); CodecError names a bad one."""
        return CodecSpec.parse_nested(getattr(self, key))

    def steady_bytes_per_value(self, sample_shape: Sequence[int], trained_bytes: float) -> float:
        """Wire bytes per activation value once every sample has been seen, each direction: the carrier is as
        wide as the larger of the delta and the gradient payloads (one shape both ways); the 4-byte sample id
        per row is left out (4 / (seq x hidden) per value). First sights cost `first`'s bytes, once per sample.
        `sample_shape`: one sample's activations, [tokens, hidden] (a low-rank `grad` is priced by it)."""
        return max(cut_bytes_per_value(self.codec_spec(key).build(), sample_shape, trained_bytes)
                   for key in ("codec", "grad"))


def is_delta(spec: CodecSpec) -> bool:
    """Whether `spec` names the delta wire."""
    return spec.name == DELTA


def state_bytes_per_sample(sample_shape: Sequence[int], feedback: bool = False) -> int:
    """Bytes the busier side keeps per sample: its last reconstructed activation, float32, and with `feedback` the
    receiver's gradient residual (as many bytes again)."""
    return (2 if feedback else 1) * 4 * math.prod(int(n) for n in sample_shape)


def delta_memory_refusal(spec: DeltaSpec, samples: int, sample_shape: Sequence[int]) -> str | None:
    """Why `samples` samples of `sample_shape` cannot be kept under spec.max_state_mb per side (None: they can)."""
    per_sample = state_bytes_per_sample(sample_shape, spec.feedback)
    need = samples * per_sample
    if need <= spec.max_state_mb * 1e6:
        return None
    return (f"per-sample activation state of {samples:,} samples x {per_sample:,} bytes = "
            f"{need / 1e6:,.0f} MB per side exceeds max_state_mb={spec.max_state_mb:g} (fewer samples: --epoch-windows "
            f"N, or a larger max_state_mb)")
