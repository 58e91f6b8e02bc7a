"""`geotrain emulate` refuses, in one line and before any rank starts, a module `python -m` would not find and
one file named by both --trace and --report (the trace would overwrite the report), whatever links name it."""

from __future__ import annotations

import os

import pytest
from runtime_2x2 import write_job_files

from geotrain.cli.main import main


@pytest.mark.parametrize("module", ["no.such.module", "json.no_such_part", "not-a-name"])
def test_a_module_that_python_m_would_not_find_is_one_line(tmp_path, capsys, monkeypatch, module):
    monkeypatch.chdir(tmp_path)
    files = write_job_files(tmp_path)
    assert main(["emulate", "--cluster", files["cluster"], "--devices", "0,1", "-m", module]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"geotrain: error: emulate -m '{module}': no such module (as `python -m` would look for it from this "
        "directory and PYTHONPATH)"]


def test_a_module_of_the_working_directory_is_found_without_running_it(tmp_path, monkeypatch):
    from geotrain.cli.emulate_cmd import module_found

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")  # never run by the check
    (tmp_path / "pkg" / "train.py").write_text("")
    assert module_found("pkg.train") and module_found("json.decoder")
    assert not module_found("pkg.nothing") and not module_found("pkg.train.deeper")


def test_one_file_for_trace_and_report_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files = write_job_files(tmp_path)
    (tmp_path / "s.py").write_text("")
    assert main(["emulate", "--cluster", files["cluster"], "--devices", "0,1", "--trace", "out.json", "--report",
                 "./out.json", "--", "s.py"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "geotrain: error: emulate: --trace and --report name the same file './out.json': the trace would overwrite "
        "the report; give two paths"]
    assert not (tmp_path / "out.json").exists()


def test_two_names_of_one_file_are_one_file_for_trace_and_report(tmp_path):
    from geotrain.cli.emulate_cmd import same_file

    (tmp_path / "out.json").write_text("{}")
    os.link(tmp_path / "out.json", tmp_path / "hard.json")  # the trace would overwrite the report through it
    (tmp_path / "soft.json").symlink_to("out.json")
    for other in ("hard.json", "soft.json", "./out.json"):
        assert same_file(str(tmp_path / "out.json"), str(tmp_path / other)), other
    assert not same_file(str(tmp_path / "out.json"), str(tmp_path / "new.json"))
