"""`geotrain data prepare` never destroys its input and never leaves half a token file: an output
that is an input file (directly, through a symlink or hard link, `./` or `..`) is refused before
anything is read; both files are written under temporary names and renamed when complete."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.data import DataError, prepare_token_file, read_token_file, write_token_file

TEXT = "the quick brown fox jumps over the lazy dog\n" * 20


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(TEXT)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.txt").symlink_to("corpus.txt")
    os.link(tmp_path / "corpus.txt", tmp_path / "hard.txt")
    return tmp_path / "corpus.txt"


@pytest.mark.parametrize("out", ["corpus.txt", "./corpus.txt", "link.txt", "hard.txt", "sub/../corpus.txt",
                                 "{abs}"])
def test_an_output_that_is_the_input_is_refused_and_the_input_kept(corpus, out, capsys):
    out = out.format(abs=corpus)
    assert main(["data", "prepare", "corpus.txt", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err == (f"geotrain: error: --out {out!r}: {str(Path(out))!r} is the input file 'corpus.txt'; "
                   f"writing it would destroy the input: choose another output path\n")
    assert corpus.read_text() == TEXT


def test_a_sidecar_that_would_overwrite_an_input_of_a_directory_is_refused(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(TEXT)
    (tmp_path / "docs" / "b.md").write_text(TEXT)
    with pytest.raises(DataError, match="is the input file"):
        prepare_token_file(tmp_path / "docs", tmp_path / "docs" / "b.md")
    assert (tmp_path / "docs" / "b.md").read_text() == TEXT


@pytest.mark.parametrize("out, message", [
    ("sub", "argument --out: must be a file path, got the directory 'sub'"),
    ("missing/dir/x.bin", "argument --out: 'missing/dir/x.bin': directory 'missing/dir' does not exist"),
    ("corpus.txt/x.bin", "argument --out: 'corpus.txt/x.bin': directory 'corpus.txt' is not a directory"),
])
def test_an_unusable_output_path_is_a_usage_error_before_any_work(corpus, out, message, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["data", "prepare", "corpus.txt", "--out", out])
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"geotrain data prepare: error: {message}"


def test_a_failed_write_leaves_the_previous_token_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "tok.bin"
    write_token_file(out, np.arange(10), 256, {})
    before = (out.read_bytes(), Path(f"{out}.json").read_text())

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)  # the sidecar cannot be written: disk full
    with pytest.raises(DataError, match=f"data {str(out)!r}: cannot write token file: No space left on device"):
        write_token_file(out, np.arange(100, 200), 256, {})
    monkeypatch.undo()
    assert (out.read_bytes(), Path(f"{out}.json").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok.bin", "tok.bin.json"]
    ids, _ = read_token_file(out)
    assert ids.tolist() == list(range(10))
