"""The build cache: what a run's and a diff's pages need, kept between builds and keyed by content.

A site that grows with the archive: a build reads every run (the catalog), but computes a run's page data
(components.json, ops.json, the roofline, the CSV/Parquet downloads, the totals and facts the pages show)
and a diff (diff.json, charts.json and what its page needs) only when the cache has no entry for its key:

* a run's key hashes the bytes of its run.json, components, ops and samples Parquet files, the names and sizes of
  its artifacts, and the generator's fingerprint;
* a diff's key hashes its two runs' keys, the comparison record that judges it, and the fingerprint;
* the fingerprint hashes cbsite's version, every Python file of the package but the collector's and the command line's
  (the generator never imports them) and every template and asset, so a cbsite upgrade or an edited
  generator recomputes everything.

So adding a run computes that run and the diffs it takes part in (its version's consecutive pairs, its
comparisons); the model, home and study pages are rendered again from cached data, which is quick. Beyond
the page data, the cache keeps what the catalog read of each run (`CatalogMemo`: metadata and key, trusted
while the run's files keep their size, mtime and inode) and the record of the site the last build wrote
(`previous_site`: per page its key), so that MkDocs converts only the pages whose key changed (reuse.py). The
cache never changes what a build writes: a cached entry holds the same files and values a fresh computation
gives (tests/test_build_cache.py compares the two builds byte for byte). Entries are written under a temporary
name and renamed into place; entries no build used are removed at the end of each build.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import shutil
import secrets
from pathlib import Path
from typing import Any, Callable

from cbsite import archive
from cbsite.archive import Run

FORMAT = "2"  # bump when what an entry holds changes


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    import cbsite

    h = hashlib.sha256(f"cbsite-cache {FORMAT} {getattr(cbsite, '__version__', '')}".encode())
    package = Path(cbsite.__file__).resolve().parent
    templates = package / "generator" / "templates"
    # Not the collector (the generator never imports it) nor the command line (it only calls build).
    files = [p for p in package.rglob("*.py") if "collector" not in p.relative_to(package).parts and p.name != "cli.py"]
    files += [p for p in templates.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
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


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def run_signature(folder: Path) -> list[Any]:
    """What must not change for the catalog memo of a run to hold: size, mtime and inode of its files and the
    names, sizes and mtimes of its artifacts (what run_key hashes, checked by stat as git checks its index:
    runs are written once and renamed into place, so a rewrite shows in these)."""
    sig: list[Any] = [_stat(folder / n) for n in (archive.RUN_JSON, archive.COMPONENTS_FILE, archive.OPS_FILE,
                                                   archive.SAMPLES_FILE)]
    # os.scandir, not Path.rglob: this runs for every file of every run on every build.
    stack = [os.path.join(folder, archive.ARTIFACTS_DIR)]
    while stack:
        try:
            entries = sorted(os.scandir(stack.pop()), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            st = e.stat(follow_symlinks=False)
            sig.append([e.path, st.st_size, st.st_mtime_ns, st.st_mode])
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return sig


def _lazy(name: str) -> Any:
    def get(self: "LazyRun") -> Any:
        if name not in self.__dict__:
            full = archive.read_run(self.path)  # type: ignore[arg-type]
            self.__dict__.update(rows=full.rows, ops=full.ops, samples=full.samples, ranks=full.ranks)
        return self.__dict__[name]
    return property(get)


class LazyRun(Run):
    """A run whose metadata is known (the catalog memo, or a worker process that read and checked it): its rows,
    ops, samples and ranks read from its folder when first used (only pages computed again and study pages need
    them), so a cached build reads no Parquet. (Properties, not __getattr__: Run's fields with a default, such
    as ops and ranks, would be found on the class and read as None.)"""

    rows = _lazy("rows")
    ops = _lazy("ops")
    samples = _lazy("samples")
    ranks = _lazy("ranks")

    def __init__(self, meta: dict[str, Any], path: Path) -> None:  # no dataclass __init__: rows are not read yet
        self.meta, self.path, self.artifacts = meta, path, None


class BuildCache:
    """Entries `runs/<key>/` and `diffs/<key>/`: `value.pickle` plus the data files the page folder holds."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.used: set[tuple[str, str]] = set()
        self.keys: dict[str, str] = {}
        self.site_runs: dict[str, Any] = {}  # what this build wrote: run id -> {"key", "warnings"}
        self.site_pages: dict[str, str] = {}  # and page -> key (build.py's _Writer), under the key site_global
        self.site_global: str | None = None
        self.hits = 0
        self.misses = 0
        self._memo = self._load_memo()
        self._memo_used: dict[str, Any] = {}

    # The catalog memo: per run folder, its signature, metadata (as read_run returns it, migrated) and key.
    def _load_memo(self) -> dict[str, Any]:
        try:
            record = pickle.loads((self.folder / "catalog.pickle").read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
            return {}
        ok = isinstance(record, dict) and record.get("fingerprint") == fingerprint()
        return record.get("runs", {}) if ok else {}

    def read_run(self, path: Path) -> Run:
        """archive.read_run through the memo: a run whose signature is unchanged is not read again (LazyRun)."""
        sig = run_signature(path)
        known = self._memo.get(str(path))
        if known is not None and known["sig"] == sig:
            run: Run = LazyRun(copy.deepcopy(known["meta"]), path)
            self.keys[run.run_id] = known["key"]
        else:
            run = archive.read_run(path)
            known = {"sig": sig, "meta": copy.deepcopy(run.meta), "key": self.key_of(run)}
        self._memo_used[str(path)] = known
        return run

    def save_memo(self) -> None:
        self._write("catalog.pickle", pickle.dumps({"fingerprint": fingerprint(), "runs": self._memo_used},
                                                   protocol=pickle.HIGHEST_PROTOCOL))

    def folder_for(self, name: str) -> Path:
        """A folder of the cache that another cache uses as it likes (Jinja's compiled templates)."""
        path = self.folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _write(self, name: str, data: bytes) -> None:
        """Write `name` (a path in the cache folder) under a temporary name, then rename it into place."""
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}"
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def memo(self, kind: str, inputs: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`, kept under the hash of its `inputs` (JSON) and the fingerprint: for values that cost
        seconds to compute and depend on little (the trend charts of a model, the Vega bundle)."""
        text = json.dumps(inputs, sort_keys=True, default=str)
        name = f"{kind}-{hashlib.sha256(f'{fingerprint()}{chr(0)}{text}'.encode()).hexdigest()}.pickle"
        path = self.folder / "memo" / name
        self.used.add(("memo", name))
        try:
            return pickle.loads(path.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
            pass
        value = compute()
        self._write(f"memo/{name}", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        return value

    def key_of(self, run: Run) -> str:
        """The run's key, computed once per build."""
        if run.run_id not in self.keys:
            self.keys[run.run_id] = run_key(run)
        return self.keys[run.run_id]

    # The site the last build with this cache wrote: per run the key and the artifact warnings it was written
    # with (a run whose key is unchanged takes its published artifacts from that site by hard links; the old
    # site is deleted after the swap, so the new one owns them), per page its key, and the key of what every
    # page depends on (`global`: the MkDocs configuration and versions), see reuse.py.
    def previous_site(self, out: Path) -> dict[str, Any]:
        try:
            record = json.loads((self.folder / "site.json").read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(record, dict) or record.get("site") != str(out) or record.get("fingerprint") != fingerprint():
            return {}
        return {k: record[k] for k in ("runs", "pages") if isinstance(record.get(k), dict)} | {"global": record.get("global")}

    def record_site(self, out: Path, runs: dict[str, Any], pages: dict[str, str] | None = None,
                    global_key: str | None = None) -> None:
        record = {"site": str(out), "fingerprint": fingerprint(), "runs": runs, "pages": pages or {}, "global": global_key}
        self._write("site.json", json.dumps(record, sort_keys=True).encode())

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
        for kind in ("runs", "diffs", "memo"):
            folder = self.folder / kind
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if (kind, entry.name) not in self.used:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)


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
DIFF_FILES = ["diff.json", *(f"diff.{phase}.json" for phase in ("forward", "backward")), "charts.json"]


def run_value(rd: Any, warnings: list[str]) -> dict[str, Any]:
    return {"rd": dataclasses.replace(rd, run=None), "warnings": list(warnings)}
