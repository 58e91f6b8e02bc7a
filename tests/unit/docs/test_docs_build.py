"""The docs site builds with `mkdocs build --strict` (every warning fails it: a broken link, a nav entry
without its page, a page outside the nav, a docstring cross-reference that resolves nowhere), and the
generated reference covers the code it is generated from."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from geotrain.cli import reference
from geotrain.cli.main import build_parser
from paths import ROOT

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def minimal_site(tmp_path: Path, pages: dict[str, str]) -> Path:
    """A two-page site in a temporary folder under the repository's mkdocs.yml settings (strict, validation,
    theme, markdown extensions), without the hook and mkdocstrings: a build of seconds, not of the whole docs."""
    root = tmp_path / "repo"
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["validation"]["unrecognized_links"] == "warn"
    config.pop("hooks")
    config.update(plugins=["search"], nav=[{"Home": "index.md"}, {"Guide": [{"Quick start": "guide/quick-start.md"}]}])
    for name, text in pages.items():
        (root / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "docs" / name).write_text(text)
    (root / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def test_the_site_builds_strict_with_the_generated_reference(tmp_path):
    done = mkdocs_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("index.html", "guide/quick-start/index.html", "reference/cli/index.html",
                 "reference/config/index.html", "reference/files/index.html", "reference/composition/index.html",
                 "reference/api/geotrain.diloco/index.html", "history/wan/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    cli = (tmp_path / "site" / "reference/cli/index.html").read_text()
    assert "--sync-every" in cli and "--dp-codec" in cli


def test_a_broken_link_fails_the_strict_build(tmp_path):
    root = minimal_site(tmp_path, {"index.md": "# geotrain\n\nStart with [the quick start](guide/quick-start.md).\n",
                                   "guide/quick-start.md": "# Quick start\n\nBack [home](../index.md).\n"})
    page = root / "docs" / "guide" / "quick-start.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = mkdocs_build(root, tmp_path / "site")
    said = done.stdout + done.stderr
    assert done.returncode != 0
    # one warning: the broken link, the only one on the site
    assert "'guide/no-such-page.md' is not found" in said and "Aborted with 1 warnings in strict mode" in said


def test_every_command_and_flag_is_in_the_cli_reference():
    text = reference.cli_markdown()
    parser = build_parser()
    commands = [path for path, _ in reference._commands(parser) if path]
    for path, sub in reference._commands(parser):
        if not path:
            continue
        assert f"`geotrain {' '.join(path)}`" in text
        for action in sub._actions:
            for flag in action.option_strings:
                assert f"<code>{flag}" in text or f", {flag}" in text, (path, flag)
    assert len(commands) >= 20


def test_the_composition_page_lists_every_setting_pair_and_rule_of_the_table():
    from geotrain.runtime.composition import RULES, SETTINGS, pair_refusal, pairs

    text = reference.composition_markdown()
    assert all(f"| `{setting.name}` |" in text for setting in SETTINGS)
    assert all(reference._cell(rule.reason) in text for rule in RULES)
    cells = list(pairs())
    refused = sum(pair_refusal(a.name, b.name) is not None for a, b in cells)
    assert f"## Every pair ({len(cells)} pairs, {refused} refused)" in text and 0 < refused < len(cells)


def test_every_config_key_is_in_the_config_reference():
    from dataclasses import fields

    from geotrain.runtime.config import section_types

    text = reference.config_markdown()
    for section in section_types():
        assert f"## `[{section.SECTION}]`" in text
        for f in fields(section):
            if "help" in f.metadata and not f.metadata.get("internal"):
                assert f"| `{f.name}` |" in text, (section.SECTION, f.name)


def test_a_file_key_without_a_description_fails_the_files_reference(monkeypatch):
    assert "| `global_batch` |" in reference.files_markdown()
    monkeypatch.delitem(reference.JOB_KEYS, "vocab")
    with pytest.raises(ValueError, match="job file keys"):
        reference.files_markdown()


def test_the_results_and_history_pages_join_the_nav_by_themselves(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "wan.md").write_text("# Codecs chosen by the planner: and more\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench-wan.md").write_text("# Time to a target loss (`bench wan`)\n")
    nav = [{"Guide": [{"Quick start": "guide/quick-start.md"}]}, {"Results": ["results/index.md"]},
           {"Reference": []}, {"History": ["history/index.md"]}]
    config = hooks.on_config({"docs_dir": str(tmp_path), "nav": nav})
    guide, results, reference_nav, history = (next(iter(section.values())) for section in config["nav"])
    assert guide == [{"Quick start": "guide/quick-start.md"}]
    assert results[1:] == [{"Time to a target loss": "results/bench-wan.md"}]
    assert history[1:] == [{"Codecs chosen by the planner": "history/wan.md"}]
    assert reference_nav[0]["Python API"][0] == {"geotrain.diloco": "reference/api/geotrain.diloco.md"}
