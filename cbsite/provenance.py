"""Where a run came from: git state of the working directory and versions of the stack."""

from __future__ import annotations

import json
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any


def git_state(cwd: str | Path = ".") -> dict[str, Any] | None:
    """Commit, short hash and dirty flag of the git work tree at `cwd`, or None outside one."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        short = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "short": short, "dirty": dirty}


def package_versions(names: tuple[str, ...] = ("cbsite", "torch", "torchrec", "fbgemm_gpu")) -> dict[str, str | None]:
    """Installed versions of the stack (None where a package is absent), plus Python's."""
    dists = {"fbgemm_gpu": ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly")}
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        out[name] = None
        for dist in dists.get(name, (name,)):
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


# --- what differs between two runs' setups (the diff page and the PR summary show it first) ------------

SETUP_GROUPS = ("provider", "preprocessing", "inputs", "config", "dtype", "device", "versions", "git")
# Leaves that differ from run to run whatever the setup: how long things took, the machine's load, and
# what was measured rather than chosen (calibrated peaks and their repeats; a *given* peak still shows,
# through device.peak_source).
_VOLATILE = re.compile(
    r"(^|\.)(seconds|load_average|wall_time_s|wall_s|timed_s|started_at|ended_at|repeats|calibration|check_s|"
    r"peak_flops|peak_bandwidth)(\.|\[|$)"
)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k in sorted(value, key=str):
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):  # a list of steps (preprocessing): one key per step
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _natural(key: str) -> list[Any]:
    """A sort key that reads digit runs as numbers: `tables[4]` before `tables[10]`, `cat_9` before `cat_10`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def setup_changes(base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    """The setup keys whose values differ between two runs' metadata, as [{group, key, base, head}]: the study's
    axes first, then the provider's other options (the knobs a person turned), then the rest in SETUP_GROUPS
    order and natural key order (`[4]` before `[10]`), then the per-entry detail folded (`_fold`: one row per
    collection and kind of change, with `entries`). Values are text (JSON for lists), None where a side lacks
    the key. Timings and load (`_VOLATILE`) are left out: they differ between any two runs."""
    out: list[dict[str, Any]] = []
    for group in SETUP_GROUPS:
        a: dict[str, Any] = {}
        b: dict[str, Any] = {}
        _flatten(base.get(group), group, a)
        _flatten(head.get(group), group, b)
        for key in sorted(set(a) | set(b), key=_natural):
            if _VOLATILE.search(key) or a.get(key) == b.get(key):
                continue
            out.append({"group": group, "key": key, "base": _text(a.get(key)), "head": _text(b.get(key))})
    axes = {f"provider.options.{axis}" for meta in (base, head) for axis in _axes(meta)}
    rows = _fold(out)
    rank = [0 if r["key"] in axes else 1 if r["key"].startswith("provider.options.") else 3 if r.get("entries") else 2
            for r in rows]
    return [r for _, _, r in sorted(zip(rank, range(len(rows)), rows), key=lambda t: (t[0], t[1]))]


def _axes(meta: dict[str, Any]) -> list[str]:
    study = meta.get("study")
    axes = study.get("axes") if isinstance(study, dict) else None
    return [str(a) for a in axes] if isinstance(axes, list) else []


# An entry of a collection: a list index, or a name with a number in it (`t_cat_0`, `cat_12`); a collection is
# a place where at least FOLD_MIN such entries changed (per-table detail, per-feature input statistics).
_ENTRY = re.compile(r"\[\d+\]|[^.\[\]]*\d[^.\[\]]*")
FOLD_MIN = 3


def _collections(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, str] | None]:
    """Per row, (collection prefix, entry shape, entry, field) of its shallowest collection, or None."""
    where: list[list[tuple[str, str, str, str]]] = []
    seen: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        spots = []
        for m in _ENTRY.finditer(r["key"]):
            if m.start() and r["key"][m.start() - 1] not in ".[" and not m.group().startswith("["):
                continue  # the digits sit inside a segment that starts earlier
            spot = (r["key"][:m.start()], re.sub(r"\d+", "#", m.group()), m.group(), r["key"][m.end():])
            spots.append(spot)
            seen.setdefault(spot[:2], set()).add(spot[2])
        where.append(spots)
    return [next((s for s in spots if len(seen[s[:2]]) >= FOLD_MIN), None) for spots in where]


def _values(rows: list[dict[str, Any]], side: str, fields: list[str]) -> str:
    """One side of a folded row: each field's value where all entries agree (`ranks=[0, 1]`), else how many
    values it takes."""
    parts = []
    for field in fields:
        values = {r[side] for r in rows if r["field"] == field}
        name = field.lstrip(".") or "value"
        parts.append(f"{name}={values.pop()}" if len(values) == 1 else f"{name}: {len(values)} values")
    return "; ".join(parts)


def _fold(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of a collection's entries folded into one row per (collection, kind of change): entries added,
    removed or changed, named by the first and last entry (`provider.details.tables[4] … [15]`)."""
    spots = _collections(rows)
    entries: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r, spot in zip(rows, spots):
        if spot is not None:
            entries.setdefault(spot[:3], []).append({**r, "field": spot[3]})
    kinds = {e: ("added" if all(x["base"] is None for x in xs) else "removed" if all(x["head"] is None for x in xs)
                 else "changed") for e, xs in entries.items()}
    folded: dict[tuple[str, str, str], list[tuple[str, list[dict[str, Any]]]]] = {}
    for e, xs in entries.items():
        folded.setdefault((e[0], e[1], kinds[e]), []).append((e[2], xs))
    out: list[dict[str, Any]] = []
    done: set[tuple[str, str, str]] = set()
    for r, spot in zip(rows, spots):
        if spot is None:
            out.append(r)
            continue
        fold = (spot[0], spot[1], kinds[spot[:3]])
        if fold in done:
            continue
        done.add(fold)
        members = sorted(folded[fold], key=lambda t: _natural(t[0]))
        xs = [x for _, ex in members for x in ex]
        fields = sorted({x["field"] for x in xs}, key=_natural)
        names = [name for name, _ in members]
        key = spot[0] + (names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}")
        listed = ", ".join(f.lstrip(".") for f in fields if f)
        listed = f" ({listed})" if listed else ""
        text = {"added": (None, f"{len(names)} added{listed}"), "removed": (f"{len(names)} present{listed}", None),
                "changed": (_values(xs, "base", fields), _values(xs, "head", fields))}[fold[2]]
        out.append({"group": r["group"], "key": key, "base": text[0], "head": text[1], "entries": len(names),
                    "change": fold[2]})
    return out
