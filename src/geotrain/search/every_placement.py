"""Every placement of a small problem, scored: the optimum by enumeration (a proof, like exact's certificate).

A problem of S x R slots on N devices has N! / (N - S R)! placements (injective maps of slots to devices). When
that is at most `MAX_PLACEMENTS`, scoring them all in batches costs less than one genetic run (120 children x
2000 swaps) and is optimal by construction, for any cost model, pairwise or not. The placements are scored in
lexicographic order of their flattened assignments (stage-major), and the first cheapest is kept: among equally
cheap plans, the one with the lowest device numbers first.
"""

from __future__ import annotations

import math
import time
from itertools import islice, permutations

import numpy as np

from geotrain.search.base import PlacementProblem, SearchResult

MAX_PLACEMENTS = 5040
"""The most placements `every_placement_search` scores (7!: all of a 7-device problem, or 4 slots on 8 devices)."""

_BATCH = 1024


def placement_count(n_devices: int, slots: int) -> int:
    """N! / (N - slots)!: the placements of `slots` slots on `n_devices` devices (0 when they do not fit)."""
    return math.perm(n_devices, slots) if 0 <= slots <= n_devices else 0


def enumerable(problem: PlacementProblem) -> bool:
    """Whether `problem` has at most MAX_PLACEMENTS placements (and at least one)."""
    return 0 < placement_count(problem.n_devices, problem.stages * problem.replicas) <= MAX_PLACEMENTS


def every_placement_search(problem: PlacementProblem) -> SearchResult:
    """The cheapest of every placement of `problem` (module doc), its total as the proven lower bound."""
    start = time.perf_counter()
    model, shape = problem.cost_model, (problem.stages, problem.replicas)
    orders = permutations(range(problem.n_devices), problem.stages * problem.replicas)
    best_assignment, best_total, scored = None, math.inf, 0
    while batch := list(islice(orders, _BATCH)):
        candidates = np.asarray(batch, dtype=np.int64).reshape(len(batch), *shape)
        scores = np.asarray(model.evaluate_many(candidates), dtype=float)
        i = int(np.argmin(scores))
        if scores[i] < best_total:
            best_total, best_assignment = float(scores[i]), candidates[i]
        scored += len(batch)
    assert best_assignment is not None, "every_placement_search needs an enumerable problem"
    cost = model.evaluate(best_assignment)
    return SearchResult(method="every-placement", assignment=best_assignment, cost=cost,
                        seconds=time.perf_counter() - start, evaluations=scored,
                        details={"placements": scored}, lower_bound=cost.total)
