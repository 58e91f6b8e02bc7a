"""Reading a run directory back whatever it holds: bad lines skipped and counted (any bytes, a hypothesis
property), a torn line mid-file keeps the record after it, a rank file that is a directory and a corrupt
run.json are notes, finish_run still writes trace.json, and a killed or failed rank makes the run incomplete."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cli.output import strict_json_text
from geotrain.observe.lines import load_lines
from geotrain.observe.run import finish_run
from geotrain.observe.run_report import run_report
from geotrain.observe.trace import build_trace


def step(rank: int = 0, n: int = 0, **changes) -> dict:
    record = {"kind": "step", "step": n, "rank": rank, "stage": 0, "replica": rank, "device": rank, "site": "east",
              "t_wall": 100.0 + n, "loss": 3.0, "lr": 0.1, "tokens": 8, "step_s": 1.0, "compute_s": 0.5,
              "comm_s": 0.25, "wait_s": 0.25, "bytes_intra": None, "bytes_inter": None, "bytes_dp": 10,
              "bytes_pp": 0, "grad_norm": None, "val_loss": None, "emulated_start_s": None, "emulated_end_s": None}
    record.update(changes)
    return {k: v for k, v in record.items() if v != "DROP"}


def event(name: str, rank: int = 0, n: int = 0, **fields) -> dict:
    return {"kind": "event", "event": name, "step": n, "rank": rank, "site": "east", "t_wall": 100.0 + n,
            "emulated_s": None, **fields}


def end(rank: int = 0, steps: int = 2) -> dict:
    return event("end", rank, -1, steps=steps, observer_s=0.001, bytes_written=100)


def line(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def write_rank(run_dir: Path, rank: int, data: bytes) -> None:
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics" / f"rank-{rank}.jsonl").write_bytes(data)


BAD_VALUES = [("step", -1), ("step", 1.5), ("step", True), ("rank", "0"), ("site", 3), ("t_wall", "NaN"),
              ("step_s", -0.5), ("step_s", 1e999), ("compute_s", -1.0), ("loss", "x"), ("bytes_inter", -4.0),
              ("step_s", "DROP"), ("site", "DROP"), ("emulated_end_s", [1])]
"""(field, value) pairs a step line cannot have; "NaN" and 1e999 are written as JSON's NaN and Infinity."""


def bad_step_line(field: str, value) -> bytes:
    text = json.dumps(step(**{field: value}), separators=(",", ":"))
    return text.replace('"NaN"', "NaN").encode() + b"\n"


good_lines = st.builds(lambda rank, n: (True, line(step(rank, n))), st.integers(0, 3), st.integers(0, 5))
junk_lines = st.binary(max_size=200).filter(lambda b: b"\n" not in b).map(lambda b: (False, b + b"\n"))
wrong_lines = st.sampled_from(BAD_VALUES).map(lambda pair: (False, bad_step_line(*pair)))
other_junk = st.sampled_from([b"[]", b"3", b"null", b'"step"', b"{}", b'{"kind":"metric"}', b"[" * 5000,
                              b'{"kind":"event","event":"end","step":-1,"rank":0,"t_wall":1}',  # no steps...
                              b'{"kind":"event","event":"outer_sync","phase":"land","fragment":0,"step":1,"rank":0,'
                              b'"t_wall":1}']).map(lambda b: (False, b + b"\n"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.one_of(good_lines, junk_lines, wrong_lines, other_junk)), max_size=30))
def test_report_never_raises_on_any_bytes_and_counts_every_skipped_line(chosen):
    """Property: whatever bytes the rank files hold line by line (whole lines: each ends in a newline), the report
    is built, in process, and counts the lines it skipped: every line but the generated good step lines."""
    n_good = sum(good for _, (good, _) in chosen)
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder)
        for rank in (0, 1):
            write_rank(run_dir, rank, b"".join(data for to, (_, data) in chosen if to == rank))
        report = run_report(run_dir)
        strict_json_text(report)  # the --json output of the same data
    assert report["skipped_lines"] == len(chosen) - n_good
    assert report["steps"] == n_good and (report["split"] is None) == (n_good == 0)


