"""The time limit is a limit: the watchdog ends overrunning work and keeps what it reported; `auto`
spends its budget and records how its best plan improved; `plan --time-limit` covers the bound too."""

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from geotrain.cli.main import main
from geotrain.cli.plan_cmd import time_budget
from geotrain.cluster.scale import multicloud
from geotrain.cost import build_cost_model
from geotrain.job import GPT_13B_SEED
from geotrain.search import PlacementProblem, run_search
from geotrain.search.bounds import combinatorial_bound, lower_bound
from geotrain.search.bound_beside import BoundBeside, usable_cores
from geotrain.search.watchdog import CANCEL_POLL_S, GRACE_S, run_with_deadline

pytestmark = pytest.mark.serial  # measures wall time or bandwidth: runs alone (Makefile)


def report_then_hang(report, value):
    report(value)
    time.sleep(120)


def report_then_return(report, value):
    report(value)
    return value * 2


def test_watchdog_ends_a_hanging_child_at_its_limit_and_keeps_what_it_reported():
    run = run_with_deadline(report_then_hang, (7,), 5.0, grace_s=0.5)  # start-up (imports) is inside the 5 s
    assert run.items == (7,) and run.killed and not run.finished
    assert 5.0 <= run.seconds < 5.0 + 0.5 + 1.0


def test_watchdog_returns_a_finished_childs_items_and_value():
    run = run_with_deadline(report_then_return, (21,), 60.0)
    assert run.items == (21, 42) and run.finished and not run.killed
    assert run.seconds < 30.0


def report_mark_then_hang(report, value, mark):
    report(value)
    Path(mark).write_text("reported")
    time.sleep(120)


def test_watchdog_cancelled_from_another_thread_ends_the_child_early_and_keeps_what_it_reported(tmp_path):
    """Cancelled once the child has reported (its mark on disk; a fixed 1.5 s was too short for a child's start-up
    on a loaded machine): the run ends within a cancel poll of it, far before its 60 s limit, with the item."""
    cancel, mark = threading.Event(), tmp_path / "reported"
    cancelled: list[float] = []

    def cancel_after_the_report() -> None:
        while not mark.exists():
            time.sleep(0.01)
        time.sleep(0.2)  # the item went into the pipe before the mark: the parent has read it by then
        cancelled.append(time.monotonic())
        cancel.set()

    threading.Thread(target=cancel_after_the_report, daemon=True).start()
    run = run_with_deadline(report_mark_then_hang, (7, str(mark)), 60.0, cancel=cancel)
    ended = time.monotonic()
    assert run.items == (7,) and run.killed and not run.finished
    assert cancelled and ended - cancelled[0] < CANCEL_POLL_S + 1.5 and run.seconds < 30.0


def _jittered(devices_per_region: int, stages: int) -> PlacementProblem:
    cluster = multicloud(8, devices_per_region, seed=0, jitter=0.1)
    replicas = cluster.n_devices // stages
    return PlacementProblem(cluster, build_cost_model("yuan", cluster, GPT_13B_SEED, stages, replicas))


def test_guarded_lower_bound_returns_within_its_limit_with_a_valid_bound():
    problem = _jittered(32, 8)  # 256 devices: the region MILPs alone want far more than 3 s
    started = time.perf_counter()
    bound = lower_bound(problem, upper_bound_s=14.0, time_limit_s=3.0, guard=True)
    assert time.perf_counter() - started < 3.0 * 1.1 + 0.6
    assert bound.value_s >= combinatorial_bound(problem.cost_model.pairwise_terms(), 8, 32)
    assert bound.value_s <= 14.0


