"""Fuzzing the cluster, job and plan parsers: any input gives a result or a GeotrainError (one line),
never another exception. Inputs: random text, YAML/JSON-ish token soup, random bytes, random
structures and mutated valid files. Run with -s to see how many cases ran and how they ended."""

import json
import math
import os
import re
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.cluster import Cluster, cluster_from_dict, cluster_to_dict, parse_cluster_text
from geotrain.cluster.model import MAX_DEVICES
from geotrain.errors import GeotrainError
from geotrain.job import Job, job_from_dict, parse_job_text
from geotrain.plan import Plan
from geotrain.yaml_text import decode_text, dump_yaml_text, parse_document

# GEOTRAIN_FUZZ_EXAMPLES=5000 for a long run; the default keeps the suite fast
FUZZ = settings(max_examples=int(os.environ.get("GEOTRAIN_FUZZ_EXAMPLES", "150")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
OUTCOMES: Counter = Counter()

CLUSTER_YAML = """name: t
regions:
  - {name: a, devices: 2, gpu: V100, intra: {gbps: 10, ms: 0.1}}
  - {name: b, devices: 2, intra: {gbps: 10, ms: 0.1}}
  - {name: c, devices: 1}
links:
  - {between: [a, b], gbps: 1, ms: 50}
  - {between: [a, c], gbps: 1.5e0, ms: 20}
  - {between: [b, c], gbps: 0.3, ms: 5e1}
defaults: {intra: {gbps: 10, ms: 0.1}, link: {ms: 50}, gpu: T4}
"""
CLUSTER_DENSE = """devices: [{name: x, region: a}, {name: y, region: a, gpu: A100}, {name: z, region: b}]
bandwidth_gbps: [[0, 10, 1], [10, 0, 1], [1, 1, 0]]
latency_ms: [[0, 1, 50], [1, 0, 50], [50, 50, 0]]
"""
CLUSTER_JSON = json.dumps({"name": "j", "regions": [{"name": "a", "devices": 2, "intra": {"gbps": 10, "ms": 0.1}},
                                                    {"name": "b", "devices": 1}],
                           "links": [{"between": ["a", "b"], "gbps": 1, "ms": 50}]})
JOB_YAML = "name: gpt\nparams: 1.3e9\nseq_len: 2048\nhidden: 2048\nglobal_batch: 1024\nlayers: 24\nbytes_per_value: 2\n"
PLAN_JSON = json.dumps({"method": "x", "stages": 2, "replicas": 2, "assignment": [[0, 1], [2, 3]],
                        "cost": {"dp": 1.0, "pp": 2.0, "total": 3.0}})

TOKENS = ["{", "}", "[", "]", ":", ": ", ",", "- ", " ", "  ", "\n", "\n  ", "\t", "#", "&a ", "*a", "!!str ",
          "!!int ", "!!binary ", "!foo ", "? ", "|\n", ">\n", "---\n", "...\n", "%YAML 1.1\n", '"', "'", '"x"', "'y'",
          "\\", "é", "\u202e", "\ufeff", "name", "regions", "devices", "links", "between", "gbps", "ms", "intra",
          "defaults", "link", "gpu", "region", "bandwidth_gbps", "latency_ms", "stages", "replicas", "assignment",
          "params", "seq_len", "hidden", "global_batch", "layers", "bytes_per_value", "a", "b", "0", "1", "2", "-1",
          "1e3", "1.5", ".5", "1.", ".nan", ".inf", "-.inf", "NaN", "Infinity", "010", "0x1F", "0o17", "1:30",
          "1_000", "yes", "no", "on", "true", "false", "null", "~", "2024-01-01", "9" * 30, "1e400", "1e-310", "<<",
          "[evil[/]]"]

VALUES = ["-1", "0", "1e400", "-1e400", "1e-310", "1e300", "010", ".nan", ".inf", "9" * 30, "yes", "true", "null",
          "1:30", "0x7fffffffffffffff", "8193", "10000000", "2.5", "[]", "{}", "x[/]"]
KEYS = ["name", "regions", "devices", "links", "between", "gbps", "ms", "intra", "defaults", "link", "gpu", "region",
        "bandwidth_gbps", "latency_ms", "stages", "replicas", "assignment", "params", "seq_len", "hidden",
        "global_batch", "layers", "bytes_per_value", "method", "a", "b"]
SCALARS = (st.none() | st.booleans() | st.integers(-3, 64)
           | st.sampled_from([2**63 - 1, 2**63, -(2**63), 10**300, MAX_DEVICES, MAX_DEVICES + 1, 10**7])
           | st.floats() | st.sampled_from(["a", "b", "c", "", " ", "x[/]", "yes"]) | st.text(max_size=6))
STRUCTURES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4) | st.integers(0, 3), children, max_size=6),
    max_leaves=40)

token_text = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)


