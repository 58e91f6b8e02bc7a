"""autoconfig.schedule_bound_s: <= the "schedule" model of every placement (random placements on
random clusters, both schedules), and it counts the pipeline hops the last micro-batch must make."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_placement_exact import random_cluster

from geotrain.cluster import Cluster, region_cluster
from geotrain.cost.schedule import ScheduleCostModel
from geotrain.job import Job
from geotrain.search.autoconfig import schedule_bound_s

JOB = Job(name="small", params=4e8, seq_len=512, hidden=1024, global_batch=16, layers=8, vocab=32000)


def with_gpus(cluster: Cluster, gpus: list[str]) -> Cluster:
    return Cluster(cluster.name, cluster.device_names, cluster.region_names, cluster.region_of, gpus,
                   cluster.bandwidth_gbps, cluster.latency_ms)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(2, 2, 1), (2, 2, 4), (4, 1, 2), (3, 2, 8), (2, 4, 2), (1, 4, 4)]),
       st.sampled_from(["1f1b", "gpipe"]), st.floats(0.0, 0.3), st.integers(0, 10_000))
def test_schedule_bound_is_below_every_random_placement(layout, schedule, jitter, seed):
    stages, replicas, microbatches = layout
    rng = np.random.default_rng(seed)
    base = random_cluster(seed, (3, 4, 2), jitter)
    cluster = with_gpus(base, [str(g) for g in rng.choice(["V100", "A100", "T4"], base.n_devices)])
    pool = np.arange(cluster.n_devices)
    bound = schedule_bound_s(cluster, JOB, pool, stages, replicas, microbatches, 0.4)
    model = ScheduleCostModel.for_job(cluster, JOB, stages, replicas, micro_batches=microbatches, schedule=schedule,
                              utilisation=0.4)
    for _ in range(20):
        assignment = rng.permutation(cluster.n_devices)[: stages * replicas].reshape(stages, replicas)
        assert bound <= model.evaluate(assignment).total * (1 + 1e-9)


def test_schedule_bound_counts_the_last_micro_batch_hops():
    stages, replicas, microbatches = 4, 2, 4
    cluster = region_cluster("wan", ["a"], [8], np.array([[1.0]]), np.array([[40.0]]), "H100")
    bound = schedule_bound_s(cluster, JOB, np.arange(8), stages, replicas, microbatches, 0.4)
    hop = 0.040 + 8.0 * JOB.pp_bytes(replicas) / microbatches / 1e9
    # 2 (S - 1) hops, plus cut 0 carrying the M activations one after another
    assert bound >= 2 * (stages - 1) * hop + (microbatches - 1) * (hop - 0.040)
    model = ScheduleCostModel.for_job(cluster, JOB, stages, replicas, micro_batches=microbatches, utilisation=0.4)
    assert bound <= model.evaluate(np.arange(8).reshape(stages, replicas)).total * (1 + 1e-9)
