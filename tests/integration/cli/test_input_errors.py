"""Hostile and surprising inputs (issue 11): every one gives a one-line GeotrainError naming the source,
or reads the way YAML 1.2 / JSON read it; output stays strict JSON and prints user text as written."""

import json
import math

import numpy as np
import pytest

from geotrain.cli.arg_types import positive_float
from geotrain.cli.main import main
from geotrain.cli.output import Output, strict_json_text
from geotrain.cluster import ClusterError, ClusterFileError, load_cluster_file, make_network, parse_cluster_text
from geotrain.cluster.model import MAX_DEVICES
from geotrain.errors import MAX_SHOWN_CHARS, GeotrainError, shown
from geotrain.job import JobError, load_job, parse_job_text
from geotrain.plan import Plan, PlanError
from geotrain.runtime import relative_error_pct
from geotrain.yaml_text import MAX_DEPTH, MAX_FILE_BYTES, parse_document

TWO = """name: two
regions:
  - {name: a, devices: 2, intra: {gbps: 10, ms: 0.1}}
  - {name: b, devices: 2, intra: {gbps: 10, ms: 0.1}}
links:
  - {between: [a, b], gbps: 1, ms: 50}
"""
JOB = "params: 1.3e9\nseq_len: 2048\nhidden: 2048\nglobal_batch: 1024\n"
ALIAS_BOMB = """a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
name: [*c,*c,*c,*c,*c,*c,*c,*c,*c]
regions: [{name: x, devices: 1}]
"""


def cli_error(capsys, *argv):
    """(exit code, the single stderr line); asserts nothing went to stdout and stderr is one line."""
    code = main(list(argv))
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    return code, lines[0]


# ---- item 4: aliases, size cap, echo cap -------------------------------------------------------------

def test_alias_bomb_is_refused_at_the_first_anchor():
    with pytest.raises(ClusterFileError, match=r"bomb.yaml: line 1: .*anchors are not allowed \(&a\)"):
        parse_cluster_text(ALIAS_BOMB, "bomb.yaml")


@pytest.mark.parametrize("text", ["a: *x\n", "name: !!str &n x\n", "base: &b {gbps: 1}\nother: {<<: *b}\n"])
def test_aliases_and_anchors_are_refused_anywhere(text):
    with pytest.raises(GeotrainError, match="(aliases|anchors) are not allowed"):
        parse_document(text, "f.yaml")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_endless_devices_are_refused_after_the_size_cap(device):
    with pytest.raises(ClusterFileError, match=f"{device}: larger than {MAX_FILE_BYTES // 2**20} MiB"):
        load_cluster_file(device)


def test_size_cap_applies_to_job_and_plan_files():
    with pytest.raises(JobError, match="/dev/zero: larger than 64 MiB"):
        load_job("/dev/zero")
    with pytest.raises(PlanError, match="/dev/zero: larger than 64 MiB"):
        Plan.load("/dev/zero")


def test_a_huge_bad_value_is_echoed_cut_to_80_characters():
    text = TWO.replace("name: two", "name: [" + ", ".join(["x" * 50] * 2000) + "]")
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster_text(text, "long.yaml")
    message = str(caught.value)
    assert message.startswith("long.yaml: name: must be a non-empty string, got [")
    assert message.endswith("…") and len(message) < len("long.yaml: name: must be a non-empty string, got ") + 81


@pytest.mark.parametrize("value", ["x" * 10_000, list(range(10_000)), {"k" * 500: [[[[[1]]]]]}, 10**300, b"\x00" * 999,
                                   "evil[/]", 1.5, None])
def test_shown_values_are_at_most_80_characters_and_one_line(value):
    text = shown(value)
    assert len(text) <= MAX_SHOWN_CHARS and "\n" not in text
    if len(repr(value)) <= MAX_SHOWN_CHARS:
        assert text == repr(value)


def test_yaml_text_is_capped_lower_than_json_text():
    big = "x" * (5 * 2**20)
    with pytest.raises(GeotrainError, match="f.yaml: YAML text larger than 4 MiB .write large files as JSON"):
        parse_document(f"a: {big}", "f.yaml")
    assert parse_document(json.dumps({"a": big}), "f.json") == {"a": big}


