"""Cluster model: devices, regions, GPUs, bandwidth (Gbit/s) and latency (ms); files, generators, presets."""

from geotrain.cluster.errors import ClusterError, ClusterFileError
from geotrain.cluster.generators import make_network, region_cluster
from geotrain.cluster.io import (
    cluster_from_dict,
    cluster_to_dict,
    load_cluster_file,
    parse_cluster_text,
    save_cluster_file,
)
from geotrain.cluster.model import Cluster, Link
from geotrain.cluster.presets import CLUSTER_PRESETS, load_cluster, seed_datacenter, seed_geo
from geotrain.cluster.scale import multicloud
from geotrain.cluster.yuan2022 import YUAN2022_PRESETS

__all__ = [
    "CLUSTER_PRESETS",
    "YUAN2022_PRESETS",
    "Cluster",
    "ClusterError",
    "ClusterFileError",
    "Link",
    "cluster_from_dict",
    "cluster_to_dict",
    "load_cluster",
    "load_cluster_file",
    "make_network",
    "multicloud",
    "parse_cluster_text",
    "region_cluster",
    "save_cluster_file",
    "seed_datacenter",
    "seed_geo",
]
