"""Why the planner chose a layout, in words: the plan's "explanation".

`explain_choice` turns ranked options (the chosen first) into a few sentences: the choice and its predicted step,
the next best options with their times against it, and the binding constraint of the choice:
- memory, where devices that are faster than the slowest one used stay idle because their memory cannot hold a
  stage of the layout (or slower ones are left out for memory: the need against their capacity);
- a link, where the step's exposed communication (the step less the busiest replica's compute) is at least
  LINK_BOUND_SHARE of it: the slowest link between the sites the plan uses (with a communication-only cost
  model, always: it says so, and how to weigh compute);
- else a site's compute: the busiest replica's site.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from geotrain.cluster import Cluster
from geotrain.cluster.gpus import UNKNOWN_GPU, memory_text
from geotrain.cost.gpus import gpu_peak_flops

LINK_BOUND_SHARE = 0.2
"""A step whose exposed communication is this share of it or more is called link-bound."""


@dataclass(frozen=True)
class Option:
    """One ranked layout: `label` ("1 x 3"), its assignment (S, R) of device indices, predicted `step_s` (what it is
    ranked by), `compute_s` the busiest replica's compute per step, `memory_bytes` per device, and the scheme."""

    label: str
    assignment: np.ndarray
    step_s: float
    compute_s: float
    memory_bytes: float
    scheme: str
    usd: float | None = None
    """USD for a step's progress (--objective cost: what it is ranked by), None when not priced."""
    rank_s: float | None = None
    """Seconds it is ranked by where not its step: a recipe's predicted time to target per step of per-step DP
    (cost.wan_recipe.charged_step_seconds)."""

    @property
    def ranked_s(self) -> float:
        return self.step_s if self.rank_s is None else self.rank_s


def sites_of(cluster: Cluster, assignment: np.ndarray) -> list[str]:
    """The sites (regions) an assignment uses, in the cluster's order."""
    used = sorted({int(cluster.region_of[int(d)]) for d in np.asarray(assignment).ravel()})
    return [cluster.region_names[g] for g in used]


def binding_constraint(cluster: Cluster, option: Option) -> str:
    """One sentence naming what limits `option` (see the module doc)."""
    used = np.unique(np.asarray(option.assignment).ravel())
    known = UNKNOWN_GPU not in cluster.gpus  # a file without GPU types: no speed or memory to reason with
    peak = np.array([gpu_peak_flops(g) for g in cluster.gpus]) if known else np.ones(cluster.n_devices)
    capacity = cluster.memory_bytes if known else np.full(cluster.n_devices, np.inf)
    idle = np.setdiff1d(np.arange(cluster.n_devices), used)
    small = [d for d in idle if capacity[d] < option.memory_bytes]
    faster_small = [d for d in small if peak[d] > peak[used].min()]
    if faster_small or small:
        kinds = sorted({(cluster.gpus[d], float(capacity[d])) for d in (faster_small or small)})
        named = ", ".join(f"{g} ({memory_text(memory)})" for g, memory in kinds)
        return (f"Memory: {len(faster_small or small)} idle devices ({named}) cannot hold the "
                f"{option.memory_bytes / 1e9:.1f} GB a device of this layout needs.")
    exposed = max(0.0, option.step_s - option.compute_s)
    sites = sites_of(cluster, option.assignment)
    slowest = _slowest_link(cluster, sites)
    if option.compute_s <= 0:  # a communication-only model ("yuan", "ring", "dtfm")
        where = f"; the slowest link used is {slowest}" if slowest else ""
        return (f"Links: the cost model prices communication only ({option.step_s:.3g} s per iteration){where}. "
                f"Give --cost-model yuan+compute or schedule to weigh each GPU's speed.")
    if option.step_s > 0 and exposed >= LINK_BOUND_SHARE * option.step_s and slowest:
        return (f"A link: {exposed:.3g} s of each {option.step_s:.3g} s step is communication not hidden by compute; "
                f"the slowest link used is {slowest}.")
    if not known:
        return f"Compute: {option.compute_s:.3g} s of the {option.step_s:.3g} s step is compute (GPU types not given)."
    busiest = used[np.argmin(peak[used])]
    return (f"Compute: the slowest GPU used ({cluster.gpus[busiest]} in {cluster.region_names[cluster.region_of[busiest]]}) "
            f"paces the step; {option.compute_s:.3g} s of its {option.step_s:.3g} s is compute.")


def _slowest_link(cluster: Cluster, sites: list[str]) -> str | None:
    """"a-b (x Gbit/s)": the slowest link between two of `sites`; None for one site."""
    region = {name: g for g, name in enumerate(cluster.region_names)}
    pairs = [(a, b) for i, a in enumerate(sites) for b in sites[i + 1:]]
    if not pairs:
        return None
    a, b = min(pairs, key=lambda p: _region_gbps(cluster, region[p[0]], region[p[1]]))
    return f"{a}-{b} ({_region_gbps(cluster, region[a], region[b]):.3g} Gbit/s)"


def _region_gbps(cluster: Cluster, a: int, b: int) -> float:
    rows, cols = np.flatnonzero(cluster.region_of == a), np.flatnonzero(cluster.region_of == b)
    return float(cluster.bandwidth_gbps[np.ix_(rows, cols)].min())


def explain_choice(cluster: Cluster, options: Sequence[Option], alternatives: int = 3, by_cost: bool = False) -> list[str]:
    """Sentences: the chosen option (the first), up to `alternatives` next ones against it (by their USD for a
    step's progress with `by_cost`, else by their step), and its binding constraint."""
    chosen = options[0]
    sites = sites_of(cluster, chosen.assignment)
    used = int(np.unique(np.asarray(chosen.assignment).ravel()).size)
    cost = f", ${chosen.usd:.4g} per step's progress" if by_cost and chosen.usd is not None else ""
    to_target = (f" ({chosen.rank_s:.4g} s per step's progress to the target, convergence model included)"
                 if chosen.rank_s is not None and abs(chosen.rank_s - chosen.step_s) > 1e-9 * chosen.step_s else "")
    lines = [f"Chosen: {chosen.label} ({chosen.scheme}) on {used} of {cluster.n_devices} devices in "
             f"{', '.join(sites)}: {chosen.step_s:.4g} s per step predicted{to_target}{cost}."]
    seen, others = {(chosen.label, chosen.scheme)}, []
    for o in options[1:]:  # one per layout and scheme (auto-configuration lists micro-batchings apart)
        if (o.label, o.scheme) not in seen and len(others) < alternatives:
            seen.add((o.label, o.scheme))
            others.append(o)

    def against(o: Option) -> str:
        if by_cost and o.usd is not None and chosen.usd:
            return f"${o.usd:.4g} ({o.usd / chosen.usd:.2f}x), {o.step_s:.4g} s"
        if o.rank_s is not None or chosen.rank_s is not None:  # ranked by time to target: say both
            return f"{o.ranked_s:.4g} s to the target per step ({o.ranked_s / chosen.ranked_s:.2f}x), step {o.step_s:.4g} s"
        return f"{o.step_s:.4g} s ({o.step_s / chosen.step_s:.2f}x)"

    if others:
        lines.append("Next: " + "; ".join(
            f"{o.label} ({o.scheme}) in {', '.join(sites_of(cluster, o.assignment))}: {against(o)}" for o in others)
                     + ".")
    lines.append(binding_constraint(cluster, chosen))
    return lines
