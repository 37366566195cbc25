"""Studies: sweep grids, point labels, selection, resume and the study record. Core module (no torch).

`cbsite sweep PROVIDER --grid KEY=V1,V2 [--grid ...]` runs one collection per *point* of a grid of
provider options. This module decides which points there are and what they are called; the executors
that run them live in cbsite/collector/executors.py.

* **Grid.** ``KEY=V1,V2,...``: values are split at top-level commas (``top_mlp=[16,1],[32,1]`` is two
  values) and read as JSON where they parse (numbers, lists, true/false), else as strings. Points are
  the cross product of the axes in the order given (the last axis varies fastest), or with ``zip`` the
  i-th value of every axis together (every axis must then have as many values).
* **Labels.** A point's label is ``key-value`` per axis joined by ``.`` (``dense_features-64.sparse_features-4``);
  a list value is written with ``x`` (``[256,128]`` -> ``256x128``), any character a version name may not
  hold becomes ``_``. When that is longer than a version name may be (64), keys are abbreviated to
  their initials (``df-64.sf-4``), and failing that the label is ``p<index>-<hash>``. A label is the
  point's version in the archive, so it is unique within a study (a clash gets ``-<index>``).
* **Selection.** ``-k EXPR`` as pytest's: words matched as case-insensitive substrings of the label,
  combined with ``and``, ``or``, ``not`` and parentheses.
* **Resume.** Every point is a run tagged ``study:<name>`` and ``point:<label>`` (run.json also has
  ``study``: name, point, options and axes). A point with such a run in the archive is done and is
  skipped when the sweep runs again; failed and unfinished points run again.
* **Record.** ``<runs>/_studies/<name>/study.json``: the grid, every point with its options, status
  (``pending``, ``running``, ``done``, ``failed``, ``deselected``), run id and error; rewritten atomically
  (a temporary file renamed over it) as points finish. ``_studies`` is not a valid model name, so
  archive listings never read it as a model.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from cbsite import schema
from cbsite.errors import CbsiteError

STUDIES_DIR = "_studies"
STUDY_JSON = "study.json"
STUDY_VERSION = 1
STATUSES = ("pending", "running", "done", "failed", "deselected")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]")
MAX_LABEL = 64


# --- the grid ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Point:
    index: int
    label: str
    options: dict[str, Any]  # the axes' values of this point (the study's base options are apart)


def split_values(text: str) -> list[str]:
    """Split at commas outside brackets, braces and quotes: ``1,[2,3],"a,b"`` -> ``1``, ``[2,3]``, ``"a,b"``."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, None
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_grid(texts: Iterable[str]) -> list[Axis]:
    """``--grid KEY=V1,V2`` texts -> axes; every malformed one is reported at once."""
    axes, problems, seen = [], [], set()
    for text in texts:
        if "=" not in text:
            problems.append(f"{text!r} is not KEY=V1,V2,...")
            continue
        key, raw = (s.strip() for s in text.split("=", 1))
        values = split_values(raw)
        if not _KEY_RE.match(key):
            problems.append(f"{text!r}: {key!r} is not an option name")
        elif key in seen:
            problems.append(f"{text!r}: {key!r} is given twice (one --grid per option)")
        elif not raw or any(v == "" for v in values):
            problems.append(f"{text!r}: an empty value")
        else:
            parsed = [_value(v) for v in values]
            if len({json.dumps(v, sort_keys=True) for v in parsed}) != len(parsed):
                problems.append(f"{text!r}: a value is repeated")
            else:
                axes.append(Axis(key, tuple(parsed)))
        seen.add(key)
    if not axes and not problems:
        problems.append("no axis: give at least one --grid KEY=V1,V2,...")
    if problems:
        raise CbsiteError("bad --grid: " + "; ".join(problems) + ", e.g. --grid dense_features=64,512 --grid 'top_mlp=[16,1],[32,1]'")
    return axes