def test_yaml_node_budget_is_enforced(monkeypatch):
    import geotrain.yaml_text as yaml_text

    monkeypatch.setattr(yaml_text, "MAX_YAML_NODES", 10)
    assert parse_document("a: [1, 2, 3]", "f.yaml") == {"a": [1, 2, 3]}
    with pytest.raises(GeotrainError, match="more than 10 values in YAML"):
        parse_document("a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "f.yaml")
    assert parse_document(json.dumps({"a": list(range(100))}), "f.json") == {"a": list(range(100))}


def test_every_geotrain_error_message_is_one_bounded_line():
    message = str(GeotrainError("a\nb" + "c" * 5000))
    assert "\n" not in message and len(message) <= 1000 and message.startswith("a b")


# ---- item 9: YAML 1.1 surprises ----------------------------------------------------------------------

def test_leading_zero_is_decimal_as_in_yaml_1_2():
    cluster = parse_cluster_text("regions: [{name: a, devices: 010, intra: {gbps: 10, ms: 0.1}}]\n", "z.yaml")
    assert cluster.n_devices == 10


@pytest.mark.parametrize("text,value", [
    ("a: 1:30", "1:30"), ("a: yes", "yes"), ("a: no", "no"), ("a: on", "on"), ("a: off", "off"), ("a: 1_000", "1_000"),
    ("a: 2024-01-01", "2024-01-01"), ("a: 0x10", 16), ("a: 0o17", 15), ("a: 017", 17), ("a: 1e3", 1000.0),
    ("a: 1.3e9", 1.3e9), ("a: -.5", -0.5), ("a: true", True), ("a: FALSE", False), ("a: ~", None), ("a:", None),
    ('{"a": 5e1}', 50.0), ('a: "010"', "010"),
])
def test_scalars_read_as_yaml_1_2_core_schema(text, value):
    assert parse_document(text, "s.yaml") == {"a": value}


def test_sexagesimal_latency_is_not_90():
    text = TWO.replace("ms: 50", "ms: 1:30")
    with pytest.raises(ClusterFileError, match=r"links\[0\].ms: must be a number, got '1:30'"):
        parse_cluster_text(text, "t.yaml")


def test_yes_is_a_region_name_not_a_boolean():
    cluster = parse_cluster_text(TWO.replace("name: a,", "name: yes,").replace("[a, b]", "[yes, b]"), "t.yaml")
    assert cluster.region_names == ("yes", "b")


@pytest.mark.parametrize("text,key", [
    (TWO.replace("name: two", "name: two\nname: three"), "'name'"),
    (TWO.replace("devices: 2, intra", "devices: 2, devices: 3, intra"), "'devices'"),
    ('{"regions": [], "regions": []}', "'regions'"),
])
def test_duplicate_keys_are_refused_naming_key_and_file(text, key):
    with pytest.raises(ClusterFileError, match=f"dup.yaml: .*duplicate key {key}"):
        parse_cluster_text(text, "dup.yaml")


def test_duplicate_keys_in_job_and_plan_files():
    with pytest.raises(JobError, match="j.yaml: .*duplicate key 'hidden'"):
        parse_job_text(JOB + "hidden: 4\n", "j.yaml")
    with pytest.raises(PlanError, match="p.json: duplicate key 'stages'"):
        Plan.from_text('{"stages": 1, "stages": 2, "replicas": 1, "assignment": [[0]]}', "p.json")


# ---- item 12: job values -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,fragment", [
    (JOB.replace("seq_len: 2048", "seq_len: 2048.5"), "seq_len must be an integer, got 2048.5"),
    (JOB.replace("hidden: 2048", "hidden: 1.5"), "hidden must be an integer, got 1.5"),
    ("name: 12\n" + JOB, "job name must be a non-empty string, got 12"),
    ("name: [a]\n" + JOB, "job name must be a non-empty string, got ['a']"),
    (JOB.replace("1.3e9", "1e300"), "params must be at most 1e+15, got 1e+300"),
    (JOB.replace("global_batch: 1024", "global_batch: 1e300"), "global_batch must be at most"),
    (JOB.replace("1.3e9", "1e400"), "params must be a number > 0, got inf"),
    (JOB.replace("hidden: 2048", "hidden: true"), "hidden must be a number > 0, got True"),
])
def test_impossible_job_values_are_refused(text, fragment):
    with pytest.raises(JobError, match="j.yaml") as caught:
        parse_job_text(text, "j.yaml")
    assert fragment in str(caught.value)


