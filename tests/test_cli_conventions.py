"""The command line follows the conventions of pytest, mkdocs and hyperfine: --version, one description per command,
help with defaults for every option, grouped options, -q/-v before or after the command, JSON from ls/show, export onto stdout, a hint to diff
where compare is given runs, and an exit status of its own for a missing dependency."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from cbsite import archive
from cbsite.cli import MISSING_DEPENDENCY, USAGE_ERROR, build_parser, main

REPO = Path(__file__).resolve().parents[1]


def _commands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    parser = parser or build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _cbsite(*args: str, cwd: Path | None = None, env: dict | None = None, hide: str | None = None,
            timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m cbsite ARGS` in a fresh process; with `hide`, as if that package were not installed."""
    code = "from cbsite.cli import main; raise SystemExit(main(sys.argv[1:]))"
    if hide:
        code = ("import importlib.abc\n"
                "class Hide(importlib.abc.MetaPathFinder):\n"
                "    def find_spec(self, name, path, target=None):\n"
                f"        if name.split('.')[0] == {hide!r}:\n"
                "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
                "sys.meta_path.insert(0, Hide())\n" + code)
    paths = [str(REPO)] + ([env["PYTHONPATH"]] if env and "PYTHONPATH" in env else [])
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(paths)}
    full_env.pop("TORCH_LOGS", None)
    return subprocess.run([sys.executable, "-c", "import sys\n" + code, *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, timeout=timeout)


def test_version_prints_the_package_version(capsys):
    from cbsite import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"cbsite {__version__}"


def test_help_lists_each_command_once_with_a_line(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    commands = _commands()
    assert {"collect", "compare", "diff", "ls", "show", "export", "build", "demo"} <= set(commands)
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()[0] in commands]
    assert sorted(listed) == sorted(commands), out  # every command, once
    assert "{" not in out  # no brace list of the choices beside the list


def test_every_command_has_a_description_and_every_option_help_with_its_default():
    for name, sub in _commands().items():
        assert sub.description and len(sub.description) > 20, name
        assert name in sub.format_help()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.dest)
            says_something = not (action.default is None or action.default is False or action.default in ([], ""))
            if action.option_strings and says_something and not isinstance(action, argparse._CountAction):
                shown = sub.formatter_class(prog="x")._get_help_string(action)
                assert "default" in shown, (name, action.dest, shown)


def test_collect_options_are_grouped():
    collect = _commands()["collect"]
    titles = {g.title: g for g in collect._action_groups}
    for title in ("selection", "timing", "output", "distributed"):
        assert titles[title]._group_actions, title
    where = {a.dest: g.title for g in collect._action_groups for a in g._group_actions}
    assert where["max_depth"] == "selection" and where["budget"] == "timing" and where["distributed"] == "distributed"
    # Nothing but --help is left in argparse's catch-all group.
    assert [a.dest for a in titles["options"]._group_actions] == ["help"]


def test_shared_options_come_from_one_parent_parser():
    parser = build_parser()
    commands = _commands(parser)
    no_archive = ("serve", "completion")
    runs = {name: next(a for a in sub._actions if a.dest == "runs") for name, sub in commands.items() if name not in no_archive}
    verbose = {name: next(a for a in sub._actions if a.dest == "verbose") for name, sub in commands.items()}
    verbose["cbsite"] = next(a for a in parser._actions if a.dest == "verbose")
    assert len({id(a) for a in runs.values()}) == 1, "one --runs action, shared"
    assert len({id(a) for a in verbose.values()}) == 1, "one -v action, shared, before the command too"


@pytest.mark.parametrize("argv", [["-v", "ls"], ["ls", "-v"], ["--verbose", "collect", "dlrm", "--max-depth", "1"]])
def test_verbose_is_read_before_or_after_the_command(argv):
    from cbsite.cli.common import verbosity

    assert verbosity(build_parser().parse_args(argv)) > 0
    assert verbosity(build_parser().parse_args(["-q", *argv])) == 0  # -q and -v in either place: they cancel


