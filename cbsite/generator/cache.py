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

Builds are incremental by default: a build that names no cache keeps one in the user's cache directory
(`default_cache_dir`: $CBSITE_CACHE_DIR, else $XDG_CACHE_HOME/cbsite or ~/.cache/cbsite; one folder per output
path), so it never lies in the archive or the site and two sites never prune each other's entries. Where that
folder cannot be used (not cbsite's, not writable), the build says so and builds without a cache.

The cache owns only what it made. Its folder carries a marker (MARKER) and a manifest (MANIFEST) of the entries
it wrote; pruning removes manifest entries only. A folder that is, holds or lies inside the archive or the site,
or holds a project (mkdocs.yml, .git), is refused, and so is a non-empty folder without the marker. Its files are
read as data: pickles through a restricted unpickler (cbsite.artifacts.plain_unpickle) that builds plain values
and RunData only; anything else is computed again, with a warning.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from cbsite import archive, artifacts
from cbsite.archive import Run
from cbsite.errors import CbsiteError

FORMAT = "3"  # bump when what an entry holds changes
MARKER = ".cbsite-cache"  # in the cache folder: cbsite made it, so it may write and prune there
MANIFEST = "manifest.json"  # the entries this cache wrote: the only ones it ever removes
# A project's root (refused as a cache folder): its configuration or repository.
PROJECT_FILES = ("mkdocs.yml", "mkdocs.yaml", ".git", "pyproject.toml")
# What the cache's pickles may build besides plain values (lists, dicts, strings, numbers ...).
ALLOWED_CLASSES = frozenset({("cbsite.generator.rundata", "RunData")})
_ENTRY = re.compile(r"\A(?:(?:runs|diffs)/[0-9a-f]{64}|memo/[a-z]+-[0-9a-f]{64}\.pickle)\Z")
_KEY = re.compile(r"[0-9a-f]{64}")
_UNREADABLE = (OSError, EOFError, ValueError)  # artifacts.ArtifactError, raised for a broken pickle, is a ValueError


def _loads(raw: bytes) -> Any:
    return artifacts.plain_unpickle(raw, ALLOWED_CLASSES)


def user_cache_root() -> Path:
    """$CBSITE_CACHE_DIR, else $XDG_CACHE_HOME/cbsite (the XDG rule: an absolute path, else ignored), else
    ~/.cache/cbsite."""
    own = os.environ.get("CBSITE_CACHE_DIR", "")
    if own:
        return Path(own).resolve()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "cbsite"
    try:
        return Path.home() / ".cache" / "cbsite"
    except RuntimeError:  # no home directory to be found (a bare container user)
        return Path(tempfile.gettempdir()) / f"cbsite-cache-{getattr(os, 'getuid', lambda: 0)()}"


def _default_dir(kind: str, where: Path) -> Path:
    # The folder's readable name, plus the hash of the whole path: one cache per output, never shared by two.
    where = Path(where).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", where.name)[:40] or "root"
    digest = hashlib.sha256(f"{kind}\0{where}".encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return user_cache_root() / kind / f"{name}-{digest}"


def default_cache_dir(out: Path) -> Path:
    """The build cache a build into the site folder `out` uses when none is named: under the user's cache
    directory, one folder per absolute output path."""
    return _default_dir("sites", out)


def plugin_cache_dir(config_file: Path, prefix: str) -> Path:
    """The MkDocs plugin's default cache: one per project (its mkdocs.yml) and prefix. Not keyed on the site
    folder, which `mkdocs serve` makes anew in a temporary folder each time."""
    return _default_dir("plugin", Path(config_file) / prefix)


def is_default(folder: Path | None, out: Path) -> bool:
    """Whether `folder` is the default cache of a build into `out` (then a folder that cannot serve is skipped
    with a warning, not an error: the user did not choose it)."""
    return folder is not None and Path(folder).resolve() == default_cache_dir(out)


def check_place(folder: Path, protect: Mapping[str, Path | None], option: str = "--cache",
                roots: Mapping[str, Path | None] | None = None) -> Path:
    """The cache folder, resolved, when it is a folder of its own; CbsiteError when it is, holds or lies inside
    one of `protect` (what it names -> its path: the archive, the site), is or holds one of `roots` (the project
    it may lie inside), or holds a project (PROJECT_FILES)."""
    c = Path(folder).resolve()
    places = [(what, path, True) for what, path in protect.items()] + [(w, p, False) for w, p in (roots or {}).items()]
    for what, path, inside_too in places:
        if path is None:
            continue
        p = Path(path).resolve()
        how = "is" if c == p else "holds" if c in p.parents else "lies inside" if inside_too and p in c.parents else None
        if how:
            raise CbsiteError(f"{option} {folder} {how} {what} ({p}): the cache removes what it no longer uses, so "
                              f"choose a folder of its own beside them, e.g. {option} .cbsite-cache")
    found = [name for name in PROJECT_FILES if (c / name).exists()]
    if found:
        raise CbsiteError(f"{option} {folder} holds a project ({found[0]}): choose a folder of its own for the "
                          f"cache, e.g. {option} .cbsite-cache")
    return c


def _claim(folder: Path, option: str) -> None:
    """Make `folder` the cache's (its marker), unless it is another's: a non-empty folder without the marker."""
    if (folder / MARKER).is_file():
        return
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise CbsiteError(f"{option} {folder} is not a cbsite build cache (no {MARKER} marker in it) and is not "
                          f"empty, so cbsite will not write or prune there: choose a new or empty folder "
                          f"(an older cbsite's cache: delete it, the next build makes it again)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(json.dumps({"cbsite": "build cache", "format": FORMAT}) + "\n")


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    import cbsite

    h = hashlib.sha256(f"cbsite-cache {FORMAT} {getattr(cbsite, '__version__', '')}".encode())
    package = Path(cbsite.__file__).resolve().parent
    templates = package / "generator" / "templates"
    # Not the collector (the generator never imports it) nor the command line (it only calls build).
    files = [p for p in package.rglob("*.py")
             if not {"collector", "cli"} & set(p.relative_to(package).parts) and p.name != "cli.py"]
    files += [p for p in templates.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def run_key(run: Run) -> str:
    """The run's identity (model, version, run id: two runs may share a run id) and content, and the fingerprint."""
    assert run.path is not None
    h = hashlib.sha256(fingerprint().encode())
    h.update(f"{run.model}/{run.version}/{run.run_id}\0".encode())
    for name in (archive.RUN_JSON, archive.COMPONENTS_FILE, archive.OPS_FILE, archive.SAMPLES_FILE):
        h.update(name.encode() + b"\0")
        # Read as the archive reads them (regular files of the run, capped), though read_run checked them already.
        h.update(archive.read_member(run.path, name, archive.MAX_PARQUET_BYTES)
                 if (run.path / name).exists() else b"<absent>")
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

    def __init__(self, folder: Path, protect: Mapping[str, Path | None] | None = None, option: str = "--cache",
                 roots: Mapping[str, Path | None] | None = None) -> None:
        """`protect`, `roots`: what the cache must not be, hold (or lie inside), see check_place; `option`: how the
        user named the folder, for messages."""
        self.folder = check_place(Path(folder), protect or {}, option, roots)
        _claim(self.folder, option)
        self.owned = self._load_manifest()  # "kind/name" of every entry this cache wrote
        self.refused: list[str] = []  # cache files that were not plain data: computed again
        self.used: set[tuple[str, str]] = set()
        self.keys: dict[tuple[str, str, str], str] = {}
        self.site_runs: dict[str, Any] = {}  # what this build wrote: run id -> {"key", "warnings"}
        self.site_pages: dict[str, str] = {}  # and page -> key (build.py's _Writer), under the key site_global
        self.site_global: str | None = None
        self.hits = 0
        self.misses = 0
        self._memo = self._load_memo()
        self._memo_used: dict[str, Any] = {}

    # The catalog memo: per run folder, its signature, metadata (as read_run returns it, migrated) and key.
    def _load_memo(self) -> dict[str, Any]:
        record = self._read("catalog.pickle")
        ok = isinstance(record, dict) and record.get("fingerprint") == fingerprint() and isinstance(record.get("runs"), dict)
        return record["runs"] if ok else {}

    def _read(self, name: str) -> Any:
        """A pickle of the cache read as data; None where it is missing, broken or not plain data (noted)."""
        try:
            raw = (self.folder / name).read_bytes()
        except OSError:
            return None
        try:
            return _loads(raw)
        except artifacts.NotPlainData:  # planted, or an entry of classes this cbsite does not allow
            self.refused.append(name)
        except _UNREADABLE:  # cut short, or not a pickle: computed again, quietly
            pass
        return None

    def _load_manifest(self) -> set[str]:
        try:
            entries = json.loads((self.folder / MANIFEST).read_text())["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            return set()
        # Only names this cache could have written: a manifest edited by hand never points outside the cache.
        return {e for e in entries if isinstance(e, str) and _ENTRY.fullmatch(e)} if isinstance(entries, list) else set()

    def warnings(self) -> list[str]:
        """What the build should say about the cache: files it refused to read (then computed again)."""
        if not self.refused:
            return []
        n = len(self.refused)
        line = (f"the build cache {self.folder} held {n} file{'s' * (n != 1)} that {'are' if n != 1 else 'is'} not "
                f"plain data (e.g. {self.refused[0]}): computed again, nothing of {'them' if n != 1 else 'it'} was run; "
                "if cbsite did not write them, check what else writes into the cache")
        return [line]

    def read_run(self, path: Path) -> Run:
        """archive.read_run through the memo: a run whose signature is unchanged is not read again (LazyRun)."""
        sig = run_signature(path)
        known = self._memo.get(str(path))
        if (isinstance(known, dict) and known.get("sig") == sig and isinstance(known.get("meta"), dict)
                and isinstance(known.get("key"), str) and _KEY.fullmatch(known["key"])):
            run: Run = LazyRun(copy.deepcopy(known["meta"]), path)
            self.keys[_identity(run)] = known["key"]
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
        self.used.add(("memo", name))
        value = self._read(f"memo/{name}")
        if value is not None:
            return value
        value = compute()
        self._write(f"memo/{name}", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        self.owned.add(f"memo/{name}")
        return value

    def key_of(self, run: Run) -> str:
        """The run's key, computed once per build."""
        if _identity(run) not in self.keys:
            self.keys[_identity(run)] = run_key(run)
        return self.keys[_identity(run)]

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
        value = self._read(f"{kind}/{key}/value.pickle")
        if value is None:
            if f"{kind}/{key}" in self.owned and entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)  # a broken entry of ours: written again by store()
                self.owned.discard(f"{kind}/{key}")
            self.misses += 1
            return None
        target.mkdir(parents=True, exist_ok=True)
        for src in sorted((entry / "files").iterdir()):
            if src.is_file() and not src.is_symlink():
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
            if entry.exists():
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, entry)
                self.owned.add(f"{kind}/{key}")
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        self.used.add((kind, key))

    def prune(self) -> None:
        """Remove the entries this cache wrote that this build did not use (runs deleted or changed, code
        changed): manifest entries only, never anything else in the folder. Then write the manifest."""
        used = {f"{kind}/{name}" for kind, name in self.used}
        for name in sorted(self.owned - used):
            entry = self.folder / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            if not os.path.lexists(entry):
                self.owned.discard(name)
        self._write(MANIFEST, json.dumps({"format": FORMAT, "entries": sorted(self.owned)}, indent=0).encode())


def _identity(run: Run) -> tuple[str, str, str]:
    return (run.model, run.version, run.run_id)


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