@st.composite
def mutated(draw, base: str) -> str:
    """`base` with a few random edits: deletions, insertions of tokens, replaced characters, repeated lines,
    and numbers swapped for other values (so that value checks, not only syntax, are exercised)."""
    text = base
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "replace", "repeat", "value", "value"]))
        i = draw(st.integers(0, len(text)))
        numbers = list(re.finditer(r"-?[0-9][0-9.e]*", text))
        if kind == "value" and numbers:
            match = draw(st.sampled_from(numbers))
            value = draw(st.sampled_from(VALUES) | st.integers(-2, 40).map(str) | st.floats().map(repr))
            text = text[:match.start()] + value + text[match.end():]
        elif kind == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        elif kind == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif kind == "replace" and i < len(text):
            text = text[:i] + draw(st.characters()) + text[i + 1:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                k = draw(st.integers(0, len(lines) - 1))
                text = "".join(lines[:k + 1] + [lines[k]] + lines[k + 1:])
    return text


def outcome(kind: str, parse, *args):
    """Run a parser; return its result, or None when it raised a GeotrainError (checked to be one line)."""
    try:
        result = parse(*args)
    except GeotrainError as exc:
        message = str(exc)
        assert message and "\n" not in message and len(message) <= 1000
        OUTCOMES[f"{kind}: refused"] += 1
        return None
    OUTCOMES[f"{kind}: accepted"] += 1
    return result


def check_cluster(cluster: Cluster | None) -> None:
    """An accepted cluster is sane and round-trips through its own YAML."""
    if cluster is None:
        return
    assert isinstance(cluster, Cluster) and 1 <= cluster.n_devices <= MAX_DEVICES
    assert np.all(np.isfinite(cluster.bandwidth_gbps)) and np.all(np.isfinite(cluster.latency_ms))
    again = parse_cluster_text(dump_yaml_text(cluster_to_dict(cluster)), "again.yaml")
    assert again.device_names == cluster.device_names and again.region_names == cluster.region_names
    assert np.array_equal(again.bandwidth_gbps, cluster.bandwidth_gbps)


def check_job(job: Job | None) -> None:
    """An accepted job gives finite, positive byte counts and FLOPs."""
    if job is None:
        return
    replicas = min(job.global_batch, 8)
    for value in (job.dp_bytes(4), job.pp_bytes(replicas), job.flops_per_iteration(), job.compute_seconds(32)):
        assert math.isfinite(value) and value > 0


def check_plan(plan: Plan | None) -> None:
    """An accepted plan fits, or is refused by, a cluster with a PlanError."""
    if plan is None:
        return
    assert plan.assignment.shape == (plan.stages, plan.replicas)
    outcome("plan fit", plan.check_fits, 4, "p.json")


def all_three(kind: str, text: str) -> None:
    check_cluster(outcome(f"{kind} as cluster", parse_cluster_text, text, "f.yaml"))
    check_job(outcome(f"{kind} as job", parse_job_text, text, "f.yaml"))
    check_plan(outcome(f"{kind} as plan", Plan.from_text, text, "f.yaml"))


@FUZZ
@given(st.text(max_size=200))
def test_random_text_gives_a_result_or_a_geotrain_error(text):
    all_three("random text", text)


@FUZZ
@given(token_text)
def test_yaml_json_token_soup_gives_a_result_or_a_geotrain_error(text):
    all_three("token soup", text)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_give_a_result_or_a_geotrain_error(data):
    text = outcome("bytes decode", decode_text, data, "f.bin")
    if text is not None:
        all_three("bytes", text)


@FUZZ
@given(STRUCTURES)
def test_random_structures_give_a_result_or_a_geotrain_error(doc):
    check_cluster(outcome("structure as cluster", cluster_from_dict, doc, "s"))
    check_job(outcome("structure as job", job_from_dict, doc, "s"))
    check_plan(outcome("structure as plan", Plan.from_json, doc, "s"))
    try:
        text = json.dumps(doc, allow_nan=False)
    except (ValueError, TypeError):  # NaN or a key JSON cannot hold
        return
    all_three("structure as JSON", text)


@FUZZ
@given(st.one_of(mutated(CLUSTER_YAML), mutated(CLUSTER_DENSE), mutated(CLUSTER_JSON)))
def test_mutated_cluster_files_give_a_result_or_a_geotrain_error(text):
    check_cluster(outcome("mutated cluster", parse_cluster_text, text, "m.yaml"))


@FUZZ
@given(mutated(JOB_YAML))
def test_mutated_job_files_give_a_result_or_a_geotrain_error(text):
    check_job(outcome("mutated job", parse_job_text, text, "m.yaml"))


@FUZZ
@given(mutated(PLAN_JSON))
def test_mutated_plan_files_give_a_result_or_a_geotrain_error(text):
    check_plan(outcome("mutated plan", Plan.from_text, text, "m.json"))


@FUZZ
@given(STRUCTURES)
def test_yaml_written_by_geotrain_reads_back_unchanged(doc):
    try:
        text = dump_yaml_text(doc)
    except Exception:  # noqa: BLE001 - PyYAML cannot represent every hypothesis value (e.g. NaN keys): not ours
        return
    again = outcome("dump/read", parse_document, text, "d.yaml")
    if again is not None and not _has_nan(doc):  # nan != nan
        assert again == doc


@pytest.mark.parametrize("text", ["0o17", "0x1F", "1e3", ".5", "1.", "-.inf", ".NaN", "010", "1:30", "yes", "No", "on",
                                  "~", "null", "True", "2024-01-01", "1_000", "<<", "=", "+1", "-0", ""])
def test_strings_that_look_like_scalars_are_quoted_when_written(text):
    doc = {"name": text, "regions": [{"name": text, "devices": 1}]}
    assert parse_document(dump_yaml_text(doc), "q.yaml") == doc


def _has_nan(value) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_has_nan(k) or _has_nan(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_nan(v) for v in value)


def teardown_module():
    total = sum(OUTCOMES.values())
    print(f"\nparser fuzz: {total} parser calls; " + ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.items())))
