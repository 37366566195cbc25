"""A run's artifacts on their way out of the archive: archive content is untrusted.

What a site publishes of `<run>/artifacts/` (see `publishable`):
- only the types the built-in plugins write (`PUBLISHED_SUFFIXES`: traces `.json.gz`, memory timelines
  `.json`, snapshots `.pickle`, text views and logs `.txt`); never HTML, JavaScript, SVG or anything else
  a browser would run on the site's origin;
- only regular files really inside the run's artifacts folder: an `artifacts` that is a symbolic link, a
  symbolic link inside it, a file that resolves elsewhere, a dot-file, a FIFO or device is not published.

How each file is cleaned on the way (see `cleaned`), so no absolute local path reaches a published file
and no link leaves the site:
- every absolute path in text is made relative (`relative_paths`): after `site-packages/` where there is
  one, else its last two parts, never a home folder's owner;
- a memory timeline's one link, `snapshot`, must name a published file beside it, or is dropped (so
  `javascript:` or a foreign origin never becomes a link);
- a snapshot pickle is read as plain data only (a restricted unpickler that refuses every class), cleaned
  and written again; one that holds anything else is not published.

The collector writes clean artifacts already (`relative_paths` on stack frames and traces); the site cleans
again because an archive may be older, or hostile. Pure Python: neither torch nor the site's libraries.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import pickle
import re
import stat
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

ARTIFACTS_DIR = "artifacts"
PUBLISHED_SUFFIXES = (".json.gz", ".json", ".pickle", ".txt")
MAX_BYTES = 512 * 1024 * 1024  # an artifact file larger than this is not published
MAX_UNPACKED_BYTES = 512 * 1024 * 1024  # nor a trace that unpacks to more (refused at the cap, see _cleaned_gzip)


class ArtifactError(ValueError):
    """An artifact that cannot be published as it is (refused type, broken content)."""


# An absolute POSIX path of two parts or more: "/" not after a word character, '.', '~', '%', '-' or ':'
# (so neither "torch/nn/x.py" nor "GB/s" matches). URLs are matched first and kept, but for file:// ones.
_PART = r"[^\s/\"'<>()\[\]{},;:|*?\\=&#`]+"
_ABSOLUTE = re.compile(rf"(?P<url>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]*)|(?<![\w.~%:-])(?:/{_PART}){{2,}}")
_HOMES = ("home", "Users")


def _relative(match: re.Match[str]) -> str:
    url = match.group("url")
    if url is not None:
        return _ABSOLUTE.sub(_relative, url[7:]) if url.lower().startswith("file://") else url
    parts = match.group(0).split("/")[1:]
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts[:-1]:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor):])
    if len(parts) > 2 and parts[0] in _HOMES:
        parts = parts[2:]  # never the owner's name
    elif parts[0] == "root":
        parts = parts[1:]
    return "/".join(parts[-2:])


@functools.lru_cache(maxsize=65536)
def _relative_paths_cached(text: str) -> str:
    return _ABSOLUTE.sub(_relative, text)


def relative_paths(text: str) -> str:
    """`text` with every absolute local path made relative: `/home/me/src/pkg/mod.py` -> `pkg/mod.py`,
    `/usr/lib/python3.11/site-packages/torch/nn/x.py` -> `torch/nn/x.py`. Stack frames repeat, so short
    strings are cached."""
    if "/" not in text:
        return text
    if len(text) <= 512:
        return _relative_paths_cached(text)
    return _ABSOLUTE.sub(_relative, text)


def scrubbed(data: Any) -> Any:
    """A copy of plain data (dicts, lists, tuples, strings, numbers) with `relative_paths` applied to every
    string, keys included; shared sub-objects are cleaned once."""
    memo: dict[int, Any] = {}

    def walk(obj: Any) -> Any:
        if isinstance(obj, str):
            return relative_paths(obj)
        if not isinstance(obj, (dict, list, tuple)):
            return obj
        key = id(obj)
        if key in memo:
            return memo[key]
        if isinstance(obj, dict):
            out: Any = {}
            memo[key] = out
            for k, v in obj.items():
                out[walk(k)] = walk(v)
        elif isinstance(obj, list):
            out = []
            memo[key] = out
            out.extend(walk(v) for v in obj)
        else:
            out = tuple(walk(v) for v in obj)
            memo[key] = out
        return out

    return walk(data)


def _allowed(name: str) -> bool:
    return not name.startswith(".") and name.endswith(PUBLISHED_SUFFIXES)


def publishable(run_dir: Path) -> tuple[list[tuple[Path, str]], list[str]]:
    """(file, its path under `artifacts/`) for each artifact of the run folder that may be published, sorted;
    and one line for each entry that is refused (see the module docstring)."""
    folder = run_dir / ARTIFACTS_DIR
    problems: list[str] = []
    if folder.is_symlink():
        return [], [f"{ARTIFACTS_DIR} is a symbolic link: none of it is published"]
    if not folder.is_dir():
        return [], []
    files: list[tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        for d in list(dirnames):
            if (here / d).is_symlink():
                dirnames.remove(d)
                problems.append(f"{ARTIFACTS_DIR}/{(here / d).relative_to(folder).as_posix()} is a symbolic link: not published")
            elif d.startswith("."):
                dirnames.remove(d)
        for name in filenames:
            path = here / name
            rel = path.relative_to(folder).as_posix()
            if name.startswith("."):
                continue  # the collector's own bookkeeping (staging owner), never content
            why = _refusal(path, None, name)  # inside: reached from `folder` through no link
            if why:
                problems.append(f"{ARTIFACTS_DIR}/{rel} {why}: not published")
            else:
                files.append((path, rel))
    return sorted(files, key=lambda f: f[1]), sorted(problems)


def _refusal(path: Path, base: Path | None, name: str) -> str | None:
    """Why the file at `path` is not published, or None; `base`: the folder it must resolve inside (None: known to)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if base is not None and not path.resolve().is_relative_to(base):
        return "lies outside the run folder"
    if not _allowed(name):
        return f"is not a known artifact type ({', '.join(PUBLISHED_SUFFIXES)})"
    if info.st_size > MAX_BYTES:
        return f"is larger than {MAX_BYTES >> 20} MiB"
    return None


