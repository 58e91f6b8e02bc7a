"""The serving rule and the clock board of asynchronous DiLoCo on emulated links (geotrain.sync.async_timing)."""

from __future__ import annotations

import math

import numpy as np
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from geotrain.cluster.io import parse_cluster_text
from geotrain.emulate.clock import RankClock
from geotrain.emulate.network import EmulatedNetwork
from geotrain.emulate.state import EmulationState
from geotrain.sync.async_timing import ASYNC_OP, ClockBoard, LinkTimer, next_due

times = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)


@given(st.lists(times, max_size=6), st.lists(times, max_size=6))
def test_the_earliest_request_is_served_once_no_client_can_still_send_an_earlier_one(arrivals, horizons):
    pending = [(t, f"request {i}") for i, t in enumerate(arrivals)]
    due = next_due(pending, horizons)
    if not pending or min(arrivals) > min(horizons, default=math.inf):
        assert due is None
    else:
        assert arrivals[due] == min(arrivals) and arrivals[due] <= min(horizons, default=math.inf)


def test_a_later_request_waits_for_a_slower_client_and_ties_are_served():
    pending = [(2.0, "fast client's"), (1.5, "another's")]
    assert next_due(pending, [1.2]) is None  # a client at 1.2 (clock + latency) may still arrive before 1.5
    assert next_due(pending, [1.5]) == 1
    assert next_due(pending, []) == 1  # every other client is blocked or done


def test_the_board_publishes_each_clock_forward_only_and_reads_unpublished_ones_as_minus_infinity():
    store = dist.HashStore()
    writer, reader = ClockBoard(store, "srv"), ClockBoard(store, "srv")
    writer.publish(1, 2.5)
    assert reader.read([1, 2]) == {1: 2.5, 2: -math.inf}
    writer.publish(1, 1.0)  # a clock set back (an evaluation outside emulated time) keeps its bound
    writer.publish(2, 0.25)
    assert reader.read([1, 2]) == {1: 2.5, 2: 0.25}
    writer.publish(2, 3.0)
    assert reader.read([2, 1]) == {2: 3.0, 1: 2.5}


TWO_REGIONS = """
name: two-regions
regions:
  - {name: a, devices: 1, gpu: A100}
  - {name: b, devices: 1, gpu: A100}
links:
  - {between: [a, b], gbps: 0.1, ms: 50}
"""


def test_a_message_arrives_one_latency_after_its_last_byte_and_is_recorded_by_its_sender():
    network = EmulatedNetwork.from_cluster(parse_cluster_text(TWO_REGIONS), time_scale=0.0)
    state = EmulationState(network, (0, 1), 0, RankClock(0.0))
    timer = LinkTimer.for_server(state)
    first = timer.send(0, 1, 1.25e6, at_s=1.0)  # 10 Mbit over 100 Mbit/s: 0.1 s, then 50 ms
    second = timer.send(0, 1, 1.25e6, at_s=1.0)  # queued behind the first on the link
    assert np.isclose(first, 1.15) and np.isclose(second, 1.25)
    sent = [t for t in state.transfers if t.op == ASYNC_OP]
    assert [(t.src_rank, t.dst_rank, t.nbytes) for t in sent] == [(0, 1, 1.25e6)] * 2
    assert np.isclose(sent[1].start_s, 1.1) and np.isclose(sent[1].end_s, 1.25)
    assert timer.send(0, 0, 1e9, at_s=2.0) == 2.0 and len(state.transfers) == 2  # same device: no link, no record
