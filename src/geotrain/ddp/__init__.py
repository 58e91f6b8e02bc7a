"""Codecs as torch.distributed communication: DDP comm hooks, byte accounting, a process launcher."""

from geotrain.ddp.accounting import CommLedger, intercept_torch_collectives, wire_bytes
from geotrain.ddp.hooks import CodecHookState, codec_hook, register_codec_hook
from geotrain.ddp.launch import WorkerFailure, run_workers

__all__ = [
    "CodecHookState",
    "CommLedger",
    "WorkerFailure",
    "codec_hook",
    "intercept_torch_collectives",
    "register_codec_hook",
    "run_workers",
    "wire_bytes",
]
