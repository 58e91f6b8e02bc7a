"""The codec contract: every gradient/activation codec encodes a tensor into the real wire buffers.

    payload = codec.encode(tensor)      # Payload: the tensors that would cross the network
    restored = codec.decode(payload)    # same shape and dtype as the input
    payload.nbytes                      # wire bytes = sum of the buffers' sizes

Metadata (shape, dtype, parameters, a step counter) travels beside the buffers and is not counted:
both sides of a DDP bucket or a pipeline cut know the shapes in advance. Metadata never holds
data-dependent values (scales, counts...: those are buffers), so two workers that encode tensors of
the same shape with the same codec get payloads with identical specs (`payload.spec()`), which is
what an all-gather of packed payloads needs.

decode trusts nothing in a payload: `Codec.decode` runs `checked_payload` (type, codec name, shape
bounds, dtype, and exactly the buffers the codec's `payload_buffers` derives from shape and meta)
before the codec's `_decode`, so a malformed payload raises CodecError, never another exception,
and never makes decode allocate more than MAX_DECODE_NUMEL values.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from geotrain.errors import GeotrainError


class CodecError(GeotrainError, ValueError):
    """Bad codec name, parameter or payload."""


class CodecTypeError(CodecError, TypeError):
    """The input is not a floating-point tensor (codecs compress float gradients/activations only)."""


class NonFiniteGradientError(GeotrainError, ValueError):
    """The input holds NaN or inf and the codec was not told to pass them through."""


MAX_DECODE_NUMEL = 2**31 - 1
"""The most values `decode` allocates (8 GiB of fp32): a payload whose shape claims more is refused
before anything is allocated (a sparse payload of a few bytes may describe a huge tensor)."""

WARM_UP_NUMEL = 1 << 16
"""Values of the tensor `Codec.warm_up` sends through a codec: many blocks of every block codec, and as
many as top-k needs to select through its compiled kernel (selection.APPROX_MIN_NUMEL)."""

MAX_DIMS = 64
"""The most dimensions a payload's shape may have."""

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes codecs encode and decode to."""

_FLAGS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def parse_flag(value: Any, where: str, error: type[Exception] = CodecError) -> bool:
    """A boolean from True/False, 1/0 or the words true/false/yes/no/1/0 (any case); anything else
    raises `error` naming `where` (`bool("no")` is True: never coerce with bool())."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(int(value))
    if isinstance(value, str) and value.strip().lower() in _FLAGS:
        return _FLAGS[value.strip().lower()]
    raise error(f"{where} must be a boolean (true/false, yes/no, 1/0), got {_short(value)}")


def parse_count(value: Any, where: str, minimum: int = 0, error: type[Exception] = CodecError) -> int:
    """An integer >= `minimum` given as an int (numpy ints too); floats, strings and bools raise `error`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise error(f"{where} must be an integer >= {minimum}, got {_short(value)}")
    return int(value)


def _short(value: Any, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters (error messages echo at most that much of a bad value)."""
    text = repr(value) if not isinstance(value, torch.Tensor) else f"tensor of shape {tuple(value.shape)}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class BufferSpec:
    """One wire buffer without its data: name, dtype, shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class PayloadSpec:
    """Everything about a payload except its data: enough to unpack its bytes (`unpack_payload`)."""

    codec: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    buffers: tuple[BufferSpec, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Wire bytes of a payload with this spec."""
        return sum(buffer.nbytes for buffer in self.buffers)


@dataclass(frozen=True)
class Payload:
    """What goes on the wire: named contiguous CPU tensors, plus small metadata that is not counted."""

    codec: str
    buffers: dict[str, torch.Tensor]
    shape: tuple[int, ...]
    dtype: torch.dtype
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Wire bytes: the sum of the buffers' sizes."""
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def spec(self) -> PayloadSpec:
        """The payload without its data (buffer names, dtypes and shapes in wire order; meta)."""
        buffers = tuple(BufferSpec(name, t.dtype, tuple(t.shape)) for name, t in self.buffers.items())
        return PayloadSpec(self.codec, tuple(self.shape), self.dtype, buffers, dict(self.meta))