def is_publishable_link(run_dir: Path, link: str) -> bool:
    """Whether a link column's value (relative to the run folder) names an artifact the site publishes."""
    rel = PurePosixPath(link)
    if rel.is_absolute() or not rel.parts or rel.parts[0] != ARTIFACTS_DIR or ".." in rel.parts or len(rel.parts) < 2:
        return False
    path = run_dir.joinpath(*rel.parts)
    if any(p.startswith(".") for p in rel.parts) or (run_dir / ARTIFACTS_DIR).is_symlink():
        return False
    return _refusal(path, (run_dir / ARTIFACTS_DIR).resolve(), rel.name) is None


def cleaned(path: Path, siblings: set[str] | None = None) -> bytes:
    """The bytes to publish for an artifact (see the module docstring); ArtifactError when it cannot be.

    `siblings`: names of the files published beside it (a memory timeline's `snapshot` must be one of them).
    """
    name = path.name
    if name.endswith(".json.gz"):
        return _cleaned_gzip(path)
    raw = path.read_bytes()
    if name.endswith(".json"):
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=lambda _: None)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ArtifactError(f"is not JSON ({exc})") from None
        data = scrubbed(data)
        if isinstance(data, dict) and "snapshot" in data:
            data["snapshot"] = _same_folder_link(data["snapshot"], siblings or set())
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if name.endswith(".pickle"):
        return pickle.dumps(scrubbed(plain_unpickle(raw)), protocol=4)
    if name.endswith(".txt"):
        return relative_paths(raw.decode("utf-8", "replace")).encode()
    raise ArtifactError(f"is not a known artifact type ({', '.join(PUBLISHED_SUFFIXES)})")


