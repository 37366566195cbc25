"""Where a run came from: git state of the working directory and versions of the stack."""

from __future__ import annotations

import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def git_state(cwd: str | Path = ".") -> dict[str, Any] | None:
    """Commit, short hash and dirty flag of the git work tree at `cwd`, or None outside one."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        short = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "short": short, "dirty": dirty}


def package_versions(names: tuple[str, ...] = ("cbsite", "torch", "torchrec", "fbgemm_gpu")) -> dict[str, str | None]:
    """Installed versions of the stack (None where a package is absent), plus Python's."""
    dists = {"fbgemm_gpu": ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly")}
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        out[name] = None
        for dist in dists.get(name, (name,)):
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


# --- what differs between two runs' setups (the diff page and the PR summary show it first) ------------

SETUP_GROUPS = ("provider", "preprocessing", "inputs", "config", "dtype", "device", "versions", "git")
# Leaves that differ from run to run whatever the setup: how long things took, the machine's load, and
# what was measured rather than chosen (calibrated peaks and their repeats; a *given* peak still shows,
# through device.peak_source).
_VOLATILE = re.compile(
    r"(^|\.)(seconds|load_average|wall_time_s|wall_s|timed_s|started_at|ended_at|repeats|calibration|check_s|"
    r"peak_flops|peak_bandwidth)(\.|\[|$)"
)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in sorted(value, key=str):
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):  # a list of steps (preprocessing): one key per step
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def setup_changes(base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    """The setup keys whose values differ between two runs' metadata, as [{group, key, base, head}], in
    SETUP_GROUPS order then key order; values are text (JSON for lists), None where a side lacks the key.
    Timings and load (`_VOLATILE`) are left out: they differ between any two runs."""
    out: list[dict[str, Any]] = []
    for group in SETUP_GROUPS:
        a: dict[str, Any] = {}
        b: dict[str, Any] = {}
        _flatten(base.get(group), group, a)
        _flatten(head.get(group), group, b)
        for key in sorted(set(a) | set(b)):
            if _VOLATILE.search(key) or a.get(key) == b.get(key):
                continue
            out.append({"group": group, "key": key, "base": _text(a.get(key)), "head": _text(b.get(key))})
    return out