class Codec(ABC):
    """One compression scheme. Subclasses set `name` and implement encode/decode/wire_nbytes.

    `summable`: True when payloads of the same spec can be summed element-wise in compressed form
    (so a plain all-reduce works); False when receivers must all-gather payloads and decode each.
    `allow_nonfinite`: False (default) -> NaN/inf input raises NonFiniteGradientError; True -> the
    codec does not check and non-finite values propagate wherever the codec carries them (so the
    receiver's own inf check, e.g. an AMP-style step skip, still sees them). Codecs are stateless
    across calls except for an explicit step counter (`set_step`), used by seeded codecs.
    """

    name: str = ""
    summable: bool = False
    exact: bool = False
    """decode(encode(x)) is x bit for bit: error feedback would keep a residual of zeros, so it keeps none."""
    wire_float_dtype: torch.dtype | None = None
    """The float dtype a tensor travels in when the wire form is the tensor itself, cast (none: fp32,
    fp16, bf16); None when the wire form is not a float tensor (quantized, sparse, sign, low rank), so
    such a codec cannot stand where a float tensor must travel (pipeline activations)."""
    latency_rounds: float = 1.0
    """Latency rounds of one exchange relative to one all-reduce (PowerSGD: two, for P and Q)."""

    def __init__(self, *, allow_nonfinite: bool = False) -> None:
        self.allow_nonfinite = parse_flag(allow_nonfinite, f"{self.name}: allow_nonfinite")
        self.step = 0

    @abstractmethod
    def encode(self, tensor: torch.Tensor) -> Payload:
        """Compress `tensor` (any float dtype, any shape, may be empty)."""

    def decode(self, payload: Payload) -> torch.Tensor:
        """Reconstruct a tensor of the payload's shape and dtype.

        The payload is checked first (`checked_payload`): any malformed payload raises CodecError
        before anything is allocated or read; `_decode` then trusts it.
        """
        return self._decode(self.checked_payload(payload))

    @abstractmethod
    def _decode(self, payload: Payload) -> torch.Tensor:
        """decode() of a payload that `checked_payload` accepted."""

    @abstractmethod
    def payload_buffers(self, payload: Payload) -> tuple[BufferSpec, ...]:
        """The buffers (names, dtypes, shapes, in wire order) a payload with this shape and meta must
        carry; reads `payload.shape` (already checked) and `payload.meta` (through `_meta_count`),
        and raises CodecError for metadata this codec cannot decode."""

    @abstractmethod
    def wire_nbytes(self, shape: tuple[int, ...]) -> int:
        """The documented wire size in bytes of a tensor of `shape` (equals encode(x).nbytes)."""

    def bytes_per_value(self, hidden: int, trained_bytes: float) -> float:
        """Wire bytes per gradient value, for cost models, of a transformer with `hidden` units whose
        values are `trained_bytes` wide: the codec's size on a long flat vector (1 Mi values), never
        more than the values themselves. Codecs that compress by shape (low rank) override it."""
        n = 1 << 20
        return min(float(trained_bytes), self.wire_nbytes((n,)) / n)

    def params(self) -> dict[str, Any]:
        """Constructor parameters (JSON-able), e.g. for tables and logs."""
        return {"allow_nonfinite": self.allow_nonfinite}

    def warm_up(self) -> None:
        """Encode and decode WARM_UP_NUMEL float32 values through a new codec of the same parameters, so
        that its compiled kernels are loaded now, at start-up, and not inside the first exchange (numba's
        cached kernels take ~0.5 s of CPU to load on their first call in a process: int8, int8-block,
        sign, top-k). This codec (its step) is untouched; later calls cost a few microseconds."""
        type(self)(**self.params()).roundtrip(torch.linspace(-1.0, 1.0, WARM_UP_NUMEL))

    def set_step(self, step: int) -> None:
        """Set the step counter used by seeded codecs (randk's mask, powersgd's start); workers that
        set the same step before encoding agree on everything random. Harmless for other codecs.
        An integer >= 0 (1.7, '3' and True are refused, not coerced)."""
        self.step = parse_count(step, f"codec {self.name!r}: step")

    def expected_spec(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> PayloadSpec:
        """The spec of encode(x) for any x of this shape and dtype at the current step (to size receive buffers)."""
        return self.encode(torch.zeros(shape, dtype=dtype)).spec()

    def roundtrip(self, tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
        """decode(encode(tensor)) and the wire bytes."""
        payload = self.encode(tensor)
        return self.decode(payload), payload.nbytes

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.params().items())
        return f"{type(self).__name__}({args})"

    # -- helpers for subclasses -------------------------------------------------------------
    def _check_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """Validate type; return the tensor contiguous and on CPU. Finiteness is checked by the codec."""
        if not isinstance(tensor, torch.Tensor):
            raise CodecTypeError(f"codec {self.name!r} encodes torch tensors, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise CodecTypeError(f"codec {self.name!r} encodes floating-point tensors "
                                 f"(float16, bfloat16, float32, float64), got {tensor.dtype}")
        return tensor.detach().cpu().contiguous()

    def checked_payload(self, payload: Payload) -> Payload:
        """`payload` if it is one this codec can decode, as a Payload with a tuple-of-int shape and
        detached buffers; else CodecError (never another exception).

        Checks, before anything is allocated: the type, the codec name, the shape (<= MAX_DIMS
        non-negative ints, <= MAX_DECODE_NUMEL values), the dtype (FLOAT_DTYPES), and that the
        buffers are exactly the dense CPU tensors `payload_buffers` expects, name by name, with the
        expected dtype and shape. Codecs whose buffers hold positions (topk) check their range too.
        """
        if not isinstance(payload, Payload):
            raise CodecError(f"codec {self.name!r} decodes a Payload, got {type(payload).__name__}")
        if not isinstance(payload.codec, str) or payload.codec != self.name:
            raise CodecError(f"codec {self.name!r} cannot decode a {_short(payload.codec)} payload")
        shape = checked_shape(payload.shape, f"{self.name!r} payload shape")
        if not isinstance(payload.dtype, torch.dtype) or payload.dtype not in FLOAT_DTYPES:
            raise CodecError(f"{self.name!r} payload dtype must be one of "
                             f"{', '.join(str(d) for d in FLOAT_DTYPES)}, got {_short(payload.dtype)}")
        if not isinstance(payload.meta, dict) or not isinstance(payload.buffers, dict):
            raise CodecError(f"{self.name!r} payload meta and buffers must be dicts, got "
                             f"{type(payload.meta).__name__} and {type(payload.buffers).__name__}")
        for name, tensor in payload.buffers.items():
            if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.device.type != "cpu":
                raise CodecError(f"{self.name!r} payload buffer {_short(name)} must be a dense CPU tensor, "
                                 f"got {_short(tensor)}")
        checked = Payload(self.name, {name: t.detach() for name, t in payload.buffers.items()}, shape,
                          payload.dtype, payload.meta)
        expected = self.payload_buffers(checked)
        names = [spec.name for spec in expected]
        if set(checked.buffers) != set(names):
            raise CodecError(f"{self.name!r} payload must carry buffers {names}, has {_short(list(checked.buffers))}")
        for spec in expected:
            tensor = checked.buffers[spec.name]
            if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
                raise CodecError(f"{self.name!r} payload of shape {shape}: buffer {spec.name!r} must be "
                                 f"{spec.dtype} of shape {spec.shape}, "
                                 f"got {tensor.dtype} of shape {tuple(tensor.shape)}")
        return Payload(self.name, {spec.name: checked.buffers[spec.name] for spec in expected}, shape,
                       payload.dtype, payload.meta)

    def _meta_count(self, payload: Payload, key: str, default: int | None, minimum: int = 0,
                    maximum: int = 2**63 - 1) -> int:
        """Integer metadata `key` in [minimum, maximum] (`default` when absent and not None), else CodecError."""
        if key not in payload.meta and default is not None:
            return default
        value = payload.meta.get(key)
        where = f"{self.name!r} payload meta {key!r}"
        count = parse_count(value, where, minimum)
        if count > maximum:
            raise CodecError(f"{where} must be <= {maximum}, got {_short(value)}")
        return count

    def _raise_if_nonfinite(self, tensor: torch.Tensor, reduced: torch.Tensor | float,
                            wire: torch.Tensor | None = None) -> None:
        """Raise NonFiniteGradientError if `tensor` has NaN/inf, unless allowed.

        `reduced` is a cheap reduction the codec computed anyway (a sum, max|x|, mean|x|): NaN/inf
        in the input make it non-finite, so the exact (slower) element checks run only then. If the
        input is finite but `wire` (what goes on the wire: cast values, scales) is not, the values
        exceed the wire format's range: CodecError. A finite input whose check sum merely
        overflowed passes.
        """
        if self.allow_nonfinite:
            return
        value = reduced if isinstance(reduced, torch.Tensor) else torch.tensor(float(reduced))
        if bool(torch.isfinite(value).all()):
            return
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            count = int(bad.sum())
            raise NonFiniteGradientError(
                f"codec {self.name!r}: input of shape {tuple(tensor.shape)} holds {count} NaN/inf value(s); "
                f"pass allow_nonfinite=True to send them through")
        if wire is not None and not bool(torch.isfinite(wire).all()):
            raise CodecError(f"codec {self.name!r}: finite input of shape {tuple(tensor.shape)} overflows the "
                             f"wire format (max |x| = {float(tensor.abs().max()):.3g}); scale it down first")


def checked_shape(shape: Any, where: str) -> tuple[int, ...]:
    """`shape` as a tuple of ints if it is a tuple/list of <= MAX_DIMS integers >= 0 with at most
    MAX_DECODE_NUMEL values in all; else CodecError naming `where`."""
    if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) > MAX_DIMS:
        raise CodecError(f"{where} must be a tuple of at most {MAX_DIMS} integers, got {_short(shape)}")
    dims = tuple(parse_count(dim, f"{where} {_short(shape)}: every dimension") for dim in shape)
    if max(dims, default=0) > MAX_DECODE_NUMEL or math.prod(dims) > MAX_DECODE_NUMEL:
        raise CodecError(f"{where} {_short(dims)} holds {math.prod(dims):.3g} values, more than the "
                         f"{MAX_DECODE_NUMEL} a codec decodes")
    return dims


def numel_of(shape: tuple[int, ...]) -> int:
    """Number of values of a tensor of `shape` (1 for a scalar, 0 if any dim is 0)."""
    return math.prod(int(dim) for dim in shape)


def extremes(tensor: torch.Tensor) -> torch.Tensor:
    """[min, max] of `tensor` (zeros if empty): non-finite whenever it holds NaN/inf. One vectorised
    pass for every float dtype (a float32 sum of fp16 values is ~20x slower); the probe that
    _raise_if_nonfinite needs."""
    if tensor.numel() == 0:
        return torch.zeros(2)
    low, high = torch.aminmax(tensor.reshape(-1))
    return torch.stack([low, high])


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