def test_auto_spends_its_budget_and_records_a_falling_trajectory():
    problem = _jittered(8, 8)  # 64 devices, not region-uniform: exact does not apply
    result = run_search("auto", problem, seed=0, time_limit_s=12.0)
    points = result.details["trajectory"]
    totals = [total for _, total, _ in points]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == len(totals)
    assert totals[-1] == pytest.approx(result.cost.total, rel=1e-12)
    assert points[-1][2] == result.details["found_by"]
    assert sum(result.details["anytime_rounds"].values()) >= 1  # the heuristics left time: rounds ran
    assert result.details["anytime_rounds"].get("lns", 0) >= 1  # large-neighbourhood MILPs among them
    assert 8.0 <= result.seconds <= 12.0 * 1.1
    first = min(t["total"] for t in result.details["tried"] if "total" in t)
    assert result.cost.total <= first * (1 + 1e-12)


def test_time_budget_shares_the_limit_between_search_and_bound():
    assert time_budget(60.0, None, True) == pytest.approx((36.0, 24.0))
    assert time_budget(60.0, 10.0, True) == pytest.approx((50.0, 10.0))
    assert time_budget(60.0, None, False) == (60.0, 0.0)
    assert time_budget(None, None, True) == (None, 30.0)
    assert time_budget(60.0, None, True, exact_certifies=True) == pytest.approx((51.0, 9.0))


def test_plan_with_a_time_limit_and_a_bound_returns_within_the_limit(capsys):
    code = main(["plan", "--cluster", "multicloud-1024-jitter", "--stages", "8", "--replicas", "16",
                 "--lower-bound", "--time-limit", "10", "--json"])
    doc = json.loads(capsys.readouterr().out)
    # wall_seconds: from the start of the command (cluster and cost model included, interpreter start-up not)
    assert code == 0 and doc["wall_seconds"] < 10 * 1.1 + GRACE_S and doc["time_limit_s"] == 10
    assert 0.0 < doc["lower_bound"] <= doc["cost"]["total"]
    assert doc["details"]["trajectory"][-1][1] == pytest.approx(doc["cost"]["total"], rel=1e-12)
    # on two or more cores the bound ran beside the search, from a plan no better than the final one
    assert doc["details"]["lower_bound_beside"] is (usable_cores() >= 2)
    if usable_cores() >= 2:
        assert doc["details"]["lower_bound_upper_s"] >= doc["cost"]["total"] * (1 - 1e-12)


def test_the_bound_beside_the_search_starts_at_the_first_plan_and_holds_the_deadline():
    problem = _jittered(32, 8)  # 256 devices: the region bounds use all the time they get
    deadline = time.perf_counter() + 5.0
    beside = BoundBeside(problem, deadline)
    result = run_search("auto", problem, seed=0, time_limit_s=4.5, on_plan=beside.offer)
    first = result.details["trajectory"][0][1]
    assert beside.upper_bound_s == pytest.approx(first, rel=1e-12)  # started from the first plan
    assert beside.started_at is not None and beside.started_at < deadline - 2.0  # long before the search ended
    bounded = beside.finish(result)
    assert time.perf_counter() < deadline + GRACE_S + 0.5
    assert bounded.details["lower_bound_beside"] is True and bounded.details["lower_bound_seconds"] > 2.0
    assert combinatorial_bound(problem.cost_model.pairwise_terms(), 8, 32) <= bounded.lower_bound <= result.cost.total


def test_a_plan_the_search_proved_optimal_ends_the_bound_beside_at_once():
    problem = _jittered(32, 8)
    plan = run_search("pipeline-local", problem, seed=0)
    beside = BoundBeside(problem, time.perf_counter() + 60.0)
    beside.offer(plan)
    time.sleep(1.5)
    started = time.perf_counter()
    bounded = beside.finish(replace(plan, lower_bound=plan.cost.total))  # as exact's certificate says
    assert time.perf_counter() - started < CANCEL_POLL_S + 1.5
    assert bounded.lower_bound == plan.cost.total and bounded.details["lower_bound_killed"] is True


def test_without_a_plan_offered_the_bound_runs_after_the_search_with_the_time_left():
    problem = _jittered(8, 8)
    plan = run_search("hierarchical", problem, seed=0)
    bounded = BoundBeside(problem, time.perf_counter() + 2.0).finish(plan)
    assert bounded.details["lower_bound_beside"] is False and 0.0 < bounded.lower_bound <= plan.cost.total
