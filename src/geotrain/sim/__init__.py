"""The in-process simulator of the seed's compression demo: data-parallel training with p simulated
workers in one process, gradients compressed by a codec (`geotrain train` runs geotrain.runtime instead)."""

from geotrain.sim.config import DEFAULT_LR, TrainConfig, TrainingConfigError, TrainingResult
from geotrain.sim.exchange import Exchanged, GradientExchange
from geotrain.sim.loop import ProgressCallback, UpdateRuleFactory, codec_update_rule, train_compressed, worker_gradients
from geotrain.sim.parallel import ProgressFactory, TrainingJob, train_many
from geotrain.sim.update import ExchangeThenStep, UpdateRule, assign_flat_grad, make_optimizer

__all__ = [
    "DEFAULT_LR",
    "ProgressCallback",
    "ProgressFactory",
    "TrainingJob",
    "UpdateRuleFactory",
    "train_many",
    "ExchangeThenStep",
    "Exchanged",
    "GradientExchange",
    "TrainConfig",
    "TrainingConfigError",
    "TrainingResult",
    "UpdateRule",
    "assign_flat_grad",
    "codec_update_rule",
    "make_optimizer",
    "train_compressed",
    "worker_gradients",
]
