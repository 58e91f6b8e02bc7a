"""The composition table (runtime/composition.py) walked at config validation, in process: every pair of train
settings the table refuses is refused by RuntimeConfig with the table's one line, and every pair it lets run
builds a config. `--device cuda` cells are checked here only (torch is told a GPU is there: the refusal, not
a GPU, is tested). The running cells' launches are the integration tests' (see the mapping below)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.cluster.io import parse_cluster_text
from geotrain.comm import check_reducer_spec
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.composition import RULES, SETTING, SETTINGS, pair_refusal, pairs, walk_values, with_needs
from runtime_2x2 import CLUSTER_YAML

CLUSTER = parse_cluster_text(CLUSTER_YAML)  # 2 regions x 2 V100: speeds known, regions for async-hierarchical
PLANS = {1: np.array([[0, 2]]), 2: np.array([[0, 2], [1, 3]])}  # 1 x 2 and 2 x 2, replicas across the regions
SHARDS = {1: np.array([[[0, 1], [2, 3]]])}
"""The 1 x 2 plan's 2 devices per slot ("shards"), each slot in one region."""
SHARDED_PIPELINE = (parse_cluster_text(CLUSTER_YAML.replace("devices: 2", "devices: 4")),
                    np.array([[0, 4], [2, 6]]), np.array([[[0, 1], [4, 5]], [[2, 3], [6, 7]]]))
"""A sharded plan of 2 stages needs 8 devices: the same 2 regions of 4, each slot's 2 in one region."""
CELLS = [(a.name, b.name) for a, b in pairs()]


def _config(first: str, second: str, tmp_path) -> RuntimeConfig:
    stages, values = walk_values(SETTING[first], SETTING[second])
    base = {"time_scale": 0.0, "checkpoint_dir": str(tmp_path), "steps": 8}
    k = values.pop("shards", 1)
    if k > 1 and stages > 1:
        cluster, plan, shards = SHARDED_PIPELINE
        return RuntimeConfig.of(cluster, plan, shards=shards, **{**base, **values})
    shards = SHARDS[stages] if k > 1 else None
    return RuntimeConfig.of(CLUSTER, PLANS[stages], shards=shards, **{**base, **values})


CHECKED_SPECS: set[str] = set()


def _check_spec_once(spec) -> None:
    """geotrain.comm.check_reducer_spec (it builds the reducer: ~80 ms of warm-up), once per distinct spec."""
    if str(spec) not in CHECKED_SPECS:
        check_reducer_spec(spec)
        CHECKED_SPECS.add(str(spec))


@pytest.fixture(autouse=True)
def _a_gpu_is_there_and_codecs_checked_once(monkeypatch):
    import geotrain.runtime.sections as sections
    import geotrain.sync.options as options

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sections, "check_reducer_spec", _check_spec_once)
    monkeypatch.setattr(options, "check_reducer_spec", _check_spec_once)


def test_every_setting_runs_alone(tmp_path):
    for setting in SETTINGS:
        _config(setting.name, setting.name, tmp_path)


@pytest.mark.parametrize("first, second", CELLS, ids=[f"{a}+{b}" for a, b in CELLS])
def test_each_cell_is_refused_with_its_rules_one_line_or_builds(first, second, tmp_path):
    rule = pair_refusal(first, second)
    if rule is None:
        config = _config(first, second, tmp_path)
        assert SETTING[first].on(config) and SETTING[second].on(config)
        return
    with pytest.raises(RuntimeConfigError) as refused:
        _config(first, second, tmp_path)
    text = str(refused.value)
    assert "\n" not in text and text.endswith(rule.reason + (f"; {rule.instead}" if rule.instead else ""))
    assert (" not built yet: " in text) == (not rule.built)


def test_every_rule_names_two_known_settings_once_and_speaks_for_some_cell():
    assert all(rule.first in SETTING and rule.second in SETTING and rule.first != rule.second for rule in RULES)
    assert len({frozenset((r.first, r.second)) for r in RULES}) == len(RULES)
    speaking = {pair_refusal(a, b) for a, b in CELLS}
    # a rule whose pair is shadowed in the table (its settings need another refused one) still guards configs:
    # --sync-delay without --sync-every (delayed gradients) with 1-bit Adam
    assert {r for r in RULES if r not in speaking} == {r for r in RULES if (r.first, r.second) == ("onebit", "delay")}


def test_the_message_names_the_flags_and_their_values(tmp_path):
    with pytest.raises(RuntimeConfigError, match=r"^--outer-sync async with --sync-delay 1: asynchronous outer "
                                                 r"updates send a replica's outer gradient"):
        _config("async", "delay", tmp_path)


def test_needs_bring_diloco_with_streaming_adaptive_and_async():
    assert with_needs(("fragments", "async")) == {"fragments", "async", "diloco"}
    assert pair_refusal("batch-shares", "adaptive").second == "diloco"  # through what --local-steps needs


@pytest.mark.parametrize("stages, shards", [(2, None), (1, SHARDS[1])])
def test_async_with_stages_or_shards_runs_on_emulated_links_and_plain_ones(stages, shards, tmp_path):
    """Beside the lifted cells (async x pipeline, shards x async): on emulated links too, every position's server
    serving in the order the first position's decides (sync/async_timing.py: replicas of several positions)."""
    for time_scale in (1.0, 0.0):
        config = RuntimeConfig.of(CLUSTER, PLANS[stages], shards=shards, steps=8, sync_every=4, outer_sync="async",
                                  time_scale=time_scale, checkpoint_dir=str(tmp_path))
        assert config.emulation.time_scale == time_scale
