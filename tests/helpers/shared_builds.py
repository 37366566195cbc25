"""Expensive read-only fixtures made once per test session, whatever the number of pytest-xdist workers.

A session fixture is made once per worker; one that only tests that read it use is made here instead, in a folder
every worker of the session sees (the parent of the workers' own temporary folders), under a file lock: the first
worker to ask makes it, the others wait for it and reuse it.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

_DONE = ".made"  # written last: a folder without it was left half-made by a worker that failed


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder all workers of this session share: the parent of the workers' own under xdist, else the
    session's own temporary folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if base.name.startswith("popen-gw") else base


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `make(folder)` by the first worker that asks for it; the others wait for it.
    Tests only read what it holds."""
    root = session_root(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (folder / _DONE).exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                make(folder)
                (folder / _DONE).touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder
