"""The pipeline schedules `geotrain train --schedule` runs, by name, and what each does; torch's class
for each is looked up when a rank builds it (geotrain.runtime.pipeline runs them)."""

from __future__ import annotations

from dataclasses import dataclass

from geotrain.cost.actions import LOOPED, TORCH_SCHEDULES


@dataclass(frozen=True)
class PipelineSchedule:
    """One pipeline schedule `train --schedule` runs, by its name in cost.actions.TORCH_SCHEDULES (the
    one table of names and torch classes, which the schedule model reads too), and what it does."""

    name: str
    summary: str

    @property
    def torch_class(self) -> type:
        """torch.distributed.pipelining's schedule class (imported here: a second of start-up that only
        the ranks that run a pipeline pay)."""
        from torch.distributed.pipelining import schedules

        return getattr(schedules, TORCH_SCHEDULES[self.name])

    @property
    def looped(self) -> bool:
        """Whether a rank holds V >= 2 virtual stages."""
        return self.name in LOOPED


PIPELINE_SCHEDULES: dict[str, PipelineSchedule] = {
    "gpipe": PipelineSchedule("gpipe", "every micro-batch's forward, then every backward "
                              "(Huang et al. 2019): all M micro-batches' activations in flight"),
    "1f1b": PipelineSchedule("1f1b", "S - s warm-up forwards, then one forward / one backward "
                             "(PipeDream-Flush): at most S - s micro-batches in flight at stage s"),
    "interleaved-1f1b": PipelineSchedule("interleaved-1f1b", "1F1B over V >= 2 virtual stages per "
                                         "rank (Narayanan et al. 2021): a shorter bubble, V times the messages"),
    "looped-bfs": PipelineSchedule("looped-bfs", "V >= 2 virtual stages per rank, each running "
                                   "all its micro-batches breadth first (Lamy-Poirier 2023)"),
}
"""The pipeline schedules geotrain train runs (`--schedule`), by name; the learning-rate schedule is
models.lr_at, and the cost models know a subset (cost.memory.MODELLED_SCHEDULES)."""

LOOPED_SCHEDULES: tuple[str, ...] = tuple(name for name, s in PIPELINE_SCHEDULES.items() if s.looped)
"""Schedules of several virtual stages per rank: interleaved-1f1b, looped-bfs."""
