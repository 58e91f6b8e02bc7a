"""The GPU types a cluster file may name: peak dense fp16/bf16 tensor-core throughput, in FLOP/s (no
structured sparsity), and memory. A cluster file's `gpu` is checked against this table when it is loaded
(`check_gpu_type`); `unknown` (the default) names no type.

Sources (vendor datasheets; the dense figure, i.e. half the "with sparsity" number where both are given):
- V100 (SXM2): 125 TFLOP/s tensor; NVIDIA Tesla V100 datasheet (2017/2020).
- A100 (SXM4/PCIe): 312 TFLOP/s fp16/bf16 tensor; NVIDIA A100 datasheet (2020).
- H100 (SXM5): 989 TFLOP/s fp16/bf16 tensor (1979 with sparsity); NVIDIA H100 datasheet (2022).
- H200 (SXM): 989 TFLOP/s, same compute die as H100 SXM; NVIDIA H200 datasheet (2024).
- T4: 65 TFLOP/s mixed precision; NVIDIA T4 datasheet (2019).
- A10 / A10G: 125 TFLOP/s fp16 tensor (250 sparse); NVIDIA A10 datasheet (2021), AWS G5 instances.
- L4: 121 TFLOP/s fp16 tensor (242 sparse); NVIDIA L4 datasheet (2023).
- A40: 149.7 TFLOP/s fp16 tensor (299.4 sparse); NVIDIA A40 datasheet (2020).
- L40S: 362 TFLOP/s fp16 tensor (733 sparse); NVIDIA L40S datasheet (2023).
- RTX 3090: 71 TFLOP/s fp16 tensor with fp32 accumulate; NVIDIA Ampere GA102 whitepaper (2020).
- RTX 4090: 165 TFLOP/s fp16 tensor with fp32 accumulate; NVIDIA Ada Lovelace whitepaper (2022).
- P100 (SXM2): 21.2 TFLOP/s fp16 (no tensor cores); NVIDIA Tesla P100 datasheet (2016).
- MI250X: 383 TFLOP/s fp16/bf16 matrix; AMD Instinct MI250X datasheet (2021).

Memory (GPU_MEMORY_GIB): the datasheets' "GB" of HBM/GDDR are binary (a "16 GB" V100 holds 16 GiB =
17.18e9 bytes); `gpu_memory_bytes` converts with 2**30. Same datasheets as above: V100 16 GiB
(V100-32GB: 32), A100 40 GiB (A100-80GB: 80, same peak), H100 SXM5 80, H200 141, T4 16, A10/A10G 24,
L4 24, A40 48, L40S 48, RTX 3090 24, RTX 4090 24, P100 16, MI250X 128.
"""

from __future__ import annotations

from geotrain.errors import GeotrainError

GPU_PEAK_TFLOPS: dict[str, float] = {
    "V100": 125.0,
    "V100-32GB": 125.0,
    "A100": 312.0,
    "A100-80GB": 312.0,
    "H100": 989.0,
    "H200": 989.0,
    "T4": 65.0,
    "A10": 125.0,
    "A10G": 125.0,
    "L4": 121.0,
    "A40": 149.7,
    "L40S": 362.0,
    "RTX3090": 71.0,
    "RTX4090": 165.0,
    "P100": 21.2,
    "MI250X": 383.0,
}

GPU_MEMORY_GIB: dict[str, float] = {
    "V100": 16.0, "V100-32GB": 32.0, "A100": 40.0, "A100-80GB": 80.0, "H100": 80.0, "H200": 141.0, "T4": 16.0,
    "A10": 24.0, "A10G": 24.0, "L4": 24.0, "A40": 48.0, "L40S": 48.0, "RTX3090": 24.0, "RTX4090": 24.0,
    "P100": 16.0, "MI250X": 128.0,
}

class UnknownGpuError(GeotrainError, ValueError):
    """A device names a GPU type whose peak throughput is not in the table."""


UNKNOWN_GPU = "unknown"
"""A device's GPU type when its file does not give one (no peak, no memory: the compute models refuse it)."""


def _key(name: str) -> str:
    return name.upper().replace(" ", "").replace("-", "").replace("_", "")


_BY_KEY = {_key(name): tflops for name, tflops in GPU_PEAK_TFLOPS.items()}


def gpu_peak_flops(name: str) -> float:
    """Peak dense fp16 FLOP/s of GPU type `name` (case, spaces and dashes ignored: "rtx-3090" works)."""
    try:
        return _BY_KEY[_key(name)] * 1e12
    except KeyError:
        known = ", ".join(sorted(GPU_PEAK_TFLOPS))
        raise UnknownGpuError(f"unknown GPU type {name!r}: give each device a gpu from {known}") from None


_MEMORY_BY_KEY = {_key(name): gib for name, gib in GPU_MEMORY_GIB.items()}


def gpu_memory_bytes(name: str) -> float:
    """Memory of GPU type `name` in bytes (datasheet GiB x 2**30); same name rules as gpu_peak_flops."""
    try:
        return _MEMORY_BY_KEY[_key(name)] * 2.0**30
    except KeyError:
        known = ", ".join(sorted(GPU_MEMORY_GIB))
        raise UnknownGpuError(f"unknown GPU type {name!r}: give each device a gpu from {known}") from None


def known_gpu_types() -> str:
    """The GPU types a cluster file may name, as a message lists them."""
    return ", ".join(sorted(GPU_PEAK_TFLOPS)) + f" (or {UNKNOWN_GPU})"


def check_gpu_type(name: str) -> None:
    """UnknownGpuError unless `name` is a GPU type of the table (its name rules) or `unknown`."""
    if name != UNKNOWN_GPU and _key(name) not in _BY_KEY:
        raise UnknownGpuError(f"unknown GPU type {name!r} (known: {known_gpu_types()})")


def gpu_type_of(device_name: str) -> str:
    """The table's GPU type in a device name as CUDA reports it ("NVIDIA H100 80GB HBM3" -> "H100", "Tesla T4"
    -> "T4"): the longest type whose name it contains; `unknown` when it contains none."""
    key = _key(device_name)
    found = [name for name in GPU_PEAK_TFLOPS if _key(name) in key]
    return max(found, key=lambda name: len(_key(name))) if found else UNKNOWN_GPU


def memory_text(nbytes: float) -> str:
    """GPU memory for people: whole GB from 10 GB up (a datasheet's "17 GB"), else 3 significant digits."""
    return f"{nbytes / 1e9:.0f} GB" if nbytes >= 1e10 else f"{nbytes / 1e9:.3g} GB"
