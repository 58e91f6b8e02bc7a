"""The --chaos spec parser and schedule, the elastic config rules, and the refusal of another run's state."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.elastic import ChaosSpecError, Kill, KillSite, kill_schedule, parse_chaos, parse_duration_s
from geotrain.runtime.elastic.chaos import MAX_KILLS_PER_FAULT
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))
ELASTIC = {"elastic": True, "time_scale": 0.0}


def test_kill_site_specs_parse_to_their_numbers():
    assert parse_chaos("kill-site:every=20s") == (KillSite(20.0),)
    assert parse_chaos("kill-site:every=500ms,site=1,first=2m,count=3") == (KillSite(0.5, 120.0, 1, 3),)
    assert parse_chaos("kill-site:every=30s;kill-site:every=1h,site=0") == (KillSite(30.0), KillSite(3600.0, site=0))
    assert parse_chaos("kill-site:every=30s,kill-site:every=7") == (KillSite(30.0), KillSite(7.0))


@pytest.mark.parametrize("spec, words", [
    ("", "at least one fault"),
    ("every=20s", "starts with its name"),
    ("kill-site:site=1", "needs every="),
    ("kill-site:every=0s", "duration must be a number > 0"),
    ("kill-site:every=-3s", "duration must be a number > 0"),
    ("kill-site:every=nan", "duration must be a number > 0"),
    ("kill-site:every=5parsecs", "duration must be a number > 0"),
    ("kill-site:every=5s,every=6s", "every given twice"),
    ("kill-site:every=5s,site=-1", "site: must be an integer >= 0"),
    ("kill-site:every=5s,count=0", "count: must be an integer >= 1"),
    ("kill-site:every=5s,speed=2", "is not one of every=, site=, first=, count="),
    ("meteor:every=5s", "unknown fault 'meteor'"),
])
def test_bad_chaos_specs_are_one_line_naming_the_part(spec, words):
    with pytest.raises(ChaosSpecError) as caught:
        parse_chaos(spec)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_any_text_parses_or_is_a_chaos_spec_error(text):
    try:
        faults = parse_chaos(text)
    except ChaosSpecError as exc:
        assert "\n" not in str(exc)
        return
    assert faults and all(math.isfinite(f.start_s) and f.start_s > 0 for f in faults)


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e5, allow_nan=False), st.sampled_from(["ms", "s", "m", "h", ""]))
def test_a_duration_reads_back_in_seconds(value, unit):
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}[unit]
    assert parse_duration_s(f"{value!r}{unit}", "x") == pytest.approx(value * scale, rel=1e-12)


def test_the_kill_schedule_is_a_function_of_the_seed_and_fixed_sites_stay():
    faults = parse_chaos("kill-site:every=10s")
    one, again, other = (kill_schedule(faults, 4, seed, 100.0) for seed in (7, 7, 8))
    assert one == again and one != other
    assert [k.at_s for k in one] == [10.0 * i for i in range(1, 10)]
    assert {k.group for k in one} <= set(range(4)) and len({k.group for k in one}) > 1
    fixed = kill_schedule(parse_chaos("kill-site:every=10s,site=2,first=5s,count=2"), 4, 0, 100.0)
    assert fixed == [Kill(5.0, 2), Kill(15.0, 2)]
    endless = kill_schedule(parse_chaos("kill-site:every=1ms"), 4, 0)  # no count, no horizon: cut, not endless
    assert len(endless) == MAX_KILLS_PER_FAULT and endless[-1].at_s == pytest.approx(MAX_KILLS_PER_FAULT * 1e-3)


def test_elastic_settings_need_elastic_and_unsupported_runs_are_refused_in_one_line():
    with pytest.raises(RuntimeConfigError, match="reliability.min_replicas is an elastic run's setting"):
        RuntimeConfig.of(CLUSTER, [[0, 1]], min_replicas=2)
    cases = [
        ({"min_replicas": 3}, "min_replicas 3 is more than the plan's 2 replica groups"),
        ({"dp_codec": "powersgd"}, "codec 'powersgd' is its own exchange"),
        ({"sync_delay": 1}, "sync_delay 1 without --sync-every"),
        ({"chaos": "kill-site:every=5s,site=2"}, "site must be a replica group in 0..1"),
        ({"checkpoint_dir": "ckpt", "checkpoint_every": 3, "sync_every": 2}, "checkpoint_every 3: .* use a multiple of 2"),
    ]
    for settings_, words in cases:
        with pytest.raises(RuntimeConfigError, match=words):
            RuntimeConfig.of(CLUSTER, [[0, 1]], **{**ELASTIC, **settings_})
    assert RuntimeConfig.of(CLUSTER, [[0, 1], [2, 3]], **ELASTIC).stages == 2  # S > 1: a group is S processes
    config = RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, sync_every=4, min_replicas=2, chaos="kill-site:every=9s")
    assert config.reliability.elastic and config.reliability.max_restarts == 3
    assert RuntimeConfig.of(CLUSTER, [[0, 1]], **{**ELASTIC, "time_scale": 1.0}).emulation.time_scale == 1.0
    streaming = RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, sync_every=4, fragments=2, sync_delay=1,
                                 dp_codec="int8-block")  # codecs and streaming DiLoCo run elastic
    assert streaming.optim.fragments == 2 and str(streaming.comm.dp_codec) == "int8-block"
    assert RuntimeConfig.of(CLUSTER, [[0, 1], [2, 3]], **ELASTIC, sync_every=4, fragments=2).optim.fragments == 2


def test_a_peer_state_of_another_run_is_refused_naming_the_group():
    pytest.importorskip("torchft")
    from geotrain.runtime.elastic.group import ElasticGroupError, check_peer_state, run_identity_digest

    ours = run_identity_digest(RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC))
    theirs = run_identity_digest(RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, lr=1e-3))
    assert ours != theirs
    check_peer_state({"identity": ours, "group": 0}, ours, 1)
    with pytest.raises(ElasticGroupError, match="replica group 1: refused the state of replica group 0"):
        check_peer_state({"identity": theirs, "group": 0}, ours, 1)


def test_site_host_kills_the_global_models_host_and_leaves_the_drawn_sites_as_they_were():
    """kill-site site=host: a kill of no fixed group (None: the launcher looks the host up when it is due); it draws
    nothing, so the other faults' seeded sites are the same with or without it."""
    assert parse_chaos("kill-site:every=5s,count=1,site=host") == (KillSite(5.0, count=1, host=True),)
    drawn = kill_schedule(parse_chaos("kill-site:every=5s,count=1;kill-site:every=5s,first=10s,count=2"), 4, 0)
    with_host = kill_schedule(parse_chaos("kill-site:every=5s,count=1,site=host;kill-site:every=5s,first=10s,count=2"),
                              4, 0)
    assert with_host[0] == Kill(5.0, None) and with_host[1:] == drawn[1:]
    with pytest.raises(ChaosSpecError, match=r"site: must be an integer >= 0, got 'hosts' \(or host"):
        parse_chaos("kill-site:every=5s,site=hosts")
    with pytest.raises(ChaosSpecError, match="partition site: must be an integer >= 0"):
        parse_chaos("partition:site=host,at=5s,for=2s")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 4), st.sampled_from(["host", "1", None])),
                min_size=1, max_size=4), st.integers(0, 2**16))
def test_every_host_kill_is_scheduled_without_a_group_and_every_other_with_one(faults, seed):
    spec = ";".join(f"kill-site:every={every}s,count={count}" + (f",site={site}" if site else "")
                    for every, count, site in faults)
    schedule = kill_schedule(parse_chaos(spec), 4, seed)
    hosts = sum(count for _, count, site in faults if site == "host")
    assert len(schedule) == sum(count for _, count, _ in faults)
    assert sum(kill.group is None for kill in schedule) == hosts
    assert all(kill.group is None or 0 <= kill.group < 4 for kill in schedule)
    assert [kill.at_s for kill in schedule] == sorted(kill.at_s for kill in schedule)
