"""JSON on stdout arrives whole at any size: `write_whole` through a pipe whose open file description is
non-blocking (as a process sharing it may leave it), read slowly, in small pieces."""

from __future__ import annotations

import os
import threading
import time

from geotrain.cli.output import write_whole

PIPE_BYTES = 65536  # Linux's default pipe capacity: a bigger write cannot go in one piece


def _slow_reader(fd: int, got: list[bytes], set_nonblocking_again: int | None = None) -> None:
    """Read `fd` to its end, 4 KiB at a time with a pause after each; after the first read, O_NONBLOCK is set
    again on descriptor `set_nonblocking_again` (the writer's), as another process might meanwhile."""
    first = True
    while chunk := os.read(fd, 4096):
        got.append(chunk)
        if first and set_nonblocking_again is not None:
            os.set_blocking(set_nonblocking_again, False)
        first = False
        time.sleep(0.0005)


def _write_through_slow_pipe(data: bytes, again: bool) -> tuple[bytes, bool]:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    got: list[bytes] = []
    reader = threading.Thread(target=_slow_reader, args=(read_end, got, write_end if again else None))
    try:
        reader.start()
        write_whole(write_end, data)
        blocking = os.get_blocking(write_end)
    finally:
        os.close(write_end)
        reader.join(timeout=60)
        os.close(read_end)
    return b"".join(got), blocking


def test_a_large_write_to_a_non_blocking_slow_pipe_arrives_whole_and_leaves_it_blocking():
    data = bytes(range(256)) * 1200  # 307,200 bytes, none repeated at a 4 KiB period: order is checked
    assert len(data) > 4 * PIPE_BYTES
    got, blocking = _write_through_slow_pipe(data, again=False)
    assert len(got) == len(data) and got == data
    assert blocking


def test_a_pipe_set_non_blocking_again_mid_write_still_gets_every_byte():
    data = b"".join(b"%08d\n" % i for i in range(40_000))  # 360,000 bytes of numbered lines
    got, _ = _write_through_slow_pipe(data, again=True)
    assert got == data
    assert got.splitlines()[-1] == b"00039999"
