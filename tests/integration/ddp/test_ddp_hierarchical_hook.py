"""The hierarchical reducer as a DDP comm hook, in 4 real gloo processes (2 regions of 2)."""

import torch
from hier_workers import train_with_hierarchical_hook

from geotrain.comm import run_workers

REGIONS = [[0, 1], [2, 3]]


def test_hook_with_codec_none_trains_like_plain_ddp():
    plain = run_workers(train_with_hierarchical_hook, 4, (None, "none", 3), timeout_s=120)
    hier = run_workers(train_with_hierarchical_hook, 4, (REGIONS, "none", 3), timeout_s=120)
    for p, h in zip(plain, hier, strict=True):
        assert torch.allclose(p["params"], h["params"], atol=1e-5, rtol=0)  # only the summation order differs
    assert all(torch.equal(h["params"], hier[0]["params"]) for h in hier)


def test_hook_with_sign_and_error_feedback_trains_keeps_ranks_identical_and_counts_bytes():
    hier = run_workers(train_with_hierarchical_hook, 4, (REGIONS, "sign", 8), timeout_s=120)
    assert all(torch.equal(h["params"], hier[0]["params"]) for h in hier)
    losses = [sum(h["losses"][i] for h in hier) / 4 for i in range(8)]
    assert losses[-1] < losses[0] - 0.05
    for h in hier:
        assert (h["intra"], h["inter"]) == (h["expected_intra"], h["expected_inter"])
        assert h["calls"] == 8
        assert h["inter"] * 20 < h["intra"]  # 1 bit per value between regions, 2 x 32 bits inside