def test_integral_float_fields_are_read_as_integers():
    job = parse_job_text(JOB.replace("seq_len: 2048", "seq_len: 2.048e3"), "j.yaml")
    assert job.seq_len == 2048 and isinstance(job.seq_len, int)


def test_global_batch_below_replicas_is_refused_at_plan_and_cost_time(tmp_path, capsys):
    (tmp_path / "small.yaml").write_text(JOB.replace("global_batch: 1024", "global_batch: 2"))
    code, line = cli_error(capsys, "plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "4",
                           "--job", str(tmp_path / "small.yaml"))
    assert code == 2 and "global_batch 2 is smaller than the 4 replicas" in line
    (tmp_path / "p.json").write_text(json.dumps({"stages": 1, "replicas": 3, "assignment": [[0, 1, 2]]}))
    code, line = cli_error(capsys, "cost", "--cluster", "seed-geo", "--plan", str(tmp_path / "p.json"),
                           "--job", str(tmp_path / "small.yaml"))
    assert code == 2 and "global_batch 2 is smaller than the 3 replicas" in line
    assert main(["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "2", "--json",
                 "--job", str(tmp_path / "small.yaml")]) == 0
    assert json.loads(capsys.readouterr().out)["cost"]["pp"] > 0


# ---- item 13: tracebacks -> one-line errors ---------------------------------------------------------

