"""examples/github-pr-workflow.yml, checked as far as a machine without GitHub allows.

* it is valid YAML with the steps a pull request needs;
* it installs the way the Makefile does: the same pins (torch, torchrec, fbgemm), torch from the CPU wheel
  index, fbgemm's CPU build (never the CUDA `fbgemm-gpu` on a CPU runner), torchrec with --no-deps and then
  the same hand-listed requirements, submitit, and cbsite with its site extra;
* every `cbsite` command it runs names a real verb and real options, and the diff and publish steps run
  against a copy of the demo runs (tests/data/runs) (compare is not run: it would measure a model; its options are
  checked);
* it judges latency (`cbsite compare --base-rev` of the PR's base, or collections with rounds), takes the gate rules
  from the base branch rather than the PR's head, and says the fork-PR and concurrent-publish limits.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "github-pr-workflow.yml"
MAKEFILE = ROOT / "Makefile"
CBSITE = [sys.executable, "-m", "cbsite"]


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list[dict]:
    (job,) = _workflow()["jobs"].values()
    return job["steps"]


def _commands(script: str) -> list[str]:
    """The shell commands of a `run:` block, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _make_vars() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)\s*\?=\s*(\S+)\s*$", MAKEFILE.read_text(), re.M))


def _make_installs() -> list[list[str]]:
    """The Makefile's `$(PIP) install` lines of the install recipe, on a machine without CUDA."""
    text = MAKEFILE.read_text()
    cpu_fbgemm = re.search(r"^else\nFBGEMM_PKG := (\S+)$", text, re.M).group(1)
    values = {**_make_vars(), "FBGEMM_PKG": cpu_fbgemm.replace("$(FBGEMM_VERSION)", _make_vars()["FBGEMM_VERSION"])}
    out = []
    for line in re.findall(r"^\t\$\(PIP\) install (.+)$", text, re.M):
        line = re.sub(r"\$\(([A-Z_]+)\)", lambda m: values[m.group(1)], line)
        args = [a for a in shlex.split(line) if a != "--quiet"]
        if args in (["--upgrade", "pip"],) or "-e" in args:
            continue  # pip itself; the editable install of the checkout (the workflow installs cbsite instead)
        out.append(args)
    return out


def _workflow_installs() -> tuple[list[list[str]], dict[str, list[str]]]:
    env = _workflow()["env"]
    (step,) = [s for s in _steps() if s.get("name") == "Install cbsite"]
    installs, options = [], {}
    for cmd in _commands(step["run"]):
        cmd = re.sub(r"\$([A-Z_]+)", lambda m: env[m.group(1)], cmd)
        args = shlex.split(cmd)
        if args[:2] != ["pip", "install"]:
            continue
        args = [a for a in args[2:] if a != "--quiet"]
        if "--index-url" in args:
            i = args.index("--index-url")
            options[args[0]] = args[i:i + 2]
            del args[i:i + 2]
        installs.append(args)
    return installs, options


def test_workflow_has_the_steps_of_a_review():
    wf = _workflow()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as true
    assert "pull_request" in on
    names = [s.get("name", s.get("uses")) for s in _steps()]
    for needed in ("Install cbsite", "Compare the base and the head", "Compare and apply the gate", "Gate"):
        assert needed in names


def test_workflow_installs_as_the_makefile_does():
    make, env = _make_vars(), _workflow()["env"]
    for key in ("TORCH_VERSION", "TORCHREC_VERSION", "FBGEMM_VERSION"):
        assert str(env[key]) == make[key], key
    installs, options = _workflow_installs()
    *deps, cbsite = installs
    assert deps == _make_installs()
    assert options == {f"torch=={make['TORCH_VERSION']}": ["--index-url", "https://download.pytorch.org/whl/cpu"]}
    assert ["--no-deps", f"torchrec=={make['TORCHREC_VERSION']}"] in deps
    (spec,) = cbsite
    assert re.match(r"cbsite\[[^\]]*\bsite\b[^\]]*\] @ git\+https://", spec), spec
    text = WORKFLOW.read_text()
    assert not re.search(r"fbgemm-gpu==", text), "the CUDA fbgemm on a CPU runner"
    assert "fbgemm-gpu-cpu==$FBGEMM_VERSION" in text


def _cbsite_commands() -> list[tuple[str, list[str]]]:
    out = []
    for step in _steps():
        for cmd in _commands(step.get("run", "")):
            if cmd.startswith("cbsite "):
                cmd = cmd.split(" > ")[0]
                out.append((step["name"], shlex.split(cmd)[1:]))
    return out


