"""The folder a site is written to: cbsite's marker, a lock, and an atomic swap.

cbsite replaces its `--out` as a whole, so it is careful about which folder that is:

* every site it writes carries a marker file (`MARKER`, fixed text: the same archive still gives the same
  bytes); an existing, non-empty folder without it is never deleted or replaced;
* an `--out` that equals, contains or lies inside the archive (or contains the working directory) is refused;
* a site is built in a fresh folder beside `--out` and swapped in only when complete (rename the old site
  away, rename the new one in, delete the old), so a build killed at any point (SIGKILL included) leaves the
  old site whole; what such a build left beside `--out` is removed (or, for a kill between the two renames,
  put back) by the next build;
* the whole build holds a lock file beside `--out` (`flock`, released by the kernel when the process dies),
  so a second build into the same folder refuses with a message instead of mixing files.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from cbsite.errors import CbsiteError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: builds are still staged and swapped, without the lock
    fcntl = None  # type: ignore[assignment]

MARKER = ".cbsite-site"
SITE = "site"  # a site of one archive: `cbsite build`, and each version folder of a published site
PUBLISHED = "published"  # the root of a published site (mike's layout: versions.json, <version>/, ...)
_TEXT = {
    SITE: "cbsite site\nThis folder was written by `cbsite build`; the next build replaces it as a whole.\n",
    PUBLISHED: "cbsite published\nThis folder was written by `cbsite publish`; publishing rewrites only the "
               "version and alias folders it names, versions.json and index.html.\n",
}
_STAGE = ".cbsite-build-"
_OLD = ".cbsite-old-"


def marker_kind(folder: Path) -> str | None:
    """SITE or PUBLISHED for a folder cbsite wrote, else None."""
    try:
        first = (folder / MARKER).read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    return {"cbsite site": SITE, "cbsite published": PUBLISHED}.get(first.strip())


def write_marker(folder: Path, kind: str) -> None:
    (folder / MARKER).write_text(_TEXT[kind])


def holds_files(folder: Path) -> bool:
    """An existing folder with anything in it (a site that an empty build would replace)."""
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


def check_out(out: Path, runs: Path | None, kind: str = SITE, flag: str = "--out") -> None:
    """Refuse an output folder that cbsite must not replace; every message says what to do instead."""
    out_r = Path(out).resolve()
    if runs is not None:
        runs_r = Path(runs).resolve()
        if out_r == runs_r:
            raise CbsiteError(f"{flag} {out} is the archive {runs}: writing the site there would delete the runs; "
                              f"choose another folder, e.g. {flag} site")
        if runs_r in out_r.parents:
            raise CbsiteError(f"{flag} {out} is inside the archive {runs}; choose a folder outside it, e.g. {flag} site")
        if out_r in runs_r.parents:
            raise CbsiteError(f"{flag} {out} contains the archive {runs}: replacing it would delete the runs; "
                              f"choose a folder beside the archive, e.g. {flag} site")
    cwd = Path.cwd().resolve()
    if out_r == cwd or out_r in cwd.parents:
        raise CbsiteError(f"{flag} {out} is (or contains) the working directory; choose a folder below it, e.g. {flag} site")
    if out_r.exists() and not out_r.is_dir():
        raise CbsiteError(f"{flag} {out} exists and is not a folder; choose another {flag}")
    if not holds_files(out_r):
        return
    found = marker_kind(out_r)
    if found is None:
        raise CbsiteError(
            f"{flag} {out} is not empty and does not look like a built site (it has no {MARKER} file, which every "
            f"site cbsite writes carries), and cbsite replaces its {flag} as a whole: choose an empty or new folder; "
            f"if it is a site built by an older cbsite, delete it first (rm -r {out})"
        )
    if found != kind:
        what = "a published site (versions.json and version folders)" if found == PUBLISHED else "a site built by cbsite build"
        use = "cbsite publish" if found == PUBLISHED else "cbsite build"
        raise CbsiteError(f"{flag} {out} is {what}; write into it with {use}, or choose another {flag}")


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold the lock of `out` (a file beside it) or refuse: another build or publish is writing there."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = out.parent / f".{out.name}.cbsite-lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise CbsiteError(
                f"another cbsite build or publish (process {holder}) is writing {out}; wait for it to finish "
                "and run this again, or choose another --out"
            ) from None
        try:  # the file locked must still be the one at `path`: a finishing holder removes it
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


IO_THREADS = 8  # file system calls release the GIL; on a slow disk, overlapping them is several times quicker


def remove_tree(folder: Path) -> None:
    """shutil.rmtree(folder, ignore_errors=True), its subtrees removed by a pool of threads: removing a site of
    thousands of folders one call at a time takes seconds."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink(missing_ok=True) if folder.is_symlink() else None
        return
    jobs, level = [], [folder]
    for _ in range(4):  # down to the run folders (runs/<model>/<version>/<run_id>), not further
        nxt: list[Path] = []
        for d in level:
            try:
                nxt.extend(e for e in d.iterdir() if e.is_dir() and not e.is_symlink())
            except OSError:
                continue
        if len(nxt) > 4 * IO_THREADS or not nxt:
            jobs = nxt
            break
        level = jobs = nxt
    with concurrent.futures.ThreadPoolExecutor(IO_THREADS) as pool:
        list(pool.map(lambda d: shutil.rmtree(d, ignore_errors=True), jobs))
    shutil.rmtree(folder, ignore_errors=True)


def _siblings(out: Path, infix: str) -> list[Path]:
    prefix = f".{out.name}{infix}"
    try:
        return sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def recover(out: Path) -> None:
    """Under the lock: undo what a killed build left beside `out`.

    A build killed between its two renames left no `out` and the old site under its old-name: put it back.
    Unfinished build folders and old sites not yet deleted are removed.
    """
    if not out.exists():
        for old in reversed(_siblings(out, _OLD)):
            if marker_kind(old) is not None:
                os.rename(old, out)
                break
    for leftover in _siblings(out, _STAGE) + _siblings(out, _OLD):
        remove_tree(leftover)


def _fresh(out: Path, infix: str) -> Path:
    while True:
        path = out.parent / f".{out.name}{infix}{secrets.token_hex(4)}"
        try:
            path.mkdir()  # the umask's permissions (a web server may read the site), unlike mkdtemp's 0700
            return path
        except FileExistsError:
            continue


@contextlib.contextmanager
def staged(out: Path, kind: str = SITE) -> Iterator[Path]:
    """A fresh folder beside `out` to write the new site into; swapped in for `out` when the block succeeds.

    Call it holding `locked(out)`. On an exception the new folder is removed and `out` is untouched.
    """
    out = Path(out)
    recover(out)
    stage = _fresh(out, _STAGE)
    try:
        yield stage
        write_marker(stage, kind)
    except BaseException:
        remove_tree(stage)
        raise
    swap_in(stage, out)


def swap_in(stage: Path, out: Path) -> None:
    """Put the complete folder `stage` at `out` (same parent): rename the old away, the new in, delete the old."""
    if out.exists() or out.is_symlink():
        old = _fresh(out, _OLD)
        old.rmdir()
        os.rename(out, old)
        os.rename(stage, out)
        remove_tree(old)
    else:
        os.rename(stage, out)
