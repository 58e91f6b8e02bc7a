"""The same unmodified script over the emulator and over really shaped links: seconds per step and losses.

Both sides get the same cluster, the same device list (rank i plays devices[i]) and the same script and
arguments, so the same bytes cross the same links. The emulated side (geotrain.emulate) reports its
emulated step times: the intervals between the default group's barriers (the example scripts end every
step with `dist.barrier()`); the shaped side (netlab: namespaces + htb, real TCP) reports the wall
seconds each step took, printed by the script as `step K loss L time Ts`. Step 0 (set-up, first
connections) is left out; the rows give medians over the other steps. Latency is only shaped where the
kernel has netem, so the comparison is meant for bandwidth-bound cases (docs/history/netlab.md).
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from geotrain.cluster import Cluster

STEP_LINE = re.compile(r"^step (\d+) loss (\S+) time ([0-9.eE+-]+)s\s*$", re.MULTILINE)


@dataclass(frozen=True)
class CrossCheckCase:
    """One script run both ways: a label, the script path and its arguments."""

    label: str
    script: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class CrossCheckRow:
    """Seconds per step (median of steps 1..), emulated and shaped; the losses of both runs."""

    label: str
    emulated_s: float
    shaped_s: float
    emulated_steps_s: tuple[float, ...]
    shaped_steps_s: tuple[float, ...]
    emulated_losses: tuple[str, ...]
    shaped_losses: tuple[str, ...]

    @property
    def ratio(self) -> float:
        """emulated / shaped."""
        return self.emulated_s / self.shaped_s if self.shaped_s else float("inf")

    @property
    def losses_equal(self) -> bool:
        return bool(self.emulated_losses) and self.emulated_losses == self.shaped_losses


def step_lines(text: str) -> list[tuple[int, str, float]]:
    """(step, loss as printed, seconds) of every `step K loss L time Ts` line of a script's output."""
    return [(int(m.group(1)), m.group(2), float(m.group(3))) for m in STEP_LINE.finditer(text)]


def steady_median(values: Sequence[float]) -> float:
    """Median of the steps after the first (all of them when there is only one)."""
    rest = list(values[1:]) if len(values) > 1 else list(values)
    return statistics.median(rest) if rest else float("nan")


def _emulated(cluster: Cluster, devices: list[int], case: CrossCheckCase, timeout_s: float,
              nic_gbps: float | None) -> tuple[list[float], list[str]]:
    from geotrain.emulate.launch import LaunchConfig, launch
    from geotrain.emulate.report import barrier_intervals_s

    with tempfile.TemporaryDirectory(prefix="geotrain-crosscheck-") as tmp:
        config = LaunchConfig((case.script, *case.args), 1.0, nic_gbps, Path(tmp) / "report.json", timeout_s,
                              log_dir=Path(tmp))
        result = launch(cluster, devices, config)
        output = "".join((Path(tmp) / f"rank{r}.log").read_text(errors="replace") for r in range(len(devices)))
    if result.exit_code != 0 or result.report is None:
        raise RuntimeError(f"{case.label}: emulated run failed (exit {result.exit_code}): {output[-400:]}")
    # the script's own first barrier (before step 0) starts the intervals
    return barrier_intervals_s(result.report), [loss for _, loss, _ in step_lines(output)]


def _shaped(cluster: Cluster, devices: list[int], case: CrossCheckCase, timeout_s: float,
            nic_gbps: float | None) -> tuple[list[float], list[str]]:
    from geotrain.netlab import NetLab, run_script

    with NetLab(cluster, devices, nic_gbps=nic_gbps) as lab:
        results = run_script(lab, [sys.executable, case.script, *case.args], timeout_s=timeout_s, capture=True)
    output = "".join(r.output for r in results)
    if any(r.returncode != 0 for r in results):
        raise RuntimeError(f"{case.label}: shaped run failed: {output[-400:]}")
    lines = step_lines(output)
    return [seconds for _, _, seconds in lines], [loss for _, loss, _ in lines]


def cross_check(cluster: Cluster, devices: Sequence[int], cases: Sequence[CrossCheckCase], timeout_s: float = 600.0,
                nic_gbps: float | None = None) -> list[CrossCheckRow]:
    """Run every case under the emulator, then in a lab (root; torn down after each case)."""
    rows = []
    for case in cases:
        emulated, emulated_losses = _emulated(cluster, list(devices), case, timeout_s, nic_gbps)
        shaped, shaped_losses = _shaped(cluster, list(devices), case, timeout_s, nic_gbps)
        rows.append(CrossCheckRow(case.label, steady_median(emulated), steady_median(shaped), tuple(emulated),
                                  tuple(shaped), tuple(emulated_losses), tuple(shaped_losses)))
    return rows
