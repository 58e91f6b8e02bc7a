"""One table of optimizers and one of pipeline schedules; each trainer validates against its part."""

from __future__ import annotations

import inspect

import pytest
from torch.distributed.pipelining import schedules

from geotrain.cluster import load_cluster
from geotrain.cost.memory import MODELLED_SCHEDULES, MemoryConfig, MemoryConfigError
from geotrain.optim.registry import OPTIMIZERS, RUNTIME_OPTIMIZERS, SIM_OPTIMIZERS
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.pipeline_schedules import LOOPED_SCHEDULES, PIPELINE_SCHEDULES
from geotrain.sim import TrainConfig, TrainingConfigError


def _runtime_config(**options):
    return RuntimeConfig.of(load_cluster("seed-datacenter"), [[0, 1], [2, 3]], **options)


def test_each_trainer_runs_its_part_of_the_one_table():
    assert RUNTIME_OPTIMIZERS == ("adamw", "onebit-adam")
    assert SIM_OPTIMIZERS == ("adamw", "sgd")
    assert set(OPTIMIZERS) == set(RUNTIME_OPTIMIZERS) | set(SIM_OPTIMIZERS)
    assert all(len(info.summary) > 40 for info in OPTIMIZERS.values())


def test_the_runtime_refuses_the_simulators_sgd_naming_its_own_choices():
    assert _runtime_config(optimizer="onebit-adam").optim.optimizer == "onebit-adam"
    with pytest.raises(RuntimeConfigError, match="optimizer must be one of adamw, onebit-adam, got 'sgd'"):
        _runtime_config(optimizer="sgd")


def test_the_simulator_refuses_onebit_adam_as_its_torch_optimizer():
    assert TrainConfig(optimizer="sgd").peak_lr == 0.3
    with pytest.raises(TrainingConfigError, match="optimizer must be one of adamw, sgd, got 'onebit-adam'"):
        TrainConfig(optimizer="onebit-adam")


def test_pipeline_schedules_name_torch_classes_and_the_looped_ones_take_a_list_of_stages():
    assert list(PIPELINE_SCHEDULES) == ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs"]
    assert LOOPED_SCHEDULES == ("interleaved-1f1b", "looped-bfs")
    for schedule in PIPELINE_SCHEDULES.values():
        base = schedules.PipelineScheduleMulti if schedule.looped else schedules.PipelineScheduleSingle
        assert issubclass(schedule.torch_class, base) and inspect.isclass(schedule.torch_class)
    with pytest.raises(RuntimeConfigError, match="schedule must be one of gpipe, 1f1b, interleaved-1f1b, "
                                                 "looped-bfs, got 'zb'"):
        _runtime_config(schedule="zb")


def test_the_cost_models_know_a_named_subset_of_the_pipeline_schedules():
    assert set(MODELLED_SCHEDULES) < set(PIPELINE_SCHEDULES)
    with pytest.raises(MemoryConfigError, match="--schedule must be one of 1f1b, gpipe, got 'looped-bfs'"):
        MemoryConfig(schedule="looped-bfs")
