"""Gradient synchronisation of a stage's data-parallel group: one interface (`GradientSync`), its
implementations (every step, every step delayed, 1-bit Adam, local SGD / DiLoCo) and the factory that picks one from
typed options. See docs/history/comm.md ("Gradient synchronisation")."""

from geotrain.sync.base import DPExchange, GradientSync, SyncError, SyncResult
from geotrain.sync.delayed import DelayedPerStepSync
from geotrain.sync.exchange import DirectTransport, StageExchange, timed_collective
from geotrain.sync.factory import BETAS, WEIGHT_DECAY, make_gradient_sync
from geotrain.sync.hierarchical import HierarchicalGradientExchange
from geotrain.sync.onebit import OneBitAdamSync
from geotrain.sync.options import (DPGroup, ExchangeOptions, HeterogeneityOptions, OuterOptions, StreamingOptions,
                                   SyncOptions)
from geotrain.sync.outer import OuterSync
from geotrain.sync.per_step import PerStepSync
from geotrain.sync.streaming import StreamingOuterSync, fragment_due, split_fragments

__all__ = [
    "BETAS",
    "DPExchange",
    "DPGroup",
    "DelayedPerStepSync",
    "DirectTransport",
    "ExchangeOptions",
    "GradientSync",
    "HeterogeneityOptions",
    "HierarchicalGradientExchange",
    "OneBitAdamSync",
    "OuterOptions",
    "OuterSync",
    "PerStepSync",
    "StageExchange",
    "StreamingOptions",
    "StreamingOuterSync",
    "SyncError",
    "SyncOptions",
    "SyncResult",
    "WEIGHT_DECAY",
    "fragment_due",
    "make_gradient_sync",
    "split_fragments",
    "timed_collective",
]
