"""The manual (docs/, mkdocs.manual.yml) and the README: the manual builds with `mkdocs build --strict` on the tests'
archive, its generated pages follow the code (CLI reference from the parser, one line per column from the schema),
and the README is short, links only to what exists, and its "profile your own model" examples run as written."""

from __future__ import annotations

import argparse
import html
import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HOOK = ROOT / "docs" / "hooks" / "manual.py"


def _hook():
    """docs/hooks/manual.py as MkDocs loads it: a file, not a package module."""
    spec = importlib.util.spec_from_file_location("cbsite_manual_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(parser._subparsers._group_actions[0].choices)


@pytest.fixture(scope="module")
def manual(demo_runs, tmp_path_factory) -> Path:
    """The manual built once, strictly, with the reports section drawn from the tests' archive."""
    out = tmp_path_factory.mktemp("manual") / "site"
    env = {**os.environ, "CBSITE_MANUAL_RUNS": str(demo_runs), "CBSITE_BUILD_JOBS": "1", "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.manual.yml", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_manual_builds_strictly_with_every_page_of_its_nav(manual):
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !ENV and friends: not needed here
    config = yaml.load((ROOT / "mkdocs.manual.yml").read_text(), Loader=Loader)

    def pages(nav):
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            yield from pages(value) if isinstance(value, list) else [value]

    for page in pages(config["nav"]):
        built = manual / (page[:-3] if page != "index.md" else "") / "index.html"
        assert built.is_file(), f"{page} of the nav was not built"
    assert not (manual / "hooks").exists() and not (manual / "scripts").exists(), "hooks and scripts are not pages"


def test_the_cli_reference_page_holds_every_subcommands_help(manual):
    from cbsite.cli import build_parser

    page = html.unescape((manual / "cli" / "index.html").read_text())
    for name, sub in _subcommands(build_parser()).items():
        assert f'id="cbsite-{name}"' in page, f"no section for cbsite {name}"
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in page, f"cbsite {name} {flag} is missing from the CLI reference"


def test_the_numbers_page_lists_every_column_of_the_schema(manual):
    from cbsite import schema

    page = (manual / "numbers" / "index.html").read_text()
    for name in schema.COMPONENTS_SCHEMA.names:
        assert f"<code>{name}</code>" in page, f"column {name} is not on the numbers page"
    assert "(undocumented)" not in page


def test_the_manual_shows_the_archives_reports_through_the_plugin(manual, demo_runs):
    from cbsite import archive

    refs = archive.list_runs(demo_runs)
    assert refs
    assert (manual / "reports" / "index.html").is_file()
    for model in {ref.model for ref in refs}:
        assert (manual / "reports" / "models" / model / "index.html").is_file(), model
    for ref in refs:
        assert (manual / "reports" / "runs" / ref.model / ref.version / ref.run_id / "index.html").is_file(), ref.run_id


def test_a_changed_help_string_changes_the_cli_reference(monkeypatch):
    from cbsite import cli

    hook = _hook()
    before = hook.render_cli()
    original = cli.build_parser

    def edited() -> argparse.ArgumentParser:
        parser = original()
        budget = next(a for a in _subcommands(parser)["collect"]._actions if "--budget" in a.option_strings)
        budget.help = "a help string the manual has never seen"
        return parser

    monkeypatch.setattr(cli, "build_parser", edited)
    after = hook.render_cli()
    assert "a help string the manual has never seen" in after and "a help string the manual has never seen" not in before
    assert "seconds of timed runs per component and phase" in before


def test_a_column_without_a_line_is_a_build_warning(monkeypatch, caplog):
    hook = _hook()
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.manual"):
        hook.render_columns()
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    monkeypatch.delitem(hook.COLUMN_LINES, "flops")
    monkeypatch.setitem(hook.COLUMN_LINES, "no_such_column", "gone")
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.manual"):
        table = hook.render_columns()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "'flops'" in messages and "'no_such_column'" in messages
    assert "| `flops` | `int64` | (undocumented) |" in table


def test_the_plugin_table_lists_every_installed_plugin_with_its_options():
    from cbsite.collector.plugins.registry import SELECTABLE, available

    table = _hook().render_plugin_options()
    for kind in SELECTABLE:
        for name, entry in available(kind).items():
            assert f"| `{name}` | {kind[:-1]} |" in table
            for option in getattr(entry.load(), "options", {}) or {}:
                assert f"`{option}` (" in table


def test_the_readme_is_short_and_links_only_to_what_exists():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert "docs/img/run-page.png" in local and "docs/img/diff-page.png" in local
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


@pytest.mark.slow
def test_the_readmes_own_model_examples_run_as_written(tmp_path):
    """The provider file, its `cbsite collect` line and the notebook cell, copied from the README and run."""
    text = README.read_text()
    provider = next(b for b in _blocks(text, "python") if b.startswith("# mymodels.py"))
    notebook = next(b for b in _blocks(text, "python") if "cbsite.profile(" in b)
    command = next(line for b in _blocks(text, "sh") for line in b.splitlines() if "cbsite collect mymodels:build" in line)
    (tmp_path / "mymodels.py").write_text(provider)
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "CBSITE_RUNS": str(tmp_path / "runs")}
    # Given peaks and no calibration: what the example shows is the provider and its options, not the peaks.
    line = command.replace(".venv/bin/", "") + (" --budget 0.02 --no-step --no-progress --peak-flops 1e11"
                                                " --peak-bandwidth 1e10 --no-calibrate")
    proc = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    from cbsite import archive

    (ref,) = archive.list_runs(tmp_path / "runs")
    run = archive.read_run(ref.path)
    assert (ref.model, ref.version) == ("mymodels-build", "v1")
    assert run.meta["provider"]["options"] == {"hidden": 128, "act": "gelu", "batch": 32}  # parsed, not strings
    first = run.table("forward").filter(run.table("forward")["path"] == "0")
    assert first["flops"][0] == 2 * 32 * 16 * 128  # Linear(16, 128) on a batch of 32

    (tmp_path / "nb").mkdir()
    # The cell takes given peaks too: what it shows is the call, not the peaks.
    script = notebook.replace("min_run_time=0.05", "min_run_time=0.01, step=False, calibrate=False, peak_flops=1e11, "
                                                   "peak_bandwidth=1e10")
    assert script != notebook, "the README's cell no longer sets min_run_time=0.05"
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path / "nb", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (ref,) = archive.list_runs(tmp_path / "nb" / "runs")
    rows = archive.read_run(ref.path).table("forward")
    assert (ref.model, ref.version) == ("two-tower", "v1")
    assert dict(zip(rows["path"], rows["flops"])) == {"": 2 * 64 * 16 * 32 + 2 * 64 * 8 * 32, "user": 2 * 64 * 16 * 32,
                                                      "item": 2 * 64 * 8 * 32}
