"""A client's copy of a global model served in fragments (`train --elastic --outer-sync async --fragments P`): what it
sends with a request and how it takes a reply (runtime/elastic/elected.py ElectedLink; the server:
geotrain.sync.async_fragments FragmentServer behind geotrain.sync.async_socket).

The copy (HeldModel) holds the whole model, laid out as the server holds it, and each fragment as of the client's last
reply of that fragment: its values (the model's range `wires[p]`), `versions[p]` (the client's base for its next push
of p), `counts[p]` (the fragment's count of replica outer gradients), the server's applied counts and the running
clients' bases in it. `version` and `updates` are fragment 0's (an election votes on fragment 0's version; a group
stops on fragment 0's count, the replica periods the model holds). An elected host starts each fragment's server from
that fragment's part of its copy (FragmentServer.start_from), so every fragment is as fresh as the copy's last reply
of it, and a resent push is dropped when the copy's applied count of its fragment shows it applied already.

A reply of the whole model (a join's, fragment -1, or the final one) sets every fragment; an acknowledged final push
(a header, no values) sets none: that fragment is finished, and a request after an election gives it no base (the
elected server does not wait for it there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


def fragment_request(held: Any, fragments: int, finished: set[int], acked: Sequence[int]) -> dict[str, Any]:
    """The `base` and `acked` fields of a request from copy `held` (one per fragment; None: a finished fragment)."""
    versions = held.versions or [held.version] * fragments
    return {"base": [None if p in finished else int(versions[p]) for p in range(fragments)], "acked": list(acked)}


def adopted(held: Any, reply: dict[str, Any], wires: Sequence[range]) -> Any:
    """Copy `held` (a HeldModel) after `reply` (module doc): the whole model's, or one fragment's."""
    fragments, fragment = len(wires), int(reply["fragment"])
    applied = {int(c): [int(n) for n in counts] for c, counts in reply["applied"].items()}
    bases = {int(c): ([None if b is None else int(b) for b in per], process)
             for c, (per, process) in reply.get("bases", {}).items()}
    if reply["final"] or fragment < 0 or held.model is None:
        versions, counts = [int(v) for v in reply["versions"]], [int(n) for n in reply["counts"]]
        return dataclasses.replace(held, model=reply["model"], version=versions[0], updates=counts[0],
                                   applied=applied, bases=bases, versions=versions, counts=counts)
    model = held.model.clone()
    wire = wires[fragment]
    model[wire.start:wire.stop] = reply["model"]
    versions, counts = list(held.versions), list(held.counts)
    versions[fragment], counts[fragment] = int(reply["version"]), int(reply["updates"])
    kept_applied = {c: list(n) for c, n in held.applied.items()}
    for c, n in applied.items():
        kept_applied.setdefault(c, [0] * fragments)[fragment] = n[fragment]
    kept_bases: dict[int, tuple[list[int | None], Any]] = {}
    for c in set(held.bases) | set(bases):
        per = list(held.bases[c][0]) if c in held.bases else [None] * fragments
        per[fragment] = bases[c][0][fragment] if c in bases else None  # gone from this fragment: left or finished
        process = bases[c][1] if c in bases else held.bases[c][1]
        if any(b is not None for b in per):
            kept_bases[c] = (per, process)
    return dataclasses.replace(held, model=model, version=versions[0], updates=counts[0], applied=kept_applied,
                               bases=kept_bases, versions=versions, counts=counts)

