"""Shell completion: the script `cbsite completion bash` prints, sourced in bash, completes commands, options, the
installed providers and plugins and the archive's runs as TAB does (COMP_LINE/COMP_POINT, the answer on file descriptor 8); the answer imports neither torch
nor polars."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IFS = "\013"  # argcomplete's separator between candidates

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict[str, str]:
    """A PATH whose `cbsite` is this checkout's (`python -m cbsite`), as the console script would be."""
    bin_dir = tmp_path_factory.mktemp("bin")
    script = bin_dir / "cbsite"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cbsite "$@"\n')
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_ARC", "COMP_", "CBSITE_RUNS"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(REPO))
    return env


# What bash does on TAB: split the line into COMP_WORDS and call the function `complete -F` registered.
DRIVE = r'''
eval "$(cbsite completion bash)"
COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<< "$COMP_LINE"; [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
_python_argcomplete cbsite "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
'''


def tab(line: str, env: dict[str, str]) -> list[str]:
    """What bash offers for `line` with the cursor at its end, after sourcing `cbsite completion bash`."""
    done = subprocess.run(["bash", "-c", DRIVE, "drive", line], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_bash_completes_commands_and_options(shell_env):
    assert set(tab("cbsite s", shell_env)) == {"show", "sweep", "serve"}
    assert set(tab("cbsite ", shell_env)) >= {"collect", "compare", "diff", "ls", "show", "build", "completion"}
    assert tab("cbsite collect --max-d", shell_env) == ["--max-depth"]
    assert tab("cbsite -v diff --fail", shell_env) == ["--fail-on"]  # after a shared option before the command
    assert {w for w in tab("cbsite completion ", shell_env) if not w.startswith("-")} == {"bash", "zsh", "fish"}


def test_bash_completes_installed_providers_and_plugins(shell_env):
    from cbsite.collector.plugins.registry import available

    providers = set(available("providers"))
    assert {"dlrm", "nanogpt"} <= providers
    assert set(tab("cbsite collect d", shell_env)) == {p for p in providers if p.startswith("d")}
    assert tab("cbsite compare dlrm n", shell_env) == ["nanogpt"]
    assert "trace" in tab("cbsite collect dlrm --plugin t", shell_env)
    assert "dlrm" not in tab("cbsite collect dlrm --plugin ", shell_env)  # plugins there, not providers


def test_bash_completes_the_runs_of_the_archive(shell_env, demo_runs):
    from cbsite import archive

    refs = archive.list_runs(demo_runs)
    offered = set(tab(f"cbsite show --runs {demo_runs} dl", shell_env))
    assert {"dlrm", "dlrm@v1", "dlrm@v2"} <= offered
    assert all(name.startswith("dl") for name in offered)
    everything = {w for w in tab(f"cbsite diff --runs {demo_runs} ", shell_env) if not w.startswith("-")}
    assert {r.model for r in refs} <= everything and not any(n.startswith("_") for n in everything)
    run_id = refs[0].run_id
    assert run_id in tab(f"cbsite export --runs {demo_runs} {run_id[:9]}", shell_env)


def test_the_answer_goes_to_fd_8_and_imports_neither_torch_nor_polars(shell_env):
    line = "cbsite collect --pl"
    env = {**shell_env, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_SHELL": "bash"}
    # bash's script runs the command with `8>&1 1>/dev/null`: the candidates on 8, anything else printed is dropped.
    done = subprocess.run(["bash", "-c", 'exec "$@" 8>&1 1>/dev/null', "drive", sys.executable, "-X", "importtime",
                           "-m", "cbsite"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(done.stdout.split(IFS)) == {"--plugin", "--plugin-option"}
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "cbsite" in imported and not imported & {"torch", "polars", "pyarrow", "mkdocs"}, sorted(imported)


def test_completion_prints_each_shells_script():
    from cbsite.cli import main

    for shell, marker in (("bash", "complete -o nospace"), ("zsh", "compdef"), ("fish", "complete --command cbsite")):
        done = subprocess.run([sys.executable, "-m", "cbsite", "completion", shell], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0 and marker in done.stdout and "cbsite" in done.stdout, (shell, done.stderr)
    with pytest.raises(SystemExit):
        main(["completion", "tcsh-or-so"])
