"""Arguments shared by `geotrain plan` and `geotrain cost`: cluster, job and cost model."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from geotrain.cluster import Cluster, load_cluster
from geotrain.cost import COST_MODELS, DEFAULT_COST_MODEL, CostModel, build_cost_model
from geotrain.cost.shards import Sharding
from geotrain.job import Job, JobError, load_job

DEFAULT_JOB = "gpt-1.3b-seed"


def add_placement_arguments(parser: argparse.ArgumentParser, cost_model_help: str | None = None) -> None:
    """--cluster, --job, --cost-model (default DEFAULT_COST_MODEL; with `cost_model_help`, None: the command
    resolves it and says how in that text) and --json."""
    parser.add_argument("--cluster", required=True, metavar="FILE|PRESET",
                        help="cluster preset (seed-geo, seed-datacenter, ...) or YAML/JSON cluster file")
    parser.add_argument("--job", default=DEFAULT_JOB, metavar="PRESET|FILE", help="job preset or YAML/JSON job file")
    parser.add_argument("--cost-model", default=DEFAULT_COST_MODEL if cost_model_help is None else None,
                        choices=sorted(COST_MODELS), help=cost_model_help or "communication cost model")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of tables")


def build_placement(args: Any, stages: int, replicas: int, layer_shares: object = None,
                    strict: bool = True, cluster: Cluster | None = None,
                    job: Job | None = None, sharding: Sharding | None = None) -> tuple[Cluster, Job, CostModel]:
    """Load the cluster and job named in `args` and build the cost model for (stages, replicas)
    (with `args.uneven_split`, where the command has it: scored with the speed layer split; else
    with `layer_shares` where given, see cost.registry.build_cost_model). A global batch that is not a
    multiple of the replicas is rounded to the nearest one, said in one note on stderr (batch_for_replicas),
    as `plan` rounded it. Planning (`strict`): any other layout the job does not fit (Job.check_layout_fits)
    is refused; scoring a given plan: said in one note.
    `cluster`: plan on this one (e.g. the live devices of a re-plan) instead of loading `args.cluster`;
    `job`: this one (e.g. the job a plan records) instead of loading `args.job`; `sharding`: `cluster` is a slot
    cluster of K devices per slot (cost/shards.py)."""
    cluster = load_cluster(args.cluster) if cluster is None else cluster
    job = load_job(args.job) if job is None else job
    job.check_every_replica_has_a_sample(replicas)  # refused even where an uneven layout is only noted
    job = batch_for_replicas(job, replicas)
    try:
        job.check_layout_fits(stages, replicas)
    except JobError as exc:
        if strict:
            raise
        print(f"geotrain: note: {exc}", file=sys.stderr)
    shares = "speed" if getattr(args, "uneven_split", False) else layer_shares
    return cluster, job, build_cost_model(args.cost_model, cluster, job, stages, replicas, layer_shares=shares,
                                          utilisation=getattr(args, "utilisation", None), sharding=sharding)


def batch_for_replicas(job: Job, replicas: int) -> Job:
    """`job` with its global batch rounded to the nearest multiple of `replicas` (a tie rounds up; never
    below `replicas`), and one note on stderr saying so; `job` itself when the batch divides. Planning
    3 replicas with a 1024-sample job should not ask the user to edit a job file they never wrote."""
    extra = job.global_batch % replicas
    if not extra:
        return job
    below = job.global_batch - extra
    rounded = below + replicas if below == 0 or 2 * extra >= replicas else below
    print(f"geotrain: note: job {job.name!r}: global_batch {job.global_batch} rounded to {rounded}, the nearest "
          f"multiple of the {replicas} replicas ({rounded // replicas} samples each)", file=sys.stderr)
    return replace(job, global_batch=rounded)


def assignment_rows(cluster: Cluster, assignment: Any) -> list[list[str]]:
    """Table rows: one per stage, each cell 'device@region-index' of (stage, replica)."""
    return [[f"stage {s}", *(f"{int(d)}@{int(cluster.region_of[int(d)])}" for d in row)]
            for s, row in enumerate(assignment)]


def region_legend(cluster: Cluster) -> str:
    """'device@g: region g is 0=name0, 1=name1, ...' for the assignment tables."""
    return "cells are device@region: " + ", ".join(f"{g}={name}" for g, name in enumerate(cluster.region_names))
