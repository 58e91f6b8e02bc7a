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
from geotrain.sync.async_server import Reply, Request
from geotrain.sync.async_timing import ASYNC_OP, ClockBoard, LinkTimer, ServeOrder, next_due
from geotrain.sync.async_wire import MailboxTiming, ServerThread

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


class _ArrivingMailbox:
    """A server's mailbox whose requests arrive (are announced) one by one when the test says so."""

    def __init__(self, timer: LinkTimer) -> None:
        self.name = "follower"
        self.timing = MailboxTiming(None, timer, timer)
        self.announced: list[tuple[float, Request]] = []
        self.replies: list[Reply] = []

    def poll_request(self, index: int) -> tuple[float, Request] | None:
        return self.announced[index] if index < len(self.announced) else None

    def reply(self, reply: Reply) -> None:
        self.replies.append(reply)


def test_another_positions_server_serves_in_the_first_positions_order_each_request_once_it_has_arrived():
    """Replicas of several positions (async_timing): the first position's server (clients 0, 2, 4: replicas 0, 1, 2)
    served replica 2, then 0, then 1; the second position's (clients 1, 3, 5) serves its own requests in that order
    though they arrive 1, 3, 5 in emulated time and 5's last in wall time, each reply at its request's arrival or
    the server's clock if later."""
    store = dist.HashStore()
    lead = ServeOrder(store, "order/region0", [0, 2, 4], lead=True)
    for client in (4, 0, 2):
        lead.record(client)
    network = EmulatedNetwork.from_cluster(parse_cluster_text(TWO_REGIONS), time_scale=0.0)
    timer = LinkTimer.for_server(EmulationState(network, (0, 1), 0, RankClock(0.0)))
    mailbox = _ArrivingMailbox(timer)
    served: list[tuple[int, float]] = []

    def handle(request: Request) -> list[Reply]:
        served.append((request.client, timer.now_s))
        return [Reply(request.client, len(served), len(served), request.gradient, False)]

    follower = ServeOrder(store, "order/region0", [1, 3, 5], lead=False)
    thread = ServerThread(mailbox, handle, lambda: len(served) == 3, order=follower)  # type: ignore[arg-type]
    thread.start()
    mailbox.announced += [(0.1, Request(1, 0, None, 1)), (0.2, Request(3, 0, None, 1))]
    thread.join(timeout=0.3)
    assert thread.is_alive() and served == []  # replica 2's request (client 5) is first and has not arrived
    mailbox.announced.append((0.3, Request(5, 0, None, 1)))
    thread.join(timeout=10)
    assert not thread.is_alive() and thread.error is None
    assert served == [(5, 0.3), (1, 0.3), (3, 0.3)]  # the server's clock never goes back: 1's and 3's leave at 0.3
    assert thread.served_s == [0.3, 0.1, 0.2] and [r.client for r in mailbox.replies] == [5, 1, 3]
