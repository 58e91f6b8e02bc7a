"""GPU peak throughput and memory for the cost models: the table lives with the GPU types a cluster file may
name (geotrain.cluster.gpus: datasheet sources, name rules); DEFAULT_UTILISATION is the cost models' own.
"""

from __future__ import annotations

from geotrain.cluster.gpus import GPU_MEMORY_GIB, GPU_PEAK_TFLOPS, UnknownGpuError, gpu_memory_bytes, gpu_peak_flops

DEFAULT_UTILISATION = 0.4
"""Fraction of peak a training step sustains (the seed's figure for V100)."""

__all__ = ["DEFAULT_UTILISATION", "GPU_MEMORY_GIB", "GPU_PEAK_TFLOPS", "UnknownGpuError", "gpu_memory_bytes",
           "gpu_peak_flops"]
