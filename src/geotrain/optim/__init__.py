"""Optimizers that do their own gradient communication (through geotrain.comm): 1-bit Adam over
simulated or real workers."""

from geotrain.optim.onebit_adam import OneBitAdam, OneBitAdamError
from geotrain.optim.rule import OneBitAdamRule, OneBitAdamRuleFactory, onebit_update_rule

__all__ = [
    "OneBitAdam",
    "OneBitAdamError",
    "OneBitAdamRule",
    "OneBitAdamRuleFactory",
    "onebit_update_rule",
]
