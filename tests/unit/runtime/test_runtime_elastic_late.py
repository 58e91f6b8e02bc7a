"""A replica group that comes back after the launch's last committed step (runtime/elastic/late.py): its quorum that
healed nothing ends its loop, and it takes a finished peer's final parameters instead of training alone (the split
brain of an adaptive partition whose survivor finished before the heal)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from fake_store import DictStore
from geotrain.runtime.elastic.group import ElasticGroup, GroupState
from geotrain.runtime.elastic.late import RunEnded, load_flat, run_ended, take_final
from geotrain.runtime.elastic.summary import params_path, summary_path

END = 150


class AloneManager:
    """A torchft Manager whose quorum holds this group alone: it hands no peer's state (nothing to heal from)."""

    def start_quorum(self) -> None:
        pass


def late_group(store: DictStore, healed: bool = False) -> SimpleNamespace:
    state = GroupState(step=84)
    manager = AloneManager()
    if healed:
        manager.start_quorum = lambda: setattr(state, "healed", True)  # a peer's state loaded in the quorum
    return SimpleNamespace(state=state, manager=manager, store=store, end=END, rank=1, group=1,
                           cut_off=lambda: False, group_cut_off=lambda: False, _note_rejoin=lambda seconds: None)


def test_a_quorum_that_heals_nothing_after_the_launch_s_last_commit_ends_the_group_s_loop():
    store = DictStore()
    ElasticGroup.quorum(late_group(store))  # the run goes on: an ordinary quorum
    store.set(f"commit/{END - 2}", "[1.0, 0]")
    ElasticGroup.quorum(late_group(store))
    store.set(f"commit/{END - 1}", "[1.0, 0]")  # the survivor committed the last step alone and finished
    assert run_ended(store, END) and not run_ended(store, END + 3)
    with pytest.raises(RunEnded):
        ElasticGroup.quorum(late_group(store))
    ElasticGroup.quorum(late_group(store, healed=True))  # a live peer handed its state: it trains on


def test_a_late_group_takes_the_first_finished_peer_s_final_parameters(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    params = list(model.parameters())
    final = torch.arange(sum(p.numel() for p in params), dtype=torch.float32)
    assert take_final(params, tmp_path, 1, 0, 3, timeout_s=0.0) is None  # nobody finished: untouched
    assert float(params[0].detach().reshape(-1)[0]) != 0.0
    torch.save(final, params_path(tmp_path, 2, 0))  # group 2 finished (its summary is written after its parameters)
    summary_path(tmp_path, 2, 0).write_text(json.dumps({"steps": END, "val_loss": 2.5}))
    assert take_final(params, tmp_path, 1, 0, 3, timeout_s=0.0) == {"steps": END, "val_loss": 2.5}
    assert torch.equal(torch.cat([p.detach().reshape(-1) for p in params]), final)
    with pytest.raises(ValueError, match="final parameters of 3 values for a model of 11"):
        load_flat(params, final[:3])