def test_workflow_cbsite_commands_name_real_options():
    commands = _cbsite_commands()
    assert {args[0] for _, args in commands} == {"compare", "publish", "diff"}
    for _, args in commands:
        help_text = subprocess.run([*CBSITE, args[0], "--help"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
        for opt in (a for a in args if a.startswith("--")):
            assert re.search(rf"{re.escape(opt)}\b", help_text), (args[0], opt)


@pytest.fixture
def substitutions(demo_runs, tmp_path) -> dict[str, str]:
    shutil.copytree(demo_runs, tmp_path / "runs")
    return {"$RUNS": str(tmp_path / "runs"), "$MODEL": "dlrm", "$BASE_VERSION": "v1", "$HEAD_VERSION": "v2",
            "$SITE_URL": "https://example.github.io/models", "${{ github.event.pull_request.number }}": "42"}


@pytest.mark.slow
def test_workflow_diff_and_publish_run_on_the_demo_runs(tmp_path, substitutions):
    env = {**os.environ, "CBSITE_BUILD_JOBS": "1"}
    ran = set()
    for _name, args in _cbsite_commands():
        if args[0] in ("collect", "compare"):
            continue
        args = [_subst(a, substitutions) for a in args]
        work = tmp_path / "checkout"  # publish writes ../site, beside the checkout
        work.mkdir(exist_ok=True)
        proc = subprocess.run([*CBSITE, *args], capture_output=True, text=True, cwd=work, env=env, timeout=600)
        if args[0] == "diff":
            assert proc.returncode in (0, 1), proc.stderr  # 1: a gate rule is broken, the Gate step reports it
            assert proc.stdout.startswith("## cbsite: `dlrm` v2 vs v1"), proc.stdout[:200]
            assert "https://example.github.io/models/pr-42/" in proc.stdout
        else:
            assert proc.returncode == 0, proc.stderr
            site = tmp_path / "site"
            assert (site / "pr-42" / "index.html").is_file()
            assert "pr-42" in (site / "versions.json").read_text()
        ran.add(args[0])
    assert ran == {"diff", "publish"}


def _subst(arg: str, values: dict[str, str]) -> str:
    for key in sorted(values, key=len, reverse=True):
        arg = arg.replace(key, values[key])
    return arg


BASE_SHA = "$BASE_SHA"


def _step(name: str) -> dict:
    (step,) = [s for s in _steps() if s.get("name") == name]
    return step


def test_workflow_judges_latency_rather_than_single_rounds():
    """Latency gets a verdict: base and head timed against each other (`compare --base-rev`), or collected in rounds."""
    judged = []
    for name, args in _cbsite_commands():
        if args[0] == "compare":
            assert args[args.index("--base-rev") + 1] == BASE_SHA, args
            judged.append(name)
        if args[0] == "collect":
            assert "--rounds" in args and int(args[args.index("--rounds") + 1]) >= 2, args
            judged.append(name)
    assert judged
    assert _workflow()["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
    (checkout,) = [s for s in _steps() if str(s.get("uses", "")).startswith("actions/checkout")]
    assert checkout["with"]["fetch-depth"] == 0  # the base commit must be there for the worktree
    assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"


def test_workflow_gate_rules_come_from_the_base_branch():
    """The diff that gates runs in a folder holding the base commit's configuration, never the PR head's."""
    gate_dir = str(_workflow()["env"]["GATE"])
    assert gate_dir.startswith(("${{ github.workspace }}/../", "${{ runner.temp }}/")), gate_dir  # outside the checkout
    reads = _commands(_step("Read the gate rules from the base branch")["run"])
    for config in ("pyproject.toml", "cbsite.toml"):
        assert any(c.startswith(f'git show "{BASE_SHA}:{config}" > "$GATE/{config}"') for c in reads), reads
    gate = _commands(_step("Compare and apply the gate")["run"])
    assert gate[0] == 'cd "$GATE"' and any(c.startswith("cbsite diff ") for c in gate), gate
    for _, args in _cbsite_commands():
        assert "--fail-on" not in args  # rules written into the workflow would come from the PR's head


def test_workflow_says_the_fork_and_concurrent_publish_limits():
    text = WORKFLOW.read_text()
    head = text.split("\nname:")[0]  # the comment block above the workflow
    assert "Fork PRs" in head and "read-only token" in head and "pull_request_target" in head
    assert "Concurrent publishes" in head and "rejected" in head
    fork_guard = "github.event.pull_request.head.repo.full_name == github.repository"
    for name in ("Post the summary", *[s["name"] for s in _steps() if str(s.get("name", "")).startswith("Publish")]):
        assert _step(name).get("if") == fork_guard, name
    publish = _step(next(s["name"] for s in _steps() if str(s.get("name", "")).startswith("Publish")))["run"]
    assert "for try in 1 2 3" in publish and "git -C ../site push origin gh-pages" in publish
    assert _workflow()["concurrency"]["group"] == "cbsite-${{ github.event.pull_request.number }}"