def expand(axes: Sequence[Axis], zip_axes: bool = False) -> list[Point]:
    """The points of a grid: the cross product of the axes, or with `zip_axes` their i-th values together."""
    if zip_axes:
        lengths = {a.key: len(a.values) for a in axes}
        if len(set(lengths.values())) > 1:
            raise CbsiteError("--zip needs every axis to have as many values: "
                              + ", ".join(f"{k} has {n}" for k, n in lengths.items()))
        combos = list(zip(*(a.values for a in axes)))
    else:
        combos = list(itertools.product(*(a.values for a in axes)))
    keys = [a.key for a in axes]
    options = [dict(zip(keys, combo)) for combo in combos]
    labels = _labels(keys, options)
    return [Point(i, label, opts) for i, (label, opts) in enumerate(zip(labels, options))]


def value_text(value: Any) -> str:
    """A value as it appears in a label: lists joined with ``x``, booleans lower case, odd characters ``_``."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "none"
    elif isinstance(value, (list, tuple)):
        text = "x".join(value_text(v) for v in value)
    elif isinstance(value, float) and value.is_integer():
        text = repr(value)
    elif isinstance(value, dict):
        text = "_".join(f"{k}-{value_text(v)}" for k, v in sorted(value.items()))
    else:
        text = str(value)
    return _LABEL_CHARS.sub("_", text) or "_"


def _initials(key: str) -> str:
    return "".join(part[0] for part in key.split("_") if part) or key[:1]


def _labels(keys: Sequence[str], options: Sequence[Mapping[str, Any]]) -> list[str]:
    short = {k: _initials(k) for k in keys}
    if len(set(short.values())) < len(short):  # initials clash: number them
        short = {k: f"{_initials(k)}{i}" for i, k in enumerate(keys)}
    out, used = [], set()
    for i, opts in enumerate(options):
        label = ".".join(f"{k}-{value_text(opts[k])}" for k in keys)
        if len(label) > MAX_LABEL:
            label = ".".join(f"{short[k]}-{value_text(opts[k])}" for k in keys)
        if len(label) > MAX_LABEL:
            digest = hashlib.sha256(json.dumps(opts, sort_keys=True, default=str).encode()).hexdigest()[:8]
            label = f"p{i}-{digest}"
        if not label[0].isalnum():
            label = f"p{label}"[:MAX_LABEL]
        if label in used:
            label = f"{label[:MAX_LABEL - len(str(i)) - 1]}-{i}"
        used.add(label)
        out.append(label)
    for label in out:
        schema.check_name("point label", label)
    return out


# --- -k selection ------------------------------------------------------------------------------


_TOKEN_RE = re.compile(r"\s*(\(|\)|[^\s()]+)")


def select(points: Sequence[Point], expression: str | None) -> list[Point]:
    """The points whose label matches a pytest-like -k expression (all of them when there is none)."""
    if not expression or not expression.strip():
        return list(points)
    match = compile_expression(expression)
    return [p for p in points if match(p.label)]


def compile_expression(expression: str):
    """``-k`` as pytest reads it: words are case-insensitive substrings; and, or, not, parentheses."""
    tokens = [t for t in _TOKEN_RE.findall(expression) if t]
    pos = 0

    def fail(what: str) -> CbsiteError:
        return CbsiteError(f"-k {expression!r}: {what}; e.g. -k 'dense_features-64 and not sparse_features-32'")

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise fail("the expression ends early")
        pos += 1
        return tokens[pos - 1]

    def parse_chain(word: str, operand, combine):
        left = operand()
        while peek() == word:
            take()
            left = combine(left, operand())
        return left

    def parse_or():
        return parse_chain("or", parse_and, lambda a, b: lambda s: a(s) or b(s))

    def parse_and():
        return parse_chain("and", parse_not, lambda a, b: lambda s: a(s) and b(s))

    def parse_not():
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda s: not inner(s)
        return parse_atom()

    def parse_atom():
        token = take()
        if token == "(":
            inner = parse_or()
            if take() != ")":
                raise fail("a parenthesis is not closed")
            return inner
        if token in (")", "and", "or", "not"):
            raise fail(f"unexpected {token!r}")
        word = token.lower()
        return lambda s: word in s.lower()

    matcher = parse_or()
    if pos != len(tokens):
        raise fail(f"unexpected {tokens[pos]!r}")
    return matcher


# --- the study and its record -------------------------------------------------------------------


def study_tag(name: str) -> str:
    return f"study:{name}"


def point_tag(label: str) -> str:
    return f"point:{label}"


@dataclass
class Study:
    """A sweep: its name, provider, base options, axes and points, and where its runs go."""

    name: str
    provider: str
    model: str
    axes: list[Axis]
    points: list[Point]
    base_options: dict[str, Any] = field(default_factory=dict)
    zip_axes: bool = False

    @classmethod
    def from_grid(cls, name: str, provider: str, grid: Iterable[str], *, base_options: Mapping[str, Any] | None = None,
                  zip_axes: bool = False, model: str | None = None) -> "Study":
        schema.check_name("study", name)
        model = model or name
        schema.check_name("model", model)
        axes = parse_grid(grid)
        clash = [a.key for a in axes if a.key in (base_options or {})]
        if clash:
            raise CbsiteError(f"{', '.join(clash)} given both as -o and as --grid: keep one")
        return cls(name, provider, model, axes, expand(axes, zip_axes), dict(base_options or {}), zip_axes)

    def options_of(self, point: Point) -> dict[str, Any]:
        return {**self.base_options, **point.options}

    def run_meta(self, point: Point) -> dict[str, Any]:
        """run.json's `study` for a point's run."""
        return {"name": self.name, "point": point.label, "index": point.index, "options": dict(point.options),
                "axes": [a.key for a in self.axes]}

    def tags(self, point: Point) -> tuple[str, str]:
        return study_tag(self.name), point_tag(point.label)

    def describe(self) -> str:
        how = "zipped" if self.zip_axes else "cross product"
        return (f"study {self.name}: {len(self.points)} point{'s' * (len(self.points) != 1)} ({how} of "
                + " x ".join(f"{a.key} [{len(a.values)}]" for a in self.axes) + f"), provider {self.provider}, model {self.model}")


def folder(root: str | os.PathLike[str], name: str) -> Path:
    return Path(root) / STUDIES_DIR / name


def done_points(root: str | os.PathLike[str], study: Study) -> dict[str, dict[str, Any]]:
    """label -> {run_id, path} of the points that have a run of this study in the archive.

    A point's run counts as done only for the options it was collected with: where the archive's runs (or the study's
    record) hold other options than this sweep gives, the sweep is refused naming the keys (a CbsiteError), so
    study.json never shows options that no run used."""
    from cbsite.archive import list_runs, read_meta

    points = {p.label: p for p in study.points}
    out: dict[str, dict[str, Any]] = {}
    differing: dict[str, tuple[Any, Any]] = {}
    for ref in list_runs(root):
        if ref.model != study.model or ref.version not in points:
            continue
        try:
            meta = read_meta(ref.path)
        except CbsiteError:
            continue  # an unreadable run is not a done point: it runs again
        tags = meta.get("tags") or []
        if study_tag(study.name) in tags and point_tag(ref.version) in tags:
            provider = p if isinstance(p := meta.get("provider"), dict) else {}
            differing.update(_differing(study, points[ref.version], provider))
            out[ref.version] = {"run_id": ref.run_id, "path": str(ref.path)}
    previous = read_record(root, study.name)
    if previous is not None:
        recorded = b if isinstance(b := previous.get("base_options"), dict) else {}
        for key in sorted(set(recorded) - set(study.base_options)):
            differing.setdefault(key, (recorded[key], _ABSENT))
        if previous.get("provider") not in (None, study.provider) and any(
                isinstance(e, dict) and e.get("status") == "done" for e in previous.get("points", [])):
            differing.setdefault("provider", (previous.get("provider"), study.provider))
    if differing:
        listed = ", ".join(f"{key} (recorded {_shown(old)}, now {_shown(new)})" for key, (old, new) in sorted(differing.items()))
        raise CbsiteError(
            f"study {study.name}: its points in the archive were collected with other options than this sweep gives: "
            f"{listed}; sweep these options as a new study (--study {study.name}-2), or give the recorded options again")
    return out


_ABSENT = object()  # an option given to one sweep and not to the other


def _shown(value: Any) -> str:
    return "not given" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str)


def _differing(study: Study, point: Point, provider: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (recorded, given) where a point's run (its run.json `provider`) differs from what this sweep gives it.
    The run records the provider's effective options (defaults too): only the keys this sweep gives are compared."""
    out: dict[str, tuple[Any, Any]] = {}
    recorded = o if isinstance(o := provider.get("options"), dict) else {}
    for key, value in study.options_of(point).items():
        was = recorded.get(key, _ABSENT)
        if was is _ABSENT or _canonical(was) != _canonical(value):
            out[key] = (was, value)
    return out


