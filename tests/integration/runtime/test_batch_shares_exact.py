"""Batch shares are exact: R gloo processes with unequal shares of one global batch, each gradient weighted
by R n_r / N and averaged as the DP exchanges do (the mean of an all-reduce), equal the gradient of one
process holding the whole batch, in float64.

Tolerance (float64, u = 2**-53): every gradient element is a sum over the N x T token terms of the batch
(T tokens per sequence) of products through the model. Batched against unbatched evaluation only regroups
those sums: the forward/backward of each token term is the same sequence of dot products of width at most
K (the widest layer, 4 x d_model), each with a relative error at most K u, and the sum over the N T terms
(plus R terms of the all-reduce and the two scalings) at most (N T + R + 2) u relative to the sum of their
magnitudes. So |g_shares - g_full| <= (K + N T + R + 2) u x S, where S, the sum of magnitudes, is bounded
by N x max_i |g_i| / N = max over sequences of the per-sequence gradient's magnitude (each term carries 1/N).
The unweighted mean with the same shares (the bug this guards against) misses it by ~1e-2 relative.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from geotrain.data import world_tokens
from geotrain.models import MODEL_PRESETS
from geotrain.runtime.batch_shares import gradient_factor, share_offset, weight_gradients
from geotrain.runtime.stages import build_layer_model
from geotrain.runtime.training_data import load_training_data

SHARES = (2, 3, 7)  # N = 12 sequences, as --batch-shares 2,3,7 with --batch-size 4 and 3 replicas
SEQ = 16
SEED, STEP = 5, 3


def _model(vocab: int) -> torch.nn.Sequential:
    model = build_layer_model("tiny", MODEL_PRESETS, 0, vocab, SEQ)
    return torch.nn.Sequential(*model.layers).double()


def _gradient(model: torch.nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> None:
    logits = model(x).double()
    F.cross_entropy(logits.flatten(0, -2), y.flatten()).backward()


def _flat_grad(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.grad.flatten() for p in model.parameters()]).numpy().copy()


def _replica(rank: int, port: int, queue) -> None:
    """One replica's gradient of its share, averaged as the DP exchanges do: weighted by its share, and as the
    plain mean (both from the same local gradient, one process group)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(SHARES))
    try:
        torch.set_num_threads(1)
        data = load_training_data(None, SEED, 0.1)
        model = _model(data.vocab_size)
        x, y = data.share(SEED, STEP, share_offset(SHARES, rank), SHARES[rank], sum(SHARES), SEQ)
        _gradient(model, x, y)
        params = list(model.parameters())
        local = [p.grad.clone() for p in params]
        averaged = {}
        for weighted in (True, False):
            for p, g in zip(params, local):
                p.grad = g.clone()
            if weighted:
                weight_gradients(params, gradient_factor(SHARES, rank))
            for p in params:  # the DP exchanges' mean
                dist.all_reduce(p.grad)
                p.grad /= len(SHARES)
            averaged[weighted] = _flat_grad(model)
        queue.put((rank, averaged))
    finally:
        dist.destroy_process_group()


def _start_replicas() -> tuple[list, object]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_replica, args=(rank, port, queue)) for rank in range(len(SHARES))]
    for proc in procs:
        proc.start()
    return procs, queue


def _sharded_gradients(procs: list, queue) -> dict[bool, np.ndarray]:
    """{weighted: the mean gradient} from the replicas `_start_replicas` started."""
    try:
        grads = dict(queue.get(timeout=120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    means = {}
    for weighted in (True, False):  # every replica holds the same mean
        assert all(np.array_equal(grads[0][weighted], grads[r][weighted]) for r in grads)
        means[weighted] = grads[0][weighted]
    return means


def _full_batch() -> tuple[np.ndarray, float]:
    """The whole batch's gradient in one process, and the bound's scale S (max per-sequence |gradient|)."""
    data = load_training_data(None, SEED, 0.1, world_tokens(SEED))
    model = _model(data.vocab_size)
    n = sum(SHARES)
    x, y = data.share(SEED, STEP, 0, n, n, SEQ)
    _gradient(model, x, y)
    full = _flat_grad(model)
    scale = 0.0
    for i in range(n):
        model.zero_grad(set_to_none=True)
        _gradient(model, x[i:i + 1], y[i:i + 1])
        scale = max(scale, float(np.abs(_flat_grad(model)).max()))
    return full, scale


def _tolerance(scale: float) -> float:
    widest = 4 * MODEL_PRESETS["tiny"].d_model
    return (widest + sum(SHARES) * SEQ + len(SHARES) + 2) * 2.0 ** -53 * scale


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_weighted_shares_give_the_full_batch_gradient_and_the_unweighted_mean_does_not():
    procs, queue = _start_replicas()  # (they start while this process computes the full batch)
    try:
        full, scale = _full_batch()
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    tolerance = _tolerance(scale)
    sharded = _sharded_gradients(procs, queue)
    assert np.abs(sharded[True] - full).max() <= tolerance
    unweighted = sharded[False]  # the bug: a plain mean of unequal shares
    assert np.abs(unweighted - full).max() > 1000 * tolerance
