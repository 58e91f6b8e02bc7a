"""The optimizers geotrain steps with, by name: one table, and which trainer runs each.

Two trainers read it: `geotrain train` (geotrain.runtime: `--optimizer`, RuntimeConfig.optimizer) and
the in-process simulator of the compression demo (geotrain.sim: TrainConfig.optimizer). They run
different subsets: the runtime's choice is how a stage averages and steps (1-bit Adam does its own
exchange); the simulator's is the torch optimizer it steps after its simulated exchange.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerInfo:
    """One optimizer: `summary` says what a step does; `runtime` / `sim`: whether geotrain train /
    the simulator (geotrain.sim) run it."""

    summary: str
    runtime: bool
    sim: bool


OPTIMIZERS: dict[str, OptimizerInfo] = {
    "adamw": OptimizerInfo(
        "torch AdamW (decoupled weight decay) after the DP exchange of the gradients (--dp-codec; the "
        "simulator: its codec), clipped first when asked", runtime=True, sim=True),
    "onebit-adam": OptimizerInfo(
        "geotrain.optim.OneBitAdam: averages over the stage's DP group itself, fp32 during its warm-up, "
        "1-bit momenta with error feedback after (Tang et al. 2021)", runtime=True, sim=False),
    "sgd": OptimizerInfo(
        "torch SGD with momentum after the simulated exchange (the seed's error-feedback table)",
        runtime=False, sim=True),
}
"""Optimizer name -> what it does and which trainer runs it."""

RUNTIME_OPTIMIZERS: tuple[str, ...] = tuple(name for name, info in OPTIMIZERS.items() if info.runtime)
"""The optimizers geotrain train runs (RuntimeConfig.optimizer): adamw, onebit-adam."""

SIM_OPTIMIZERS: tuple[str, ...] = tuple(name for name, info in OPTIMIZERS.items() if info.sim)
"""The optimizers the simulator steps (geotrain.sim TrainConfig.optimizer): adamw, sgd."""
