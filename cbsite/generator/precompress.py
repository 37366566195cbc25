"""Gzip copies of a built site's larger text files, for static hosts that serve `x.gz` for `x` (nginx's
gzip_static, Caddy's precompressed, `cbsite serve`): the Vega bundle, the pages, the data files.

The copies are byte-reproducible (no name, mtime 0, a fixed level), so the same archive still gives the same site.
With the previous site at hand, a file whose bytes did not change takes its copy from there (a hard link).
"""

from __future__ import annotations

import concurrent.futures
import gzip
import os
from pathlib import Path

from cbsite.generator import sitedir

SUFFIX = ".gz"
MIN_BYTES = 4096  # below a few kB the copy saves less than a round trip's headers are worth
LEVEL = 6  # zlib's default: within a few per cent of 9's size, several times quicker on a site's megabytes
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


def compress(data: bytes) -> bytes:
    """`data` as a gzip member with no name and mtime 0: the same bytes in, the same bytes out."""
    return gzip.compress(data, compresslevel=LEVEL, mtime=0)


def write_beside(site: Path, previous: Path | None = None) -> int:
    """Write `<file>.gz` beside every candidate file of `site`; returns how many. A file whose bytes equal the
    previous site's, which has its copy, gets that copy linked instead of compressed again."""
    site = Path(site)

    def one(rel: str) -> None:
        src, dest = site / rel, site / (rel + SUFFIX)
        data = src.read_bytes()
        if dest.exists() or dest.is_symlink():
            dest.unlink()
        if previous is not None and _link_unchanged(previous / rel, src, data, dest):
            return
        dest.write_bytes(compress(data))

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