BAD_FILES = {
    "utf16": ("regions: [{name: a, devices: 1}]\n".encode("utf-16"), "UTF-16 text; save the file as UTF-8"),
    "binary": (bytes(range(256)) * 4, "binary data (NUL bytes)"),
    "latin1": ("name: Z\xfcrich\n".encode("latin-1"), "not UTF-8 text (byte 0xfc at offset 7)"),
    "nested": (b"[" * 100_000, f"nested more than {MAX_DEPTH} levels deep"),
    "nested-yaml": (b"a: " + b"[" * 100_000, f"nested more than {MAX_DEPTH} levels deep"),
    "300 digits": (b"stages: " + b"9" * 300, "integer out of range"),
    "300 digits json": (b'{"stages": ' + b"9" * 300 + b"}", "integer out of range"),
    "tag": (b"name: !!python/object/apply:os.system [echo hi]\n",
            "tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
    "two documents": (b"a: 1\n---\nb: 2\n", "not valid YAML/JSON"),
}


@pytest.mark.parametrize("kind", ["cluster", "job", "plan"])
@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_of_every_kind_give_one_line_errors(kind, name, tmp_path, capsys):
    data, fragment = BAD_FILES[name]
    path = tmp_path / "bad.txt"
    path.write_bytes(data)
    argv = {"cluster": ["cluster", "show", str(path)],
            "job": ["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "2", "--job", str(path)],
            "plan": ["cost", "--cluster", "seed-geo", "--plan", str(path)]}[kind]
    code, line = cli_error(capsys, *argv)
    assert code == 2 and line.startswith(f"geotrain: error: {path}") and fragment in line


@pytest.mark.parametrize("option", ["--job", "--cluster", "--plan"])
def test_a_directory_is_refused_as_a_file(option, tmp_path, capsys):
    argv = {"--job": ["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "2", "--job", str(tmp_path)],
            "--cluster": ["cluster", "show", str(tmp_path)],
            "--plan": ["cost", "--cluster", "seed-geo", "--plan", str(tmp_path)]}[option]
    code, line = cli_error(capsys, *argv)
    assert code == 2 and f"{tmp_path}: is a directory, not a file" in line


@pytest.mark.parametrize("doc", [[1, 2], "plan", 3, None])
def test_a_plan_that_is_not_an_object_is_refused(doc):
    with pytest.raises(PlanError, match="p.json: top level must be a JSON object"):
        Plan.from_text(json.dumps(doc), "p.json")


# ---- item 8: strict JSON -----------------------------------------------------------------------------

def _strict_loads(text):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_json_output_turns_non_finite_numbers_into_null(capsys):
    Output(json_mode=True).emit_json({"summary": {"error_pct": relative_error_pct(0.5, 0.0)},
                                      "values": [math.nan, np.float64("-inf"), np.array([1.0, np.inf]), 2.5],
                                      "n": np.int64(3)})
    doc = _strict_loads(capsys.readouterr().out)
    assert doc == {"summary": {"error_pct": None}, "values": [None, None, [1.0, None], 2.5], "n": 3}


def test_strict_json_text_never_writes_nan_or_infinity():
    text = strict_json_text({"a": (math.inf, -math.inf, math.nan), math.nan: 1}, indent=2)
    assert "NaN" not in text and "Infinity" not in text
    assert _strict_loads(text) == {"a": [None, None, None], "null": 1}


def test_a_tiny_bandwidth_is_refused_below_the_documented_minimum(capsys, tmp_path):
    path = tmp_path / "slow.yaml"
    path.write_text(TWO.replace("gbps: 1, ms: 50", "gbps: 1e-310, ms: 50"))
    code, line = cli_error(capsys, "plan", "--cluster", str(path), "--stages", "2", "--replicas", "2", "--json")
    assert code == 2 and "links[0].gbps: must be in 1e-06..1e+06 Gbit/s, got 1e-310" in line
    with pytest.raises(ClusterError, match="bandwidth_gbps must be in 1e-06..1e"):
        make_network([2, 2], 10.0, (1e-310, 1e-310), (1.0, 1.0), seed=0)


def test_largest_values_still_give_finite_json_costs(tmp_path, capsys):
    (tmp_path / "big.yaml").write_text("params: 1e15\nseq_len: 16777216\nhidden: 1048576\nglobal_batch: 1099511627776\n"
                                       "bytes_per_value: 16\n")
    (tmp_path / "slow.yaml").write_text(TWO.replace("gbps: 1, ms: 50", "gbps: 1e-6, ms: 1e6"))
    assert main(["plan", "--cluster", str(tmp_path / "slow.yaml"), "--stages", "2", "--replicas", "2", "--json",
                 "--job", str(tmp_path / "big.yaml"), "--method", "random"]) == 0
    cost = _strict_loads(capsys.readouterr().out)["cost"]
    assert all(math.isfinite(cost[k]) and cost[k] > 0 for k in ("dp", "pp", "total"))


# ---- item 14: rich markup in user text ---------------------------------------------------------------

MARKUP = TWO.replace("name: two", 'name: "Zürich [bold red]x[/]"').replace("name: a,", 'name: "evil[/]",').replace(
    "[a, b]", '["evil[/]", "[b]b"]').replace("name: b,", 'name: "[b]b",')


def test_markup_in_names_prints_as_written(tmp_path, capsys):
    path = tmp_path / "markup.yaml"
    path.write_text(MARKUP)
    assert main(["cluster", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Zürich [bold red]x[/]: 4 devices" in out and "evil[/]" in out and "[b]b" in out
    assert main(["plan", "--cluster", str(path), "--stages", "2", "--replicas", "2"]) == 0
    out = capsys.readouterr().out
    assert "Zürich [bold red]x[/] (4 devices" in out and "0=evil[/], 1=[b]b" in out
    assert main(["cluster", "show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "Zürich [bold red]x[/]"


def test_output_text_and_table_titles_are_not_markup(capsys):
    out = Output()
    out.text("a [/] b [bold]c")
    out.table("t [red]x[/]", ["h[/]", "v"], [["[i]", 1]])
    printed = capsys.readouterr().out
    assert "a [/] b [bold]c" in printed and "t [red]x[/]" in printed and "h[/]" in printed and "[i]" in printed


# ---- item 15: cluster size ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,fragment", [
    ("regions: [{name: a, devices: 10000000}]", f"regions[0].devices: must be at most {MAX_DEVICES:,}"),
    ("regions: [{name: a, devices: 5000, intra: {gbps: 1, ms: 1}}, {name: b, devices: 5000}]",
     f"regions[1].devices: the regions so far hold 10,000 devices, more than the limit of {MAX_DEVICES:,}"),
    ('{"devices": [' + ", ".join(["{}"] * (MAX_DEVICES + 1)) + '], "bandwidth_gbps": [], "latency_ms": []}',
     f"devices: {MAX_DEVICES + 1:,} devices exceed the limit"),
])
def test_clusters_beyond_the_device_limit_are_refused_before_allocating(text, fragment):
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster_text(text, "huge.yaml")
    assert fragment in str(caught.value)


def test_generators_refuse_beyond_the_device_limit():
    with pytest.raises(ClusterError, match="10,000,000 devices exceed the limit"):
        make_network([10**7], 10.0, (1.0, 1.0), (1.0, 1.0), seed=0)


# ---- items 18, 19: plan assignments ------------------------------------------------------------------

@pytest.mark.parametrize("assignment,fragment", [
    ([[True, False]], "assignment[0][0]: must be a device index (an integer), got True"),
    ([[0, False]], "assignment[0][1]: must be a device index (an integer), got False"),
    ([[0, 1.5]], "assignment[0][1]: must be a device index (an integer), got 1.5"),
    ([[0, "1"]], "assignment[0][1]: must be a device index (an integer), got '1'"),
    ([[0, -1]], f"assignment[0][1]: device index must be in 0..{MAX_DEVICES - 1}, got -1"),
    ([[0, 2**63 - 1]], f"device index must be in 0..{MAX_DEVICES - 1}, got 9223372036854775807"),
    ([[0, 1e300]], f"device index must be in 0..{MAX_DEVICES - 1}, got 1e+300"),
    ([[0], [1]], "assignment must have shape (1 stages, 2 replicas)"),
    ([[0, [1]]], "assignment[0][1]: must be a device index (an integer), got [1]"),
])
def test_bad_plan_assignments_show_the_real_value_and_range(assignment, fragment):
    with pytest.raises(PlanError) as caught:
        Plan.from_text(json.dumps({"stages": 1, "replicas": 2, "assignment": assignment}), "p.json")
    message = str(caught.value)
    assert fragment in message and "-9223372036854775808" not in message and "9223372036854775806" not in message


def test_plan_range_against_the_cluster_shows_the_cluster_range(tmp_path, capsys):
    (tmp_path / "p.json").write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 40]]}))
    code, line = cli_error(capsys, "cost", "--cluster", "seed-geo", "--plan", str(tmp_path / "p.json"))
    assert code == 2 and "assignment[0][1] = 40: device index must be in 0..31" in line


