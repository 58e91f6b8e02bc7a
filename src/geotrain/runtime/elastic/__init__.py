"""Elastic replica groups on torchft (docs/history/fault_tolerance.md): a failed group is restarted by the
launcher and recovers from a live peer while the others go on. The launcher lives in
`geotrain.runtime.elastic.launch` (imported on use: it needs torchft, the `geotrain[ft]` extra)."""

from geotrain.runtime.elastic.chaos import (ChaosSpecError, Cut, Kill, KillSite, Partition, Slow, kill_schedule,
                                           parse_chaos, parse_duration_s, partition_schedule)

__all__ = ["ChaosSpecError", "Cut", "Kill", "KillSite", "Partition", "Slow", "kill_schedule", "parse_chaos",
           "parse_duration_s", "partition_schedule"]
