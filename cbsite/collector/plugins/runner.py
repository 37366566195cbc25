"""Runs the selected profiler plugins around and after each component's measurement.

Isolation is the rule: a plugin that raises marks only its own output as failed for that component
(`plugin_errors` = "<plugin>: <error>") and the run goes on; the component's measured numbers are
untouched, because every plugin runs after the timed region (watchers are entered around it but must
not do work inside it beyond redirecting output).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from cbsite import archive, schema
from cbsite.collector.plugins.base import PhaseContext, PluginResult, ProfilerPlugin, RunContext

# Columns a plugin may set: the schema's plugin and link columns, except the two the runner owns.
SETTABLE = {f.name for f in schema.PLUGIN_FIELDS + schema.LINK_FIELDS} - {"plugin_metrics", "plugin_errors"}
OPS_IDENTITY = ("run_id", "model", "version", "path", "phase")

_SAFE = re.compile(r"[a-z0-9_.]")
MAX_SLUG = 120


def slug(path: str) -> str:
    """A file-system-safe folder name for a component path, distinct for distinct paths.

    Lower-case letters, digits, '_' and '.' stay; every other byte (upper case included, so two
    paths never meet on a case-insensitive file system) becomes '-' and two hex digits. That code
    is reversible, so slugs are unique. The root "" is "-root" ('r' is never a hex digit, so no
    path encodes to it). Very long paths are cut and end with '-h' and a hash of the full path.
    """
    if path == "":
        return "-root"
    out = "".join(ch if _SAFE.fullmatch(ch) else "".join(f"-{b:02x}" for b in ch.encode()) for ch in path)
    if out.startswith("."):  # no hidden folders, no "." or ".."
        out = "-2e" + out[1:]
    if len(out) > MAX_SLUG:
        out = out[:100] + "-h" + hashlib.sha256(path.encode()).hexdigest()[:16]
    return out


def label(path: str, phase: str) -> str:
    """The record_function label of a component's phase in traces: its path, the root as '<root>'."""
    return f"{path or '<root>'} [{phase}]"


@dataclass
class RowPatch:
    """What the plugins add to one row."""

    columns: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def apply(self, row: dict[str, Any]) -> None:
        row.update(self.columns)
        if self.metrics:
            row["plugin_metrics"] = [{"name": k, "value": float(v)} for k, v in sorted(self.metrics.items())]
        if self.errors:
            row["plugin_errors"] = list(self.errors)
        if self.notes:
            row["notes"] = list(row.get("notes") or []) + self.notes


def _plugin_error(name: str, exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {tb[0].filename.rsplit('/', 1)[-1]}:{tb[0].lineno})" if tb else ""
    return f"{name}: {type(exc).__name__}: {exc}{where}"[:2000]


class PluginRunner:
    """The selected profiler plugins of one run, their statuses and the op rows they produced."""

    def __init__(self, plugins: Sequence[ProfilerPlugin], run: RunContext) -> None:
        self.plugins = list(plugins)
        self.run = run
        self.status: dict[str, str] = {}
        self.ops: list[dict[str, Any]] = []
        self.broken: dict[str, str] = {}  # plugins whose start() raised: they fail on every row
        self.seconds: dict[str, float] = {p.name: 0.0 for p in self.plugins}  # time in each plugin's profile()
        for plugin in self.plugins:
            try:
                status = plugin.start(run)
            except Exception as exc:  # noqa: BLE001 - a plugin's failure is recorded, never fatal
                self.broken[plugin.name] = _plugin_error(plugin.name, exc)
                self.status[plugin.name] = f"failed to start: {self.broken[plugin.name]}"
                continue
            if status:
                self.status[plugin.name] = status

    def __bool__(self) -> bool:
        return bool(self.plugins)

    @contextlib.contextmanager
    def watching(self, ctx: PhaseContext, patch: RowPatch) -> Iterator[None]:
        """Enter every plugin's watcher around the measurement; a watcher that raises is recorded."""
        with contextlib.ExitStack() as stack:
            for plugin in self.plugins:
                if plugin.name in self.broken:
                    continue
                try:
                    stack.enter_context(plugin.watch(ctx))
                except Exception as exc:  # noqa: BLE001
                    patch.errors.append(_plugin_error(plugin.name, exc))
            yield

    def after(self, ctx: PhaseContext, patch: RowPatch) -> RowPatch:
        """Run every plugin on a measured (or failed) phase and merge what they return into `patch`."""
        for plugin in self.plugins:
            if plugin.name in self.broken:
                patch.errors.append(self.broken[plugin.name])
                continue
            started = time.perf_counter()
            try:
                result = plugin.profile(ctx)
            except Exception as exc:  # noqa: BLE001
                patch.errors.append(_plugin_error(plugin.name, exc))
                continue
            finally:
                self.seconds[plugin.name] += time.perf_counter() - started
            if result is not None:
                self._merge(plugin.name, result, ctx, patch)
        return patch

    def _merge(self, name: str, result: PluginResult, ctx: PhaseContext, patch: RowPatch) -> None:
        wrong = sorted(set(result.columns) - SETTABLE)
        if wrong:  # a plugin bug, reported on the row rather than crashing the run
            patch.errors.append(f"{name}: returned columns outside the schema's plugin columns: {wrong}")
        patch.columns.update({k: v for k, v in result.columns.items() if k in SETTABLE})
        patch.metrics.update({f"{name}.{k}": v for k, v in result.metrics.items()})
        patch.notes.extend(f"{name}: {n}" for n in result.notes)
        unknown = sorted({k for op in result.ops for k in op} - set(schema.OPS_COLUMNS))
        if unknown:
            patch.errors.append(f"{name}: op rows carry columns outside ops.parquet: {unknown}")
            return
        for op in result.ops:
            self.ops.append({**op, "path": ctx.path, "phase": ctx.phase})


_STAGING_ROOT: Path | None = None  # set by `staging_in`: the archive's staging area during `cbsite collect`
_LIVE: set[Path] = set()  # staging folders of this process, removed at exit if still there


@contextlib.contextmanager
def staging_in(folder: Path | None) -> Iterator[None]:
    """Stage plugin artifacts in `folder` (the archive's staging area) rather than the temp dir meanwhile, so
    that what a killed process leaves is where `cbsite gc` finds it."""
    global _STAGING_ROOT
    old, _STAGING_ROOT = _STAGING_ROOT, folder
    try:
        yield
    finally:
        _STAGING_ROOT = old


def staging_folder() -> Path:
    """A new folder for a run's plugin artifacts until it is saved; owned by this process (see
    `archive.new_staging`), removed with its Run (profiler._run) and at the latest when the interpreter exits,
    also after Ctrl-C or SIGTERM (the CLI turns SIGTERM into an exception)."""
    import tempfile

    if _STAGING_ROOT is not None:
        folder = archive.new_staging(_STAGING_ROOT, "artifacts-")
    else:
        folder = archive.new_staging(Path(tempfile.gettempdir()), "cbsite-artifacts-")
    if not _LIVE:
        atexit.register(_remove_live)
    _LIVE.add(folder)
    return folder


def _remove_live() -> None:
    for folder in sorted(_LIVE):
        shutil.rmtree(folder, ignore_errors=True)
    _LIVE.clear()
