"""Optimizers that do their own gradient communication: 1-bit Adam over simulated or real workers."""

from geotrain.optim.collectives import Collective, SimulatedCollective, TorchCollective
from geotrain.optim.onebit_adam import OneBitAdam, OneBitAdamError
from geotrain.optim.onebit_layout import OneBitLayout
from geotrain.optim.rule import OneBitAdamRule, OneBitAdamRuleFactory, onebit_update_rule

__all__ = [
    "Collective",
    "OneBitAdam",
    "OneBitAdamError",
    "OneBitAdamRule",
    "OneBitAdamRuleFactory",
    "OneBitLayout",
    "SimulatedCollective",
    "TorchCollective",
    "onebit_update_rule",
]
