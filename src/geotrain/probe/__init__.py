"""`geotrain probe`: measure latency and bandwidth between torch.distributed processes, find regions,
write a cluster file."""

from geotrain.probe.measure import Measurements, ProbeConfig, measure_all
from geotrain.probe.regions import GAP_RATIO, LATENCY_NOISE_MS, RegionSplit, regions_from_measurements, split_by_distance
from geotrain.probe.report import cluster_document, cluster_yaml, device_names, probe_record, region_summary
from geotrain.probe.rounds import circle_rounds, partner_in_round

__all__ = [
    "GAP_RATIO",
    "LATENCY_NOISE_MS",
    "Measurements",
    "ProbeConfig",
    "RegionSplit",
    "circle_rounds",
    "cluster_document",
    "cluster_yaml",
    "device_names",
    "measure_all",
    "partner_in_round",
    "probe_record",
    "region_summary",
    "regions_from_measurements",
    "split_by_distance",
]
