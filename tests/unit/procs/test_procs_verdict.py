"""Verdict.culprit: which rank a failed run names, in order of evidence."""

import signal

from geotrain.procs import EXIT_PEER_LOST, Verdict


def _verdict(codes, first, stopped=()):
    return Verdict(tuple(codes), first, frozenset(stopped), False, tuple(range(len(codes))), 1.0, "")


def test_a_run_without_failure_has_no_culprit():
    assert _verdict([0, 0], None).culprit() is None


def test_the_rank_that_failed_on_its_own_is_named_before_a_hung_one():
    rank, how = _verdict([0, 3, -signal.SIGTERM], 1, stopped=[2]).culprit()
    assert rank == 1 and "3" in how


def test_a_hung_rank_is_named_before_a_rank_that_only_lost_its_peer():
    rank, how = _verdict([EXIT_PEER_LOST, -signal.SIGKILL, -signal.SIGKILL], 0, stopped=[2, 1]).culprit()
    assert (rank, how) == (1, "stopped responding (hung; killed by the launcher)")


def test_with_only_peer_losses_the_first_is_named():
    rank, how = _verdict([0, EXIT_PEER_LOST], 1).culprit()
    assert rank == 1 and str(EXIT_PEER_LOST) in how


def test_a_signal_is_described_by_name():
    rank, how = _verdict([-signal.SIGKILL, 0], 0).culprit()
    assert rank == 0 and "SIGKILL" in how
