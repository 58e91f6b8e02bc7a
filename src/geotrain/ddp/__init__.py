"""Codecs as torch.distributed communication: DDP comm hooks, byte accounting, a process launcher."""

from geotrain.ddp.accounting import CommLedger, intercept_torch_collectives, wire_bytes
from geotrain.ddp.hooks import CodecHookState, codec_hook, register_codec_hook
from geotrain.ddp.launch import WorkerFailure, run_workers
from geotrain.ddp.powersgd import PowerSGDConfig, PowerSGDLayout, PowerSGDReducer, compressed_rank
from geotrain.ddp.powersgd_hook import PowerSGDHookState, powersgd_hook, register_powersgd_hook

__all__ = [
    "CodecHookState",
    "CommLedger",
    "PowerSGDConfig",
    "PowerSGDHookState",
    "PowerSGDLayout",
    "PowerSGDReducer",
    "WorkerFailure",
    "codec_hook",
    "compressed_rank",
    "intercept_torch_collectives",
    "powersgd_hook",
    "register_codec_hook",
    "register_powersgd_hook",
    "run_workers",
    "wire_bytes",
]
