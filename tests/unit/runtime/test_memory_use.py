"""runtime/memory_use.py: bytes counted by storage (a tied or viewed tensor once), the planner's prediction of a
preset's state per device, and the summary's worst error."""

from __future__ import annotations

import pytest
import torch

from geotrain.runtime.memory_use import memory_summary, predicted_state_bytes, tensor_bytes


def test_a_storage_is_counted_once_however_many_tensors_view_it():
    weight = torch.zeros(10, 4)
    seen: set[int] = set()
    assert tensor_bytes([weight, weight, weight[2:], weight.t()], seen) == 160
    assert tensor_bytes([weight, torch.zeros(3, dtype=torch.float64)], seen) == 24  # seen across calls
    assert tensor_bytes([torch.zeros(0)]) == 0


def test_the_prediction_is_the_planners_state_per_parameter_over_k():
    from geotrain.bench.wan import model_job

    params = model_job(8, "tiny").params
    assert predicted_state_bytes("tiny", 1, 1, False, False, False, 8) == [pytest.approx(16 * params)]
    assert predicted_state_bytes("tiny", 1, 2, True, True, True, 8) == [pytest.approx(28 * params / 2)]
    assert predicted_state_bytes("tiny", 1, 1, True, False, False, 8) == [pytest.approx(20 * params)]
    assert predicted_state_bytes("hf:gpt2", 1, 1, True, True, True, 8) is None


def test_the_summary_keeps_each_ranks_last_record_and_the_worst_error():
    records = [{"rank": 0, "stage": 0, "replica": 0, "step": 0},
               {"rank": 0, "stage": 0, "replica": 0, "step": 1, "memory": {"state": 110, "peak_rss": 900}},
               {"rank": 1, "stage": 0, "replica": 1, "step": 1, "memory": {"state": 95, "peak_rss": 800}}]
    summary = memory_summary(records, [100.0])
    assert [row["rank"] for row in summary["per_rank"]] == [0, 1]
    assert summary["state_error_pct"] == pytest.approx(10.0)
    assert memory_summary(records[:1], [100.0]) is None
    assert memory_summary(records, None)["state_error_pct"] is None


class _Holder:
    """Stands for a sync's own object (its class's module is put in `within`)."""


def test_the_walk_finds_what_a_sync_holds_once_without_copies_and_not_what_it_points_back_at():
    from geotrain.runtime.memory_use import held_tensors
    from geotrain.sync.base import grad_carrier

    anchor, residual, mean = torch.zeros(100), torch.zeros(50), torch.zeros(25)
    carrier = grad_carrier(torch.Size([10, 10]), "cpu")
    carrier.grad = torch.zeros(10, 10)

    def land() -> torch.Tensor:  # an exchange in flight: its tensors live in the closure
        return mean

    land.__module__ = __name__
    holder, foreign = _Holder(), type("Worker", (), {"__module__": "geotrain.runtime.worker"})()
    foreign.data = torch.zeros(1000)  # what the sync points back at (the worker's data): not the sync's
    holder.state = {"anchor": anchor, "again": [anchor, (anchor[10:],)], "carrier": carrier}
    holder.flight = land
    holder.worker, holder.me = foreign, holder  # a cycle too
    found = list(held_tensors(holder, within=(__name__,)))
    assert tensor_bytes(found) == 4 * (100 + 1 + 100 + 25)  # anchor, the carrier's one element, its grad, the mean
    holder.residuals = {residual: residual}  # dict keys are walked (an optimizer's state is keyed by parameters)
    assert tensor_bytes(held_tensors(holder, within=(__name__,))) == 4 * (100 + 1 + 100 + 25 + 50)
    carrier.grad = None  # freed after the landing
    assert tensor_bytes(held_tensors(holder, within=(__name__,))) == 4 * (100 + 1 + 25 + 50)
    assert tensor_bytes(held_tensors(holder, within=("elsewhere.",))) == 0  # not a class of `within`: not entered
