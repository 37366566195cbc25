"""The build cache: what a run's and a diff's pages need, kept between builds and keyed by content.

A site that grows with the archive: a build reads every run (the catalog), but computes a run's page data
(components.json, ops.json, the roofline, the CSV/Parquet downloads, the totals and facts the pages show)
and a diff (diff.json, charts.json and what its page needs) only when the cache has no entry for its key:

* a run's key hashes the bytes of its run.json, components, ops and samples Parquet files, the names and sizes of
  its artifacts, and the generator's fingerprint;
* a diff's key hashes its two runs' keys, the comparison record that judges it, and the fingerprint;
* the fingerprint hashes cbsite's version and every Python file of the package, so a cbsite upgrade or an
  edited generator recomputes everything (templates are always rendered, they are not cached).

So adding a run computes that run and the diffs it takes part in (its version's consecutive pairs, its
comparisons); the model, home and study pages are rendered again from cached data, which is quick. The
cache never changes what a build writes: a cached entry holds the same files and values a fresh computation
gives (tests/test_build_cache.py compares the two builds byte for byte). Entries are written under a temporary
name and renamed into place; entries no build used are removed at the end of each build.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pickle
import shutil
import secrets
from pathlib import Path
from typing import Any

from cbsite import archive
from cbsite.archive import Run

FORMAT = "1"  # bump when what an entry holds changes


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    import cbsite

    h = hashlib.sha256(f"cbsite-cache {FORMAT} {getattr(cbsite, '__version__', '')}".encode())
    package = Path(cbsite.__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def run_key(run: Run) -> str:
    assert run.path is not None
    h = hashlib.sha256(fingerprint().encode())
    for name in (archive.RUN_JSON, archive.COMPONENTS_FILE, archive.OPS_FILE, archive.SAMPLES_FILE):
        path = run.path / name
        h.update(name.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"<absent>")
    art = run.path / archive.ARTIFACTS_DIR
    if art.is_dir():
        for p in sorted(art.rglob("*")):
            st = p.lstat()
            h.update(f"{p.relative_to(run.path).as_posix()}\0{st.st_size}\0{st.st_mode}\0".encode())
    return h.hexdigest()


def diff_key(base: str, head: str, record: dict[str, Any] | None) -> str:
    text = json.dumps(record, sort_keys=True, default=str) if record is not None else "null"
    return hashlib.sha256(f"{fingerprint()}\0{base}\0{head}\0{text}".encode()).hexdigest()


class BuildCache:
    """Entries `runs/<key>/` and `diffs/<key>/`: `value.pickle` plus the data files the page folder holds."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.used: set[tuple[str, str]] = set()
        self.keys: dict[str, str] = {}
        self.site_runs: dict[str, Any] = {}  # what this build wrote: run id -> {"key", "warnings"}
        self.hits = 0
        self.misses = 0

    def key_of(self, run: Run) -> str:
        """The run's key, computed once per build."""
        if run.run_id not in self.keys:
            self.keys[run.run_id] = run_key(run)
        return self.keys[run.run_id]

    # The site the last build with this cache wrote, and per run the key and the artifact warnings it was
    # written with: a run whose key is unchanged takes its published artifacts from that site by hard links
    # (the old site is deleted after the swap, so the new one owns them), instead of copying them again.
    def previous_site(self, out: Path) -> dict[str, Any]:
        try:
            record = json.loads((self.folder / "site.json").read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(record, dict) or record.get("site") != str(out) or record.get("fingerprint") != fingerprint():
            return {}
        runs = record.get("runs")
        return runs if isinstance(runs, dict) else {}

    def record_site(self, out: Path, runs: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".site.json.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps({"site": str(out), "fingerprint": fingerprint(), "runs": runs}, sort_keys=True))
        os.replace(tmp, self.folder / "site.json")

    def _entry(self, kind: str, key: str) -> Path:
        return self.folder / kind / key

    def load(self, kind: str, key: str, target: Path) -> Any | None:
        """The cached value, its files linked (or copied) into `target`; None when there is no whole entry."""
        entry = self._entry(kind, key)
        try:
            value = pickle.loads((entry / "value.pickle").read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            self.misses += 1
            return None
        target.mkdir(parents=True, exist_ok=True)
        for src in sorted((entry / "files").iterdir()):
            _place(src, target / src.name)
        self.used.add((kind, key))
        self.hits += 1
        return value

    def store(self, kind: str, key: str, value: Any, source: Path, names: list[str]) -> None:
        """Keep `value` and the files `names` of `source` (those that exist) under the key."""
        entry = self._entry(kind, key)
        tmp = entry.parent / f".{key}.{secrets.token_hex(4)}"
        (tmp / "files").mkdir(parents=True)
        for name in names:
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / "files" / name)
        (tmp / "value.pickle").write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        try:
            os.replace(tmp, entry) if not entry.exists() else shutil.rmtree(tmp)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        self.used.add((kind, key))

    def prune(self) -> None:
        """Remove the entries this build did not use (runs deleted or changed, code changed)."""
        for kind in ("runs", "diffs"):
            folder = self.folder / kind
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if (kind, entry.name) not in self.used:
                    shutil.rmtree(entry, ignore_errors=True)


def _place(src: Path, dest: Path) -> None:
    """Link a cached file into the generated docs (read only there: mkdocs copies it), else copy it."""
    if dest.exists():
        dest.unlink()
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


# What a run entry holds: the RunData without its Run (the Run is the catalog's, re-attached on load).
# (components.parquet, the download of the archive's own file, is copied from the run: caching it would only
# duplicate the archive.)
RUN_FILES = ["components.json", "ops.json", "roofline.json", "components.csv"]
DIFF_FILES = ["diff.json", "charts.json"]


def run_value(rd: Any, warnings: list[str]) -> dict[str, Any]:
    return {"rd": dataclasses.replace(rd, run=None), "warnings": list(warnings)}
