"""The archive as the site sees it: models, their versions in order, the newest run of each, the pairs to diff.

Reading is forgiving: a run whose files are broken is skipped with a warning (the build goes on), while a
user's mistake in what they asked for (an unknown run in `extra_diffs`) raises CbsiteError.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from cbsite import archive
from cbsite.archive import Run
from cbsite.diff import comparison
from cbsite.errors import CbsiteError


@dataclass
class ModelEntry:
    """One model: its versions oldest first (by their first run) and every run of each version."""

    name: str
    versions: list[str] = field(default_factory=list)
    runs: dict[str, list[Run]] = field(default_factory=dict)  # version -> runs, oldest first

    def newest(self, version: str) -> Run:
        """The run that stands for a version in trends and diffs: its newest, as `model@version` resolves."""
        return self.runs[version][-1]

    def all_runs(self) -> list[Run]:
        return [r for v in self.versions for r in self.runs[v]]


@dataclass
class Catalog:
    models: dict[str, ModelEntry]
    warnings: list[str]
    diff_pairs: list[tuple[Run, Run]]  # (base, head), consecutive versions first, then comparisons, then extra pairs
    # Comparison records (`cbsite compare`) whose two runs are both on the site, oldest first; each record's
    # pair has a diff page. `comparison_of` holds the newest record per (base run id, head run id), the one
    # `comparison.find_comparison` would pick.
    comparisons: list[dict] = field(default_factory=list)
    comparison_of: dict[tuple[str, str], dict] = field(default_factory=dict)

    def runs(self) -> list[Run]:
        return [r for m in self.models.values() for r in m.all_runs()]

    def newest_run_time(self) -> str | None:
        """The newest `created_at` in the archive: the site's date, so the same archive gives the same site."""
        times = [str(r.meta.get("created_at")) for r in self.runs() if r.meta.get("created_at")]
        return max(times) if times else None


READ_THREADS = 4  # at most, and no more than the cores


def _read_all(root: Path, warnings: list[str], read: Callable[[Path], Run],
              read_many: Callable[[list[Path]], list[Run | CbsiteError] | None] | None = None) -> list[Run]:
    runs: list[Run] = []
    for folder, problem in archive.invalid_folders(root):  # e.g. a version folder whose name is not UTF-8
        warnings.append(f"skipped folder {folder}: {problem}")
    refs = archive.list_runs(root)

    def attempt(ref: archive.RunRef) -> Run | CbsiteError:
        try:
            return read(ref.path)
        except CbsiteError as exc:
            return exc

    # `read_many` (build.py: worker processes) reads them all at once, or else a few threads read runs side
    # by side (Parquet decoding and polars release the GIL; not a cache's memo, whose known runs are only
    # a few file system calls each); results in order.
    results = read_many([ref.path for ref in refs]) if read_many is not None else None
    if results is None:
        threads = min(READ_THREADS, os.cpu_count() or 1) if read is archive.read_run else 1
        with concurrent.futures.ThreadPoolExecutor(threads) if threads > 1 and len(refs) > 1 else contextlib.nullcontext() as pool:
            results = list(pool.map(attempt, refs)) if pool is not None else [attempt(ref) for ref in refs]
    seen: dict[str, str] = {}
    for ref, run in zip(refs, results):
        if isinstance(run, CbsiteError):  # a broken run is reported and skipped; the rest still builds
            # Named relative to the archive, so the same archive builds the same page wherever it lies.
            where = f"{ref.model}/{ref.version}/{ref.run_id}"
            warnings.append(f"skipped run {where}: {str(run).replace(str(ref.path), where)}")
            continue
        if (run.model, run.version, run.run_id) != (ref.model, ref.version, ref.run_id):
            warnings.append(
                f"skipped run {ref.model}/{ref.version}/{ref.run_id}: its run.json says {run.model}/{run.version}/{run.run_id}, "
                "which does not match its folder"
            )
            continue
        # The site, its cache and comparisons know a run by its id: one id, one run (the first by folder).
        if run.run_id in seen:
            warnings.append(f"skipped run {ref.model}/{ref.version}/{ref.run_id}: run id {ref.run_id} is already "
                            f"{seen[run.run_id]}'s; run ids must be unique in an archive (move one to another archive)")
            continue
        seen[run.run_id] = f"{ref.model}/{ref.version}/{ref.run_id}"
        runs.append(run)
    return runs


def load_catalog(root: Path, extra_diffs: Sequence[tuple[str, str]] = (),
                 read: Callable[[Path], Run] = archive.read_run,
                 read_many: Callable[[list[Path]], list[Run | CbsiteError] | None] | None = None) -> Catalog:
    """Read every run under `root` (with `read`: a build cache passes its memo, cache.py; or with `read_many`,
    all at once, None where it cannot) and decide the diff pairs."""
    warnings: list[str] = []
    models: dict[str, ModelEntry] = {}
    for run in sorted(_read_all(root, warnings, read, read_many), key=lambda r: (r.model, r.run_id)):
        entry = models.setdefault(run.model, ModelEntry(run.model))
        if run.version not in entry.runs:
            # Versions are ordered by when they were first collected: "v10" after "v9", unlike a string sort.
            entry.versions.append(run.version)
            entry.runs[run.version] = []
        entry.runs[run.version].append(run)
    pairs: list[tuple[Run, Run]] = []
    for entry in models.values():
        for old, new in zip(entry.versions, entry.versions[1:]):
            pairs.append((entry.newest(old), entry.newest(new)))
    by_id = {r.run_id: r for m in models.values() for r in m.all_runs()}
    records = []
    for record in comparison.list_comparisons(root):
        ids = (str(record.get("base", {}).get("run_id")), str(record.get("head", {}).get("run_id")))
        if ids[0] not in by_id or ids[1] not in by_id or ids[0] == ids[1]:
            continue
        record.pop("_path", None)  # a local path: never on a page
        records.append(record)
    comparison_of = {(r["base"]["run_id"], r["head"]["run_id"]): r for r in records}  # newest wins
    listed = {(a.run_id, b.run_id) for a, b in pairs}

    def add(pair: tuple[Run, Run]) -> None:
        if (pair[0].run_id, pair[1].run_id) not in listed:
            listed.add((pair[0].run_id, pair[1].run_id))
            pairs.append(pair)

    for base_id, head_id in comparison_of:
        add((by_id[base_id], by_id[head_id]))
    for base_spec, head_spec in extra_diffs:
        pair = (_resolve(base_spec, root, by_id), _resolve(head_spec, root, by_id))
        if pair[0].run_id == pair[1].run_id:
            raise CbsiteError(f"extra diff {base_spec} .. {head_spec} compares a run with itself; name two runs")
        add(pair)
    return Catalog(models=dict(sorted(models.items())), warnings=warnings, diff_pairs=pairs,
                   comparisons=records, comparison_of=comparison_of)


def _resolve(spec: str, root: Path, by_id: dict[str, Run]) -> Run:
    ref = archive.resolve_run(spec, root)  # raises CbsiteError naming the known runs
    if ref.run_id not in by_id:
        raise CbsiteError(f"run {spec!r} ({ref.path}) is broken and was skipped; it cannot be diffed")
    return by_id[ref.run_id]
