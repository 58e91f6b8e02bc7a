"""CPU seconds one outer sync's codecs take, measured on this machine, per synchronised value.

The WAN recipe's cost model (geotrain.cost.wan_recipe) prices a sync by its links; the codecs' own work
runs on each rank's training thread and hides behind nothing: at a sync's start every rank encodes its
outer gradient with error feedback (encode, then decode its own payload for the residual), and where it
lands it decodes and sums the payloads of all `replicas` ranks. With moment sync (geotrain.sync.moments)
the first moment travels the same way and the second through its own codec, in the same payload.

`sync_codec_seconds_per_value` runs exactly that work (the runtime's reducers: comm.CodecReducer, or
comm.GroupedCodecReducer with moment sync) on `sample` random values, every rank's payload standing in
for this one's (a loopback gather: no link is involved), with one torch thread as a rank has (the runtime's
default `--threads 1`; the caller's count is restored), and returns the best of `repeats` runs' CPU seconds
of this thread (time.thread_time: other processes and idle or spinning threads add nothing) per value. Linear in the values, so a fragment of V values costs V times it.
On bench wan's tiny GPT (871,168 values, 4 replicas; 2026-12-05, quiet machine): int8-block 5 ms per sync,
int4-block 12 ms, int8-block with moment sync 23-27 ms, int4-block with moment sync 37 ms, against 0.083-0.094
s of compute per step. (Timed first by process_time with torch's own thread count: 6-14, 25, 49-62 and 79-82
ms, idle threads' spinning included, and 5x off under load. bench wan's 4 ranks on 2 cores pay more than one
quiet thread: the moment-sync recipe then measured 0.1109 s per step against 0.1002 predicted.) A summable codec without
moment sync (none) is all-reduced: its CPU is a division, priced 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

SAMPLE_VALUES = 1 << 20
"""Values timed per codec (a fragment of another size is priced linearly)."""


class _Loopback:
    """A collective whose gather returns this rank's payload as every rank's (the CPU of decoding is the same)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def all_gather(self, tensors: Any) -> Any:
        return tensors[0].repeat(self.world_size)


def sync_codec_seconds_per_value(codec: str, replicas: int, sync_moments: bool = False,
                                 sample: int = SAMPLE_VALUES, repeats: int = 3) -> float:
    """CPU seconds per value of one outer sync's codec work on this machine (module doc); 0 for a summable
    codec without moment sync. `replicas` >= 1 ranks' payloads decoded; `sample` >= 1 values timed."""
    import torch

    from geotrain.codecs import CodecSpec
    from geotrain.comm import reducer_traits
    from geotrain.comm.codec_reducer import CodecReducer
    from geotrain.sync.exchange import ExtraTensors, grouped_reducer
    from geotrain.sync.moments import moment_parts

    if replicas < 1 or sample < 1 or repeats < 1:
        raise ValueError(f"replicas, sample and repeats must be >= 1, got {replicas}, {sample}, {repeats}")
    spec = CodecSpec.parse(codec)
    if not sync_moments and not reducer_traits(spec).gathered:
        return 0.0
    generator = torch.Generator().manual_seed(0)
    delta = torch.randn(sample, generator=generator) * 1e-3
    tensors = [delta]
    if sync_moments:  # the runtime's layout: the outer gradients, then the moments' parts (sync.moments)
        tensors = [delta, torch.randn(sample, generator=generator) * 1e-3,
                   torch.rand(sample, generator=generator) * 1e-6]
        named = [[(name, torch.nn.Parameter(t, requires_grad=False))]
                 for name, t in zip(("delta", "exp_avg", "exp_avg_sq"), tensors, strict=True)]
        reducer: Any = grouped_reducer([ExtraTensors(named[0], spec, True),
                                        *moment_parts((named[1], named[2]), spec, True)], replicas)
    else:
        reducer = CodecReducer(spec.build(), [("delta", (sample,))], replicas)
    collective = _Loopback(replicas)
    best = float("inf")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(repeats + 1):  # the first run loads kernels and allocates: not timed
            started = time.thread_time()
            reducer.reduce([tensors], collective, step)
            if step:
                best = min(best, time.thread_time() - started)
    finally:
        torch.set_num_threads(threads)
    return best / sample


def sync_codec_seconds_by_codec(codecs: Sequence[str], replicas: int, sync_moments: bool = False,
                                sample: int = SAMPLE_VALUES) -> dict[str, float]:
    """`sync_codec_seconds_per_value` of each codec (the WAN recipe's `codec_s_per_value`)."""
    return {codec: sync_codec_seconds_per_value(codec, replicas, sync_moments, sample) for codec in codecs}
