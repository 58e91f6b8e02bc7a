"""runtime.shard_state: a sharded slot's DTensors written as local shards with their placement, read back with
torch.load(weights_only=True) and rebuilt on the mesh, refused on another mesh or shard; AdamW's DTensor moments
survive the round trip (the same next step). A real gloo group of one rank holds a 1-rank mesh; the 2-rank slots of a
sharded plan are tests/integration/runtime/test_runtime_sharded_resume.py's."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist

from geotrain.runtime.shard_state import LOCAL, local_state, sharded_state


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    from torch.distributed.device_mesh import init_device_mesh

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _dtensor(mesh, values: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(values, mesh, [Shard(0)])


def _round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_dtensor_is_saved_as_its_local_shard_and_rebuilt_on_the_mesh(mesh):
    weight = _dtensor(mesh, torch.arange(6.0).reshape(3, 2))
    saved = _round_trip(local_state({"w": weight, "step": torch.tensor(2.0), "n": 3, "list": [weight]}))
    record = saved["w"]
    assert torch.equal(record[LOCAL], torch.arange(6.0).reshape(3, 2))
    assert (record["shape"], record["placements"], record["mesh"], record["coordinate"]) == ([3, 2], [["shard", 0]],
                                                                                            [1], [0])
    rebuilt = sharded_state(saved, mesh)
    for tensor in (rebuilt["w"], rebuilt["list"][0]):
        assert tensor.placements == weight.placements and tensor.shape == weight.shape
        assert torch.equal(tensor.full_tensor(), weight.full_tensor())
    assert rebuilt["n"] == 3 and torch.equal(rebuilt["step"], torch.tensor(2.0))


def test_a_state_without_dtensors_is_returned_as_it_is():
    state = {"anchor": [torch.ones(2)], "optimizer": {"state": {0: {"step": torch.tensor(1.0)}}}}
    assert local_state(state) is state and sharded_state(state, None) == state


def test_a_shard_of_another_mesh_or_coordinate_or_an_unsharded_run_is_refused(mesh):
    record = local_state(_dtensor(mesh, torch.ones(4)))
    with pytest.raises(ValueError, match=r"cut for a mesh of \[2\] ranks, this slot's mesh is \[1\]"):
        sharded_state({**record, "mesh": [2]}, mesh)
    with pytest.raises(ValueError, match=r"the saved shard is coordinate \[1\] of its mesh, this rank holds \[0\]"):
        sharded_state({**record, "coordinate": [1]}, mesh)
    with pytest.raises(ValueError, match=r"FSDP2 shards on a mesh of \[1\] ranks; this run's slots are not sharded"):
        sharded_state({"w": record}, None)


def test_adamws_dtensor_moments_round_trip_to_the_same_next_step(mesh):
    def stepped(optimizer, param) -> None:
        (param ** 3).sum().backward()  # DTensor ops take scalars, not plain tensors
        optimizer.step()
        optimizer.zero_grad()

    param = torch.nn.Parameter(_dtensor(mesh, torch.linspace(-1, 1, 4)))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    stepped(optimizer, param)
    saved = _round_trip(local_state(optimizer.state_dict()))
    assert LOCAL in saved["state"][0]["exp_avg"] and LOCAL in saved["state"][0]["exp_avg_sq"]
    copy = torch.nn.Parameter(_dtensor(mesh, param.full_tensor().detach().clone()))
    resumed = torch.optim.AdamW([copy], lr=0.1)
    resumed.load_state_dict(sharded_state(saved, mesh))
    stepped(optimizer, param)
    stepped(resumed, copy)
    assert torch.equal(copy.full_tensor(), param.full_tensor())  # moments and step count carried over
