"""What killed or interrupted writers leave in an archive, told from folders cbsite did not make (`cbsite gc`).

Every staging folder records its owner (process id and host, archive.new_staging), so a folder whose owner is
gone is stale and removed, while one a live process is writing, or one without the marker, is left alone.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbsite import schema
from cbsite.archive import (
    ARTIFACTS_DIR,
    COMPONENTS_FILE,
    OPS_FILE,
    OWNER_FILE,
    PARTIAL,
    RANKS_FILE,
    RUN_JSON,
    SAMPLES_FILE,
    read_owner,
    staging_dir,
)

OTHER_HOST_STALE_S = 7 * 24 * 3600  # a staging folder of another host is stale after a week


def _pid_alive(pid: Any) -> bool:
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except OSError:
        return False
    return True


def _abandoned(folder: Path) -> str | None:
    """Why a staging folder is stale (its owner is gone), or None while its owner may still be writing."""
    if not folder.is_dir() or folder.is_symlink():
        return "not a staging folder"
    owner = read_owner(folder)
    now = time.time()
    if owner is None:  # not made by cbsite (or being created): never removed, see `foreign_staging`
        return None
    pid, host = owner.get("pid"), owner.get("host")
    if host != socket.gethostname():
        started = owner.get("started")
        age = now - started if isinstance(started, (int, float)) else math.inf
        return f"left on host {host!r} {age / 86400:.0f} days ago" if age > OTHER_HOST_STALE_S else None
    if not _pid_alive(pid):
        return f"its process {pid} is gone"
    return None


@dataclass(frozen=True)
class Stale:
    """A folder an interrupted or killed process left in the archive."""

    path: Path
    reason: str


def stale_staging(root: str | os.PathLike[str] = "runs") -> list[Stale]:
    """Remains of killed or interrupted writers under `root`, never a folder a live process is writing.

    Three kinds: folders in `<root>/.cbsite-staging/` whose owner is gone; run folders whose last rename
    (components.parquet.partial -> components.parquet) never happened; `<version>/.<run_id>.partial/`
    folders that cbsite before 0.2 staged runs in (the documented glob reads them: remove them). Only what
    cbsite made: the first two carry its owner marker (OWNER_FILE, written when staging starts), the last
    hold nothing but a run's files (`_legacy_run`); anything else is `foreign_staging`.
    """
    return _scan_staging(root)[0]


def foreign_staging(root: str | os.PathLike[str] = "runs") -> list[Stale]:
    """Folders where `stale_staging` looks that cbsite did not make (no owner marker, or a `.x.partial` holding
    more than a run's files): `cbsite gc` leaves them and names them."""
    return _scan_staging(root)[1]


def _scan_staging(root: str | os.PathLike[str]) -> tuple[list[Stale], list[Stale]]:
    base = Path(root)
    out: list[Stale] = []
    left: list[Stale] = []
    if not base.is_dir():
        return out, left
    unmarked = f"no cbsite marker ({OWNER_FILE}) inside: not made by cbsite, left as it is"
    area = staging_dir(base)
    if area.is_dir() and not area.is_symlink():
        for folder in sorted(area.iterdir()):
            if folder.is_symlink() or not folder.is_dir() or read_owner(folder) is None:
                left.append(Stale(folder, unmarked))
                continue
            why = _abandoned(folder)
            if why:
                out.append(Stale(folder, f"unfinished staging folder: {why}"))
    for version_dir in _dirs(base, 2):
        for entry in sorted(version_dir.iterdir()):
            if entry.is_symlink() or not entry.is_dir():
                continue
            if entry.name.startswith(".") and entry.name.endswith(PARTIAL):
                why = _legacy_run(entry)
                if why is None:
                    out.append(Stale(entry, "half-written run of an older cbsite (read by runs/**/components.parquet)"))
                else:
                    left.append(Stale(entry, f"{why}: not a run cbsite staged, left as it is"))
            elif (entry / (COMPONENTS_FILE + PARTIAL)).exists() and not (entry / COMPONENTS_FILE).exists():
                if read_owner(entry) is None:
                    left.append(Stale(entry, unmarked))
                    continue
                why = _abandoned(entry)
                if why:
                    out.append(Stale(entry, f"run never completed: {why}"))
    return out, left


# What a run folder holds, staged or not: the only content of a `.<run_id>.partial` folder cbsite staged.
_RUN_FILES = {RUN_JSON, COMPONENTS_FILE, OPS_FILE, SAMPLES_FILE, RANKS_FILE, OWNER_FILE}
_RUN_FILES |= {name + PARTIAL for name in _RUN_FILES}


def _legacy_run(folder: Path) -> str | None:
    """None when `folder` is a run older cbsite staged (`.<run_id>.partial` holding only a run's files and an
    artifacts folder); else why it is not. Those versions wrote no marker, so the name and content are it."""
    run_id = folder.name[1:-len(PARTIAL)]
    if not schema.RUN_ID_RE.fullmatch(run_id):
        return f"{folder.name!r} is not .<run id>{PARTIAL}"
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        return f"cannot be listed ({exc.strerror})"
    for e in entries:
        if e.name == ARTIFACTS_DIR and e.is_dir(follow_symlinks=False):
            continue
        if e.name not in _RUN_FILES or not e.is_file(follow_symlinks=False):
            return f"holds {e.name!r}, which is no run file"
    return None


def _dirs(base: Path, depth: int) -> list[Path]:
    """Folders `depth` levels below `base`, skipping dot-folders and symlinks."""
    level = [base]
    for _ in range(depth):
        level = [d for parent in level for d in sorted(parent.iterdir())
                 if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")]
    return level


def remove_stale(root: str | os.PathLike[str] = "runs", dry_run: bool = False) -> list[Stale]:
    """Delete what `stale_staging` finds (checked again just before each removal); return what was (or would be) removed."""
    removed = []
    for stale in stale_staging(root):
        if not dry_run:
            legacy = stale.path.name.endswith(PARTIAL) and stale.path.name.startswith(".")
            if (_legacy_run(stale.path) is None) if legacy else _abandoned(stale.path):
                shutil.rmtree(stale.path, ignore_errors=True)
            if stale.path.exists():
                continue
        removed.append(stale)
    return removed