def _canonical(value: Any) -> str:
    """JSON text of a value, tuples as lists: run.json holds what JSON gave back."""
    return json.dumps(value, sort_keys=True, default=str)


def new_record(study: Study, selected: Sequence[Point], done: Mapping[str, Mapping[str, Any]],
               settings: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The study.json of a sweep about to run: points done, pending or deselected.

    Merged into `previous`: a done point whose run is the one recorded keeps its entry as it was, and keys this
    code does not set (the executor's, a point's affinity, threads or job id) are kept, never dropped."""
    chosen = {p.label for p in selected}
    before = {p["label"]: p for p in (previous or {}).get("points", []) if isinstance(p, dict) and "label" in p}
    points = []
    for p in study.points:
        prev = before.get(p.label, {})
        same_run = p.label in done and prev.get("status") == "done" and prev.get("run_id") == done[p.label]["run_id"]
        left_out = p.label not in done and p.label not in chosen and prev.get("status") in ("failed", "deselected")
        if same_run or left_out:  # nothing new about this point
            points.append(dict(prev))
            continue
        entry: dict[str, Any] = {**prev, "label": p.label, "index": p.index, "options": dict(p.options),
                                 "status": "pending", "run_id": None, "path": None, "error": None, "wall_s": None,
                                 "attempts": int(prev.get("attempts") or 0)}
        if p.label in done:
            entry.update(status="done", run_id=done[p.label]["run_id"], path=done[p.label]["path"],
                         wall_s=prev.get("wall_s"))
        elif p.label not in chosen:
            entry.update(status="deselected")
        points.append(entry)
    now = _now()
    return {
        **(previous or {}),
        "study_version": STUDY_VERSION, "name": study.name, "provider": study.provider, "model": study.model,
        "base_options": study.base_options, "zip": study.zip_axes,
        "grid": [{"key": a.key, "values": list(a.values)} for a in study.axes],
        "settings": dict(settings), "points": points,
        "created_at": (previous or {}).get("created_at") or now, "updated_at": now,
        "sweeps": int((previous or {}).get("sweeps") or 0) + 1,
    }


# What a sweep that runs nothing would change in a record: when only these differ, the record is kept as it is.
_BOOKKEEPING = ("updated_at", "sweeps", "settings")


def changes_anything(previous: Mapping[str, Any] | None, record: Mapping[str, Any]) -> bool:
    """Whether `record` says more than `previous` beyond the bookkeeping of one more sweep."""
    if previous is None:
        return True
    keys = (set(previous) | set(record)) - set(_BOOKKEEPING)
    return any(json.dumps(previous.get(k), sort_keys=True, default=str) != json.dumps(record.get(k), sort_keys=True, default=str)
               for k in keys)


def update_point(record: dict[str, Any], label: str, **values: Any) -> None:
    for entry in record["points"]:
        if entry["label"] == label:
            entry.update(values)
            record["updated_at"] = _now()
            return
    raise KeyError(label)


def counts(record: Mapping[str, Any]) -> dict[str, int]:
    out = {s: 0 for s in STATUSES}
    for entry in record.get("points", []):
        out[entry.get("status", "pending")] = out.get(entry.get("status", "pending"), 0) + 1
    return out


def write_record(root: str | os.PathLike[str], record: Mapping[str, Any]) -> Path:
    """Write study.json atomically: a temporary file in the same folder, renamed over the old one."""
    target = folder(root, record["name"]) / STUDY_JSON
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".study-", suffix=".json", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_record(root: str | os.PathLike[str], name: str) -> dict[str, Any] | None:
    """A study's record, or None when it has none (or an unreadable one: the sweep starts it anew)."""
    path = folder(root, name) / STUDY_JSON
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and record.get("study_version") == STUDY_VERSION else None


def list_studies(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every readable study record of the archive, by name."""
    base = Path(root) / STUDIES_DIR
    if not base.is_dir():
        return []
    out = []
    for entry in sorted(base.iterdir()):
        if entry.is_dir() and not entry.name.startswith("."):
            record = read_record(root, entry.name)
            if record is not None and record.get("name") == entry.name:
                out.append(record)
    return out


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