# ---- item 21: one-device regions ---------------------------------------------------------------------

@pytest.mark.parametrize("intra,fragment", [
    ("{gbps: -1, ms: 0.1}", "regions[2].intra.gbps: must be > 0, got -1"),
    ("{gbps: 10, ms: .nan}", "regions[2].intra.ms: must be finite, got nan"),
    ("{gbps: 10, msec: 1}", "regions[2].intra: unknown key 'msec'"),
    ("fast", "regions[2].intra: must be a mapping, got 'fast'"),
])
def test_a_one_device_region_intra_block_is_validated(intra, fragment):
    text = TWO.replace("links:", f"  - {{name: c, devices: 1, intra: {intra}}}\nlinks:") + (
        "  - {between: [a, c], gbps: 1, ms: 50}\n  - {between: [b, c], gbps: 1, ms: 50}\n")
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster_text(text, "one.yaml")
    assert fragment in str(caught.value)


# ---- item 22: time limits ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf", "soon"])
@pytest.mark.parametrize("option", ["--time-limit", "--bound-time-limit"])
def test_time_limits_must_be_positive_and_finite(option, value, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "2", f"{option}={value}"])
    assert caught.value.code == 2
    assert f"argument {option}: must be a" in capsys.readouterr().err


def test_positive_float_accepts_positive_numbers():
    assert positive_float("1.5") == 1.5 and positive_float("1e-3") == 1e-3


def test_a_large_dense_cluster_saved_as_yaml_reads_back(tmp_path):
    from geotrain.cluster import multicloud, save_cluster_file

    cluster = multicloud(8, 48, seed=1, jitter=0.1)  # 384 devices, not region-uniform: the dense form
    path = tmp_path / "big.yaml"
    save_cluster_file(cluster, path)
    again = load_cluster_file(path)
    assert again.device_names == cluster.device_names and np.array_equal(again.bandwidth_gbps, cluster.bandwidth_gbps)


def test_json_with_too_many_lists_is_refused_before_parsing():
    from geotrain.yaml_text import MAX_JSON_CONTAINERS

    with pytest.raises(GeotrainError, match=f"more than {MAX_JSON_CONTAINERS:,} lists and mappings"):
        parse_document("[" + ",".join(["[]"] * MAX_JSON_CONTAINERS) + "]", "many.json")


@pytest.mark.parametrize("text", ['{"a": [1, [2, {"b": 9223372036854775808}]]}', "[-9223372036854775808]",
                                  "9223372036854775808", '{"a": ' + "9" * 5000 + "}"])
def test_json_integers_beyond_64_bits_are_refused_at_any_depth(text):
    with pytest.raises(GeotrainError, match=r"integer out of range \(\|n\| must be < 2\*\*63\)"):
        parse_document(text, "big.json")
