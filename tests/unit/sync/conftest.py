"""Fixtures shared by the geotrain.sync unit tests."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """A real gloo process group of one rank (the reducers' TorchCollective needs one)."""
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
