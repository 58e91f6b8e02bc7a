"""A measured compute speed for the planner: the calibration file `geotrain calibrate` writes.

The cost models with compute ("yuan+compute", "schedule", the WAN recipe's compute) charge a step's FLOPs,
6 x params x tokens (the seed's count), at `utilisation` x each GPU's peak. Without a measurement that
utilisation is DEFAULT_UTILISATION (0.4, the seed's V100 figure): right for a large model on a GPU, and far
off for a small one (a tiny GPT's step then looks like microseconds). A calibration measures the user's own
model for a few steps on one machine and records what that speed stands for:

    utilisation = (6 x params x tokens_per_step / seconds_per_step) / peak FLOP/s of `stands_for`

`stands_for` is the GPU type whose speed the measurement is: the measuring GPU itself, or, measured on a CPU
for emulated runs, the cluster's fastest GPU (geotrain's emulator runs the fastest GPU at this machine's
speed and the others slower by their peaks, RuntimeConfig.compute_scale). Every device of a plan is then
charged at that utilisation of its own peak: the same ratio of speeds as the emulator's.

File (JSON): {"version": 1, "model", "params", "tokens_per_step", "seconds_per_step", "steps",
"seconds" (each measured step), "device", "stands_for", "utilisation"}.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from geotrain.cost.gpus import gpu_peak_flops
from geotrain.errors import GeotrainError, shown

VERSION = 1


class CalibrationError(GeotrainError, ValueError):
    """A calibration file or value that cannot be used (named with its file and key)."""


@dataclass(frozen=True)
class Calibration:
    """One model's measured step: `params` parameters, `tokens_per_step` tokens per step, the median of
    `seconds` (each measured step, s) on `device`, standing for GPU type `stands_for`."""

    model: str
    params: int
    tokens_per_step: int
    seconds: tuple[float, ...]
    device: str
    stands_for: str

    def __post_init__(self) -> None:
        if self.params < 1 or self.tokens_per_step < 1:
            raise CalibrationError(f"calibration: params and tokens_per_step must be >= 1, got {self.params}, "
                                   f"{self.tokens_per_step}")
        if not self.seconds or not all(math.isfinite(s) and s > 0 for s in self.seconds):
            raise CalibrationError(f"calibration: seconds must be finite numbers > 0, got {shown(list(self.seconds))}")
        gpu_peak_flops(self.stands_for)  # an unknown GPU name is refused here, with the known names

    @property
    def seconds_per_step(self) -> float:
        """The median measured step (s)."""
        ordered = sorted(self.seconds)
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])

    @property
    def flops_per_step(self) -> float:
        """6 x params x tokens: a training step's FLOPs as the cost models count them."""
        return 6.0 * self.params * self.tokens_per_step

    @property
    def utilisation(self) -> float:
        """The measured FLOP/s over `stands_for`'s peak: what the cost models charge every GPU at."""
        return self.flops_per_step / self.seconds_per_step / gpu_peak_flops(self.stands_for)

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self), "seconds": list(self.seconds),
                "seconds_per_step": self.seconds_per_step, "steps": len(self.seconds),
                "utilisation": self.utilisation}

    @classmethod
    def from_json(cls, doc: Any, source: str = "<calibration>") -> Calibration:
        version = doc.get("version") if isinstance(doc, dict) else None
        if isinstance(version, bool) or version != VERSION:  # true == 1 in Python, not in the file format
            raise CalibrationError(f"{source}: a calibration is a JSON object with version {VERSION} "
                                   f"(geotrain calibrate --out), got {shown(doc)[:80]}")
        try:
            return cls(model=str(doc["model"]), params=int(doc["params"]), tokens_per_step=int(doc["tokens_per_step"]),
                       seconds=tuple(float(s) for s in doc["seconds"]), device=str(doc["device"]),
                       stands_for=str(doc["stands_for"]))
        except KeyError as missing:
            raise CalibrationError(f"{source}: {missing.args[0]} is missing") from None
        except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(inf)
            if isinstance(exc, GeotrainError):
                raise CalibrationError(f"{source}: {exc}") from None
            raise CalibrationError(f"{source}: a value has the wrong type: {exc}") from None


def load_calibration(path: str | Path) -> Calibration:
    """The calibration in JSON file `path`; CalibrationError naming the file for anything wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"--calibration {path}: cannot read it ({exc.__class__.__name__})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"--calibration {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    return Calibration.from_json(doc, f"--calibration {path}")