@pytest.mark.parametrize("argv", [["-q", "ls"], ["ls", "-q"], ["-q", "show", "x@v1"], []])
def test_quiet_is_read_before_or_after_the_command_and_neither_is_normal(argv):
    from cbsite.cli.common import verbosity

    args = build_parser().parse_args(argv or ["ls"])
    assert verbosity(args) == (-1 if argv else 0)


@pytest.mark.parametrize("where", ["before", "after"])
def test_stage_times_show_with_verbose_before_or_after_the_command(tmp_path, capsys, where):
    from tests.helpers.runfactory import make_run

    run = make_run({"": {"tower": {"tower.mlp": None}}}, model="twotower")
    run.meta["breakdown_s"] = {"components": 1.5, "step": 0.25}  # where a collection's time went (run.json)
    run.save(tmp_path / "runs")
    show = ["show", "twotower@v1", "--runs", str(tmp_path / "runs"), "--top", "1"]
    assert main(["-v", *show] if where == "before" else [*show, "-v"]) == 0
    assert "time: " in capsys.readouterr().out
    assert main(["-q", *show] if where == "before" else [*show, "-q"]) == 0
    assert "time: " not in capsys.readouterr().out


def test_ls_and_show_print_json(demo_runs, capsys):
    refs = archive.list_runs(demo_runs)
    assert main(["ls", "--runs", str(demo_runs), "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["run_id"] for r in listed if "run_id" in r) == sorted(r.run_id for r in refs)
    assert all(isinstance(r["counts"], dict) for r in listed if "run_id" in r)

    ref = refs[0]
    assert main(["show", ref.run_id, "--runs", str(demo_runs), "--format", "json", "--top", "3"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run"]["run_id"] == ref.run_id
    assert 0 < len(shown["top_components"]) <= 3


def test_show_writes_counts_in_words_and_mfu_in_percent(demo_runs, capsys):
    ref = next(r for r in archive.list_runs(demo_runs) if r.model == "dlrm")
    assert main(["show", ref.run_id, "--runs", str(demo_runs), "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "{'" not in out  # "28 measured, 1 estimated, ...", never a dict
    assert "MFU" in out
    rows = [line for line in out.splitlines() if "│" in line and "measured" in line]
    assert rows and all(line.split("│")[8].strip().endswith("%") for line in rows), rows
    assert "time:" not in out  # the stage times only with -v


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_export_to_stdout_with_a_dash(demo_runs, tmp_path, fmt):
    ref = next(r for r in archive.list_runs(demo_runs) if r.model == "dlrm")
    done = _cbsite("export", ref.run_id, "--runs", str(demo_runs), "--format", fmt, "--out", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert not (tmp_path / "-").exists() and not list(tmp_path.iterdir())
    rows = archive.read_run(ref.path).table().height
    if fmt == "csv":
        assert pl.read_csv(io.BytesIO(done.stdout)).height == rows
    elif fmt == "parquet":
        assert pl.read_parquet(io.BytesIO(done.stdout)).height == rows
    else:
        data = json.loads(done.stdout)
        assert data["run"]["run_id"] == ref.run_id and len(data["rows"]) == rows


def test_compare_given_runs_points_to_diff(demo_runs, capsys):
    assert main(["compare", "twotower@v1", "twotower@v2", "--runs", str(demo_runs)]) == USAGE_ERROR
    captured = capsys.readouterr()
    assert "cbsite diff twotower@v1 twotower@v2" in captured.err
    assert "collecting" not in captured.err + captured.out and "unknown provider" not in captured.err
    base, head = [r.run_id for r in archive.list_runs(demo_runs) if r.model == "dlrm"][:2]
    assert main(["compare", base, head, "--runs", str(demo_runs)]) == USAGE_ERROR
    assert f"cbsite diff {base} {head}" in capsys.readouterr().err


def test_a_missing_package_is_one_line_with_its_install_hint(tmp_path):
    for args, hidden, extra in ((("collect", "dlrm"), "torch", "collect"),
                                (("build", "--out", str(tmp_path / "site")), "mkdocs", "site")):
        done = _cbsite(*args, "--runs", str(tmp_path / "runs"), hide=hidden, cwd=tmp_path)
        err = done.stderr.decode()
        assert done.returncode == MISSING_DEPENDENCY == 4, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert hidden in err and f"pip install 'cbsite[{extra}]'" in err


NOISY_PROVIDER = '''
import logging
import warnings

import torch


def build():
    # What third-party code says while a model is built: a torch log warning and a Python warning.
    logging.getLogger("torch.fx._symbolic_trace").warning("a torch log warning for the test")
    warnings.warn("a third-party warning for the test", UserWarning)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(4, 8),)
'''


@pytest.mark.slow
def test_quiet_normal_and_verbose_collections(tmp_path):
    (tmp_path / "noisy_provider.py").write_text(NOISY_PROVIDER)
    # Given peaks and no calibration: what is under test is what each level prints, not the peaks; the cap bounds the
    # waits for a quiet machine beside the rest of the suite.
    common = ("--budget", "0.005", "--max-component-s", "0.5", "--no-step", "--peak-flops", "1e11", "--peak-bandwidth",
              "1e10", "--no-calibrate", "--max-depth", "1")
    outputs = {}
    for flag in ("-q", None, "-v"):
        done = _cbsite("collect", "noisy_provider:build", "--runs", str(tmp_path / "runs"), "--version", f"v{flag}",
                       *common, *([flag] if flag else []), cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        outputs[flag] = (done.stdout.decode(), done.stderr.decode())
    quiet, normal, verbose = outputs["-q"], outputs[None], outputs["-v"]
    for out, _ in (quiet, normal, verbose):
        assert "saved " in out
    assert "a torch log warning" in verbose[1] and "a third-party warning" in verbose[1]
    for out, err in (quiet, normal):
        assert "a torch log warning" not in out + err and "a third-party warning" not in out + err
    assert "time: " in verbose[0] and "time: " not in normal[0]
    assert "components 2 measured" in normal[0] or "measured," in normal[0]
    assert "┃" in normal[0] and "┃" not in quiet[0]  # the summary table, left out with -q
    assert len(quiet[0].strip().splitlines()) == 1


def test_build_is_incremental_by_default_and_quiet_unless_verbose(tmp_path, monkeypatch, capsys):
    import cbsite.generator as generator
    from cbsite.generator.cache import default_cache_dir

    calls = []

    def build_site(runs, out, **kwargs):
        calls.append(kwargs)
        return out

    monkeypatch.setattr(generator, "build_site", build_site)
    out = tmp_path / "site"
    base = ["build", "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert main(base) == 0
    assert main([*base, "--no-cache", "-v"]) == 0
    assert main([*base, "--cache", str(tmp_path / "mine")]) == 0
    assert main(["-v", *base]) == 0
    assert [c["cache"] for c in calls] == [default_cache_dir(out), None, tmp_path / "mine", default_cache_dir(out)]
    assert [c["quiet"] for c in calls] == [True, False, True, False]  # mkdocs' INFO lines only with -v, before or after
    assert f"cbsite serve {out}" in capsys.readouterr().out  # how to open the site
    with pytest.raises(SystemExit):
        main([*base, "--no-cache", "--cache", str(tmp_path / "mine")])


def test_the_launchers_entrypoint_runs_collect_distributed_and_raises_its_exit_status(capsys):
    from cbsite.cli import entrypoint

    with pytest.raises(SystemExit) as done:
        entrypoint("dlrm", "--budget", "nan")  # refused before any process group is made
    assert done.value.code == USAGE_ERROR
    assert "--budget must be" in capsys.readouterr().err
