"""Checkpoints of sharded replicas (plan --shards 2: 2 sites x 2 shards, FSDP2 in each site, DiLoCo per shard): a run
stopped mid-period (--stop-after 2, a checkpoint every step) and resumed (--resume) ends on the uninterrupted run's
losses and on its weights and sync state, to the bit (the same plan, K and process layout on CPU compute the same
floats in the same order; each rank saves its own shard: runtime/shard_state.py). Streaming DiLoCo (P 2, tau 1) with
int8-block and DiLoCo's outer Nesterov (momentum 0.9): at step 2 fragment 1's exchange is in flight (settled into the
checkpoint), the inner AdamW's moments are DTensors, the outer momentum and the codec's residuals per-shard tensors.
Launches: the stopped run then the resumed one in one process, the uninterrupted run in another beside it
(tests/one_interpreter.py: the second launch of a process skips its seconds of imports); a resume on the unsharded
plan is refused before any worker starts (`geotrain train` in the test's process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from geotrain.cli.main import main as cli_main
from geotrain.runtime import checkpoint as ckpt
from geotrain.runtime.shard_state import LOCAL
from one_interpreter import OneInterpreter, results_of
from runtime_2x2 import CLUSTER_YAML

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]],
           "shards": {"k": 2, "devices": [[[0, 1], [2, 3]]]}}
UNSHARDED = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 2]]}
FLAGS = ("--run-dir", "none", "--steps", "8", "--sync-every", "4", "--fragments", "2", "--sync-delay", "1",
         "--dp-codec", "int8-block", "--time-scale", "0", "--json")
STOP, STEPS, RANKS = 2, 8, 4


def _words(root: Path, plan: str, directory: str, *extra: str) -> list[str]:
    return ["train", "--cluster", str(root / "cluster.yaml"), "--plan", str(root / plan), *FLAGS,
            "--checkpoint-dir", str(root / directory), *extra]


def _reports(processes: list[OneInterpreter]) -> list[dict]:
    """The --json reports of the processes' command lines, in order; each must exit 0."""
    done = [run for results in results_of(processes) for run in results]
    for run in done:
        assert run.returncode == 0, run.stderr
    return [json.loads(run.stdout) for run in done]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sharded-resume")
    (root / "cluster.yaml").write_text(CLUSTER_YAML)
    (root / "sharded.json").write_text(json.dumps(SHARDED))
    (root / "unsharded.json").write_text(json.dumps(UNSHARDED))
    cut = OneInterpreter([_words(root, "sharded.json", "cut", "--checkpoint-every", "1", "--stop-after", str(STOP)),
                          _words(root, "sharded.json", "cut", "--checkpoint-every", "1", "--resume")], root, "cut")
    uninterrupted = OneInterpreter([_words(root, "sharded.json", "ref")], root, "ref")
    stopped, resumed, ref = _reports([cut, uninterrupted])
    return {"root": root, "ref": ref, "stopped": stopped, "resumed": resumed}


def _shards(directory: Path, step: int) -> list[dict]:
    """Every rank's verified shard of the checkpoint of `step` (rank (r K + k): replica r, shard k)."""
    manifest = ckpt.read_manifest(directory, step)
    return [ckpt.load_shard(directory, step, rank, manifest, {"rank": rank, "stage": 0, "replica": rank // 2,
                                                               "shard": rank % 2}) for rank in range(RANKS)]


def _tensors(state, path: str = ""):
    """(path, tensor) of every tensor in a nested state."""
    if isinstance(state, torch.Tensor):
        yield path, state
    elif isinstance(state, dict):
        for key, value in state.items():
            yield from _tensors(value, f"{path}/{key}")
    elif isinstance(state, list | tuple):
        for i, value in enumerate(state):
            yield from _tensors(value, f"{path}/{i}")


def largest_difference(a: list[dict], b: list[dict], part: str) -> float:
    """The largest absolute difference between two checkpoints' `part` ("stage": weights, "dp": the sync's state),
    over every rank's floating-point tensors (both must hold the same tensors)."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        left, right = dict(_tensors(x[part])), dict(_tensors(y[part]))
        assert left.keys() == right.keys()
        worst = max([worst, *(float((left[k].double() - right[k].double()).abs().max()) for k in left
                              if left[k].is_floating_point() and left[k].numel())])
    return worst


def test_a_sharded_run_stopped_mid_period_and_resumed_ends_on_the_uninterrupted_run(runs):
    assert runs["stopped"]["losses"] == runs["ref"]["losses"][:STOP]
    assert len(runs["resumed"]["losses"]) == STEPS and runs["resumed"]["losses"] == runs["ref"]["losses"]
    assert runs["ref"]["losses"][0] - min(runs["ref"]["losses"]) > 0.5  # it trained
    ref, cut = _shards(runs["root"] / "ref", STEPS), _shards(runs["root"] / "cut", STEPS)
    assert all(fragment["outer"]["optimizer"]["state"] for fragment in ref[0]["dp"]["fragments"])  # outer momentum
    assert largest_difference(ref, cut, "stage") == 0.0 and largest_difference(ref, cut, "dp") == 0.0
    assert runs["resumed"]["summary"]["replicas_in_sync"]  # each shard ends equal to its peer at the other site


def test_each_rank_saves_its_own_shard_of_the_weights_moments_and_sync_state(runs):
    shards = _shards(runs["root"] / "cut", STOP)
    for rank, state in enumerate(shards):
        embedding = state["stage"]["0.layers.0.token.weight"]  # FSDP2 cuts dim 0 in K = 2 chunks
        assert (embedding["mesh"], embedding["coordinate"], embedding["placements"]) == ([2], [rank % 2],
                                                                                         [["shard", 0]])
        assert [embedding[LOCAL].shape[0] * 2, *embedding[LOCAL].shape[1:]] == embedding["shape"]
        moments = state["dp"]["optimizer"]["state"][0]
        assert moments["exp_avg"]["coordinate"] == [rank % 2] and moments["exp_avg"][LOCAL].shape == embedding[
            LOCAL].shape
        assert [flight["fragment"] for flight in state["dp"]["in_flight"]] == [1]  # settled at the checkpoint
    halves = [s["stage"]["0.layers.0.token.weight"][LOCAL] for s in shards]
    assert not torch.equal(halves[0], halves[1])  # a slot's two shards hold different rows


def test_resuming_a_sharded_checkpoint_on_another_k_is_refused_in_one_line(runs, capsys):
    root = runs["root"]
    code = cli_main(_words(root, "unsharded.json", "ref", "--resume"))  # in this process: refused before any launch
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == (
        f"geotrain: error: {root / 'ref' / 'step-000008'}: the checkpoint has K = 2 devices per slot (FSDP2 shards), "
        "this plan K = 1: its shards are cut for its K (resume with a plan of K = 2, plan --shards)")