def _cleaned_gzip(path: Path) -> bytes:
    """A gzip trace cleaned as a stream: unpacked a chunk at a time and refused once it passes
    MAX_UNPACKED_BYTES, so a gzip bomb costs a chunk of memory, not its unpacked size. Each chunk is cleaned up to
    its last quote or white space: no path or URL `relative_paths` rewrites spans one, so the pieces clean as the
    whole would."""
    out = io.BytesIO()
    total, carry = 0, b""
    try:
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as src, \
                gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0, filename="") as dst:
            while chunk := src.read(_CHUNK):
                total += len(chunk)
                if total > MAX_UNPACKED_BYTES:
                    raise ArtifactError(f"unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB")
                data = carry + chunk
                cut = max(data.rfind(sep) for sep in _SPLITS)
                if cut < 0 and len(data) > _MAX_TOKEN:
                    raise ArtifactError(f"has {_MAX_TOKEN >> 20} MiB without a quote or space: not a trace")
                dst.write(_clean_bytes(data[:cut + 1]))
                carry = data[cut + 1:]
            dst.write(_clean_bytes(carry))
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ArtifactError(f"is not gzip data ({exc})") from None
    return out.getvalue()


_CHUNK = 256 << 10  # small: cleaning a chunk with many paths takes several times its size
_MAX_TOKEN = 16 << 20
_SPLITS = (b'"', b" ", b"\n", b"\t", b"\r")  # bytes no match of _ABSOLUTE contains (ASCII: never inside a UTF-8 character)


def _clean_bytes(data: bytes) -> bytes:
    return relative_paths(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape") if data else b""


def _same_folder_link(value: Any, siblings: set[str]) -> str | None:
    """A link to a published file in the same folder, by name, or None: no scheme, no '/', no '..'."""
    if isinstance(value, str) and value in siblings and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", value):
        return value
    return None


class NotPlainData(ArtifactError):
    """A pickle that names a class or function: never built (it could run code)."""


class _PlainUnpickler(pickle.Unpickler):
    """Reads plain data only: dicts, lists, tuples, sets, strings, numbers, and instances of the `allowed` classes
    (plain dataclasses the caller names, whose state is set field by field). Any other class or function is
    refused, so loading an untrusted pickle runs nothing."""

    def __init__(self, file: io.BytesIO, allowed: frozenset[tuple[str, str]] = frozenset()) -> None:
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            return super().find_class(module, name)
        raise NotPlainData(f"holds {module}.{name}, not plain data")


def plain_unpickle(raw: bytes, allowed: frozenset[tuple[str, str]] = frozenset()) -> Any:
    """A pickle read as plain data (see _PlainUnpickler); ArtifactError for anything else."""
    try:
        return _PlainUnpickler(io.BytesIO(raw), allowed).load()
    except ArtifactError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is refused the same way
        raise ArtifactError(f"is not a readable pickle ({type(exc).__name__}: {exc})") from None


def publish(files: list[tuple[Path, str]], target: Path) -> tuple[int, list[str]]:
    """Write the cleaned `files` (from `publishable`) under `target` (the site's `<run>/artifacts/`);
    return how many were written and one line per file that was not."""
    by_folder: dict[str, set[str]] = {}
    for _, rel in files:
        parent, _, fname = rel.rpartition("/")
        by_folder.setdefault(parent, set()).add(fname)
    written, problems = 0, []
    made: set[Path] = set()  # folders made: a run publishes tens of files into a few folders
    for path, rel in files:
        parent = rel.rpartition("/")[0]
        try:
            data = cleaned(path, by_folder.get(parent, set()))
        except (ArtifactError, OSError, MemoryError) as exc:
            problems.append(f"{ARTIFACTS_DIR}/{rel} {exc}: not published")
            continue
        dest = target.joinpath(*rel.split("/"))
        if dest.parent not in made:
            dest.parent.mkdir(parents=True, exist_ok=True)
            made.add(dest.parent)
        dest.write_bytes(data)
        written += 1
    return written, problems