def test_a_torn_line_mid_file_keeps_the_next_record_and_finish_run_still_writes_the_trace(tmp_path):
    # an elastic group's process killed mid-write, its relaunch appending to the same file
    torn = line(step(0, 1))[:40]
    write_rank(tmp_path, 0, line(event("start")) + line(step(0, 0)) + torn + line(event("restart", n=1, incarnation=1))
               + line(step(0, 1)) + line(end()))
    lines = load_lines(tmp_path)
    assert [r.get("event", r["kind"]) for r in lines.records] == ["start", "step", "restart", "step", "end"]
    assert lines.skipped == 1 and lines.notes == ("metrics/rank-0.jsonl line 3: not JSON",)
    done = finish_run(tmp_path, config=None)
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert done["skipped_lines"] == 1 and len([e for e in trace if e.get("cat") == "step"]) == 2
    assert run_report(tmp_path)["incomplete"] is None  # the restarted process ended normally


def test_a_rank_file_that_is_a_directory_and_a_corrupt_run_json_are_notes(tmp_path):
    write_rank(tmp_path, 0, line(step(0, 0)) + line(end(0, 1)))
    (tmp_path / "metrics" / "rank-1.jsonl").mkdir()
    (tmp_path / "run.json").write_bytes(b"\xff{not json")
    report = run_report(tmp_path)
    assert report["notes"] == ["run.json: not valid JSON (ignored)",
                               "metrics/rank-1.jsonl: not a regular file, skipped"]
    assert report["about"] == {} and report["steps"] == 1 and report["skipped_lines"] == 0
    assert report["incomplete"] == {"ranks": {1: "no readable metrics line"}}  # named by its file alone
    (tmp_path / "run.json").write_text("[1, 2]")
    assert run_report(tmp_path)["notes"][0] == "run.json: not a JSON object (ignored)"


def test_finish_run_writes_the_trace_whatever_run_json_says_of_the_ranks(tmp_path):
    write_rank(tmp_path, 0, line(step(0, 0)) + line(end(0, 1)))
    names = '"site": "east", "stage": 0, "replica": 0, "device_name": "east-0"'
    for rank in ("Infinity", "NaN", "1e400", '"x"', "[0]", "null", "1.5"):  # Infinity: int() raised OverflowError
        (tmp_path / "run.json").write_text(f'{{"ranks": [{{"rank": {rank}, {names}}}, 7, {{"rank": 0, {names}}}]}}')
        done = finish_run(tmp_path, config=None)
        trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        labels = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
        assert done["steps"] == 1 and labels[0] == "rank 0 east (stage 0, replica 0, east-0)", rank


def test_a_failed_a_killed_and_a_silent_rank_make_the_run_incomplete(tmp_path):
    write_rank(tmp_path, 0, line(event("start")) + line(step(0, 0)) + line(end(0, 1)))
    write_rank(tmp_path, 1, line(event("start", 1)) + line(step(1, 0)) + line(event("failure", 1, 1, reason="watchdog: "
                                                                                       "no progress for 30 s")))
    write_rank(tmp_path, 2, line(event("start", 2)) + line(step(2, 0)))  # SIGKILLed: no end record
    (tmp_path / "run.json").write_text(json.dumps({"ranks": [{"rank": r} for r in range(4)]}))
    assert run_report(tmp_path)["incomplete"] == {"ranks": {
        1: "failure: watchdog: no progress for 30 s",
        2: "no end record (the process was killed or is still running)",
        3: "no readable metrics line"}}
    for rank in (1, 2):
        write_rank(tmp_path, rank, line(event("start", rank)) + line(step(rank, 0)) + line(end(rank, 1)))
    write_rank(tmp_path, 3, line(event("start", 3)) + line(step(3, 0)) + line(end(3, 1)))
    assert run_report(tmp_path)["incomplete"] is None


@pytest.mark.parametrize("field, value", BAD_VALUES)
def test_each_bad_value_is_skipped_with_a_note_naming_the_field(tmp_path, field, value):
    write_rank(tmp_path, 0, line(step(0, 0)) + bad_step_line(field, value))
    lines = load_lines(tmp_path)
    assert len(lines.steps) == 1 and lines.skipped == 1 and f"'{field}'" in lines.notes[0]
    build_trace(None, lines.steps, lines.events)
