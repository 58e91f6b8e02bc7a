"""A dict in place of torch's TCPStore for unit tests of what reads and writes the launcher's link state
(runtime/elastic/links.py: set, get, check)."""

from __future__ import annotations


class DictStore:
    """The three calls of torch's TCPStore the link state uses."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)
