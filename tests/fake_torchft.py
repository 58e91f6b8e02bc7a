"""In-process stand-ins for torchft's Manager and a process group's work handle, for the unit tests of
geotrain.sync.elastic's exchanges (one replica group's view of a quorum, no lighthouse)."""

from __future__ import annotations


class Done:
    """A collective's work handle: `wait()` raises as a lost peer would when `fail`."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def wait(self) -> None:
        if self.fail:
            raise RuntimeError("peer gone (connection reset)")


class FakeManager:
    """A torchft Manager of a quorum of `size` groups in which this one is `rank`: an error reported in a try makes
    its commit refused (so do the first `refused_commits` commits); `start_quorum` counts new quorums (`quorums`)
    and clears the error."""

    def __init__(self, size: int = 1, rank: int = 0, refused_commits: int = 0) -> None:
        self.size, self.rank, self.refused = size, rank, refused_commits
        self.error: Exception | None = None
        self.quorums = 0

    def num_participants(self) -> int:
        return self.size

    def participating_rank(self) -> int:
        return self.rank

    def errored(self):
        return self.error

    def report_error(self, exc: Exception) -> None:
        self.error = exc

    def should_commit(self) -> bool:
        self.refused -= 1
        return self.error is None and self.refused < 0

    def start_quorum(self) -> None:
        self.quorums += 1
        self.error = None
