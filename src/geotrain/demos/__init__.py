"""The seed's demos as functions that return data (the CLI prints tables from it)."""

from geotrain.demos.schedule import ScheduleDemo, ScheduleDemoConfig, ScheduleRow, region_locality, run_schedule_demo

__all__ = ["ScheduleDemo", "ScheduleDemoConfig", "ScheduleRow", "region_locality", "run_schedule_demo"]
