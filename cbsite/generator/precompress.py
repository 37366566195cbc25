"""Gzip copies of a built site's larger text files, for static hosts that serve `x.gz` for `x` (nginx's
gzip_static, Caddy's precompressed, `cbsite serve`): the Vega bundle, the pages, the data files.

The copies are byte-reproducible (no name, mtime 0, a fixed level per kind of file), so the same archive still
gives the same site on the same kind of machine (see DATA_LEVEL). With the previous site at hand, a file whose bytes did not change takes its copy from there
(a hard link). A full build has the data files' copies made ahead (`Ahead`), by its worker processes while the
main process renders and converts the pages, and moves them into the site.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import os
from pathlib import Path

from isal import igzip

from cbsite.generator import sitedir

SUFFIX = ".gz"
MIN_BYTES = 4096  # below a few kB the copy saves less than a round trip's headers are worth
LEVEL = 6  # zlib's default, for pages and assets: within a few per cent of 9's size, several times quicker
# The data files (run and diff data, downloads, the search index) are most of a big site's bytes (2.6 GB at 1,000
# runs of 1,000 components): ISA-L's level 3 (isal.igzip) packs them as small as zlib's level 3 did, three to five
# times quicker (docs/benchmarks.md; its level 1 is quicker still, but its copies are 7 % larger). Its output is
# plain gzip, the same bytes for the same input on the same kind of machine (ISA-L picks its code by the CPU's
# features, as zlib's bytes depend on the zlib build: a site's copies are reproducible where it is built).
DATA_LEVEL = 3
DATA = frozenset({".json", ".csv"})
TEXT = frozenset({".html", ".js", ".css", ".json", ".svg", ".csv", ".txt"})
# The run's published files (traces are gzip already, memory views and logs are downloads), left as they are.
SKIP_DIRS = frozenset({"artifacts"})


def candidates(site: Path) -> list[str]:
    """The files of `site` (relative POSIX paths, sorted) that get a gzip copy."""
    found = []
    for folder, dirs, files in os.walk(site):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in files:
            if os.path.splitext(name)[1] not in TEXT:
                continue
            path = os.path.join(folder, name)
            if os.path.islink(path) or os.path.getsize(path) < MIN_BYTES:
                continue
            found.append(os.path.relpath(path, site).replace(os.sep, "/"))
    return sorted(found)


def compress(data: bytes, rel: str = "") -> bytes:
    """`data` (of the file `rel`) as a gzip member with no name and mtime 0: the same bytes in, the same bytes
    out. A data file (DATA) is packed by ISA-L, anything else by zlib."""
    if os.path.splitext(rel)[1] in DATA:
        return igzip.compress(data, compresslevel=DATA_LEVEL, mtime=0)
    return gzip.compress(data, compresslevel=LEVEL, mtime=0)


def write_beside(site: Path, previous: Path | None = None, ahead: Ahead | None = None) -> int:
    """Write `<file>.gz` beside every candidate file of `site`; returns how many. A file whose bytes equal the
    previous site's, which has its copy, gets that copy linked instead of compressed again; one whose copy
    was made `ahead` gets that copy moved in."""
    site = Path(site)
    done = ahead.move_into(site) if ahead is not None else set()

    def one(rel: str) -> None:
        if rel in done:
            return
        src, dest = site / rel, site / (rel + SUFFIX)
        data = src.read_bytes()
        if dest.exists() or dest.is_symlink():
            dest.unlink()
        if previous is not None and _link_unchanged(previous / rel, src, data, dest):
            return
        dest.write_bytes(compress(data, rel))

    rels = candidates(site)
    with concurrent.futures.ThreadPoolExecutor(sitedir.IO_THREADS) as pool:
        list(pool.map(one, rels))  # zlib releases the GIL while it compresses
    return len(rels)


def _link_unchanged(before: Path, src: Path, data: bytes, dest: Path) -> bool:
    packed = before.with_name(before.name + SUFFIX)
    try:
        if not packed.is_file() or before.stat().st_size != len(data):
            return False
        # A file the build linked from the previous site is the same file: no need to read it again.
        if not os.path.samefile(before, src) and before.read_bytes() != data:
            return False
        os.link(packed, dest)
        return True
    except OSError:
        return False


def write_copies(docs: str, root: str, rels: list[str]) -> list[str]:
    """The gzip copy of each file `rels` of `docs`, written to the same place under `root`; a worker's job."""
    for rel in rels:
        dest = os.path.join(root, rel + SUFFIX)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(os.path.join(docs, rel), "rb") as f:
            data = compress(f.read(), rel)
        with open(dest, "wb") as f:
            f.write(data)
    return rels


class Ahead:
    """Copies of the generated docs' data files made by the build's worker processes while the main process is
    busy with the pages (the other core would wait), in `root` beside the site until it is built."""

    CHUNK = 32  # files a job takes

    def __init__(self, root: Path) -> None:
        self.root = root
        self.futures: list[concurrent.futures.Future[list[str]]] = []
        self.made: set[str] = set()

    def start(self, pool: concurrent.futures.Executor | None, docs: Path, folders: list[str]) -> None:
        """Copy the candidates in `folders` (page folders of `docs`, `runs/m/v/id/`); none without a pool."""
        if pool is None:
            return
        rels = [folder + rel for folder in folders for rel in candidates(docs / folder)]
        try:
            self.futures = [pool.submit(write_copies, str(docs), str(self.root), rels[i:i + self.CHUNK])
                            for i in range(0, len(rels), self.CHUNK)]
        except RuntimeError:  # a pool that broke or shut down: the copies are made at the end
            self.futures = []

    def wait(self) -> None:
        """Before the generated docs go; a job that failed leaves its files to be compressed at the end."""
        for future in self.futures:
            try:
                self.made.update(future.result())
            except Exception:  # noqa: BLE001 - any failure only means those copies are made later
                continue
        self.futures = []

    def move_into(self, site: Path) -> set[str]:
        """Move the copies of files the site has into it; returns their files (relative POSIX paths)."""
        self.wait()
        moved = set()
        for rel in sorted(self.made):
            if (site / rel).is_file():
                os.replace(self.root / (rel + SUFFIX), site / (rel + SUFFIX))
                moved.add(rel)
        return moved
