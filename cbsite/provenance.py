"""Where a run came from: git state of the working directory and versions of the stack."""

from __future__ import annotations

import platform
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
