"""An asynchronous run's step arithmetic (geotrain.sync.async_step) and what its resume refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from geotrain.sync.async_step import AsyncOuterGradientSync, pause_updates, progress_steps, run_budget


def test_a_checkpoints_update_count_is_the_least_that_reaches_its_step():
    """R = 2 replicas, H = 3: step 12 is reached at ceil(12 x 2 / 3) = 8 outer gradients, step 7 at 5 (progress 6 at
    4); the budget of 30 steps is 20."""
    assert [pause_updates(c, 3, 2) for c in (6, 7, 12)] == [4, 5, 8]
    assert [progress_steps(u, 3, 2) for u in (4, 5, 8)] == [6, 7, 12]
    assert all(progress_steps(pause_updates(c, 3, 2) - 1, 3, 2) < c for c in range(1, 30))
    assert run_budget(30, 3, 2) == 20


def test_a_non_elastic_resume_from_an_elastic_asynchronous_checkpoint_is_refused_in_one_line():
    """An elastic run's checkpoint (runtime/elastic/async_checkpoint.py) holds one copy of the global model; a
    non-elastic rank would need its own place and rank 0 the server's clients."""
    state = {"finished": False, "asynchronous": {"elastic": True, "model": torch.zeros(2), "version": 3}}
    with pytest.raises(ValueError) as refused:
        AsyncOuterGradientSync.load_state_dict(SimpleNamespace(), state)  # refused before it touches the sync
    assert str(refused.value).endswith("resume it with --elastic") and "\n" not in str(refused.value)
