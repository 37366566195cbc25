"""The build's computing: run pages' data and diffs, by a pool of worker processes on every core.

A run's page data (rundata.py: components.json, ops.json, the roofline, the downloads) and a diff (diffdata.py:
diff.json, charts.json and what its page needs) are written into the page folders by these jobs; the main process
(build.py) waits for them, then renders the pages from what they return. Jobs run in-process where a pool does not
pay or cannot start.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cbsite import archive, provenance
from cbsite.archive import Run
from cbsite.diff import rundiff as cdiff
from cbsite.diff import traffic
from cbsite.errors import CbsiteError
from cbsite.generator import cache as bcache
from cbsite.generator import diffdata, latencydata, regressionsdata, roofline, rundata, runpagedata, templating


def diff_job(job: tuple[Path, Path, Path, str, dict[str, Any] | None]) -> dict[str, Any]:
    """Compute one diff and write its data files; runs in a worker process (diffs dominate build time).

    `record` is the comparison record of the two runs, if any (read once by the catalog): latency is
    judged on it, else on both runs' rounds, else not judged (latencydata.py).
    Returns only what the templates need, so little crosses the process boundary.
    """
    base_path, head_path, folder, model, record = job
    base, head = _read(base_path), _read(head_path)
    try:
        rd = cdiff.diff_runs(base, head)
    except CbsiteError as exc:  # e.g. no phase in common: a page that says so, not a crashed build
        return {"error": str(exc)}
    judged = latencydata.judge(record, base, head, rd)
    facts = diffdata.RunFacts.of(rd, base, head)  # bounds on each side; own changes that mix ranks (sharded)
    base_page = _PAGES.get(str(base_path))  # the base run's page data, when this worker computed it a moment ago
    if base_page is not None:
        facts.know_page("base", base_page)
    tops = diffdata.top_rows(rd, model, judged, facts)
    page = _PAGES.get(str(head_path))  # the head run's page data, when this worker has just computed it
    for name, data in diffdata.diff_files(rd, judged, head, page, facts).items():  # diff.json and one file per phase
        templating.dump_json(data, folder / name)
    specs = diffdata.chart_specs(tops)
    if specs:
        templating.dump_json(specs, folder / "charts.json")
    summary, digest = diffdata.summary(rd, judged)
    return {
        "summary": summary, "digest": digest,
        "warnings": list(rd.warnings), "phases": rd.phases,
        "totals": diffdata.totals_rows(rd, judged), "tops": tops, "ties": diffdata.ties(tops),
        "chart_metrics": list(specs), "counts": {p: rd.counts(p) for p in rd.phases},
        "latency": diffdata.with_bounds(latencydata.latency_context(judged, rd, model), rd, facts),
        "setup": provenance.setup_changes(base.meta, head.meta),
        "answer": diffdata.answer(rd, model, judged, facts), "colour": diffdata.default_colour(rd, judged),
        "run_warnings": {"base": list(base.meta.get("warnings") or []), "head": list(head.meta.get("warnings") or [])},
        "traffic": traffic.rows(rd.traffic, model),  # sharded runs: collective bytes per component; [] otherwise
        "regressions": regressionsdata.diff_regressions(judged, rd, model),  # the archive's regressions index
    }


PARALLEL_MIN_JOBS = 8  # below this, starting worker processes costs more than it saves
CHUNK = 16  # jobs a worker takes at a time: a run's page and its diffs stay together, the last chunks stay short


def _workers() -> int:
    return max(1, int(os.environ.get("CBSITE_BUILD_JOBS") or os.cpu_count() or 1))


_RECENT: collections.OrderedDict[str, Run] = collections.OrderedDict()
# The page data (rundata.components_json) of the last few runs a worker process computed the page of: the diffs
# whose head such a run is come right after its page in the worker's jobs (Jobs), and take the head run's columns
# from it instead of computing them again (diffdata._run_columns). Empty in the main process.
_PAGES: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
_KEEP_RECENT = 0  # runs a worker process keeps once read (_worker_start); 0 in the main process, which reads afresh


def _worker_start() -> None:
    global _KEEP_RECENT
    _KEEP_RECENT = 4
    # A diff makes tens of thousands of small containers that live until it is written: the garbage collector walking
    # them and every import's objects over and over is costly. Imports frozen, collections rarer; no output changes.
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def _started() -> None:
    """A task that does nothing: one per worker, so that the pool starts them all at once (Pool.get)."""


@contextlib.contextmanager
def _one_polars_thread() -> Iterator[None]:
    """POLARS_MAX_THREADS=1 in the environment of the worker processes started within (unless the user set it):
    each worker has a core of its own, and polars' threads in a worker only contend with the other workers
    (polars reads the variable once, when it is imported, so it must be there when the process starts)."""
    if "POLARS_MAX_THREADS" in os.environ:
        yield
        return
    os.environ["POLARS_MAX_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("POLARS_MAX_THREADS", None)


def _read(path: Path) -> Run:
    """archive.read_run; a worker keeps the last few runs it read, since a run's page and the diffs it takes
    part in are next to each other in its jobs (Jobs), so it reads each run about once instead of three times."""
    if not _KEEP_RECENT:
        return archive.read_run(path)
    key = str(path)
    run = _RECENT.pop(key, None) or archive.read_run(path)
    _RECENT[key] = run
    while len(_RECENT) > _KEEP_RECENT:
        _RECENT.popitem(last=False)
    return run


def _job(task: tuple[str, Any]) -> Any:
    kind, job = task
    return run_job(job) if kind == "run" else diff_job(job)


class Pool:
    """The build's worker processes, started when first asked for (None: in-process, with CBSITE_BUILD_JOBS=1,
    on one core, or where the pool cannot start) and stopped with `stack`."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack, self.failed = stack, _workers() <= 1
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None

    def get(self) -> concurrent.futures.ProcessPoolExecutor | None:
        if self.pool is None and not self.failed:
            try:
                ctx = multiprocessing.get_context("spawn")
                pool = self.stack.enter_context(concurrent.futures.ProcessPoolExecutor(
                    max_workers=_workers(), mp_context=ctx, initializer=_worker_start))
                with _one_polars_thread():  # the workers are started now, while their environment says so
                    for _ in range(_workers()):
                        pool.submit(_started)
                self.pool = pool
            except (OSError, RuntimeError):
                self.failed = True
        return self.pool

    def running(self) -> concurrent.futures.ProcessPoolExecutor | None:
        """The pool if a step has started it (one that had enough to do), else None: never started for less."""
        return self.pool


def _check_job(path: Path) -> tuple[bool, Any]:
    """The catalog's reading of one run in a worker: (True, its metadata) or (False, why it is broken)."""
    try:
        return True, archive.read_run(path).meta
    except CbsiteError as exc:
        return False, str(exc)


def read_checked(pool: Pool, paths: list[Path]) -> list[Run | CbsiteError] | None:
    """The catalog's runs read and checked by the workers (both cores while the main process waits), each a
    LazyRun of its metadata whose rows are read again where the main process needs them; None: in-process."""
    ex = pool.get() if len(paths) >= PARALLEL_MIN_JOBS else None
    if ex is None:
        return None
    broken = (concurrent.futures.process.BrokenProcessPool, OSError, RuntimeError)
    try:
        checked = list(ex.map(_check_job, paths, chunksize=max(1, min(CHUNK, len(paths) // (4 * _workers())))))
    except broken:
        pool.failed = True
        return None
    return [bcache.LazyRun(value, path) if ok else CbsiteError(value) for path, (ok, value) in zip(paths, checked)]


class Jobs:
    """Run pages' data and diffs, computed by one pool of worker processes on every core (CBSITE_BUILD_JOBS
    overrides; 1 = in-process) while the main process waits; results come back in each group's order.

    Jobs are handed out in the catalog's run order, each run's page just before the diffs whose head it is, in
    short chunks (CHUNK), so a worker has the runs it needs at hand (_read) and the two cores finish together.
    Workers are spawned, never forked: polars' thread pool does not survive a fork (the child deadlocks).
    Spawning re-imports the caller's main script, so a script that calls build_site must guard it with
    `if __name__ == "__main__":` (the usual multiprocessing rule); where the pool cannot start or breaks
    (no guard, a main read from stdin), the jobs run in-process instead.
    """

    def __init__(self, stack: contextlib.ExitStack, order: dict[str, int], pool: Pool | None = None) -> None:
        self.stack, self.order = stack, order  # run path -> its place in the catalog
        self.pool = pool or Pool(stack)
        self.groups: list[tuple[str, list[Any], Callable[[Any], Any]]] = []
        self.results: list[list[Any]] | None = None

    def add(self, kind: str, jobs: list[Any], local: Callable[[Any], Any]) -> Callable[[], list[Any]]:
        """Jobs of `kind` ("run": (run path, page folder); "diff": diff_job's tuple); `local` computes one
        in-process. Returns the function that waits for their results."""
        g = len(self.groups)
        self.groups.append((kind, jobs, local))
        return lambda: self._wait()[g]

    def start(self) -> None:
        tasks = [(self.order.get(str(job[0] if kind == "run" else job[1]), -1), kind != "run", g, i)
                 for g, (kind, jobs, _) in enumerate(self.groups) for i, job in enumerate(jobs)]
        workers = _workers()
        if workers <= 1 or len(tasks) < PARALLEL_MIN_JOBS:
            return
        tasks.sort()
        broken = (concurrent.futures.process.BrokenProcessPool, OSError, RuntimeError)
        try:
            pool = self.pool.get()
            if pool is None:
                return
            it = pool.map(_job, [(self.groups[g][0], self.groups[g][1][i]) for _, _, g, i in tasks],
                          chunksize=max(1, min(CHUNK, len(tasks) // (4 * workers))))
        except broken:
            return
        self._pending = (tasks, it, broken)

    def _wait(self) -> list[list[Any]]:
        if self.results is None:
            pending = getattr(self, "_pending", None)
            if pending is not None:
                tasks, it, broken = pending
                try:
                    out: list[list[Any]] = [[None] * len(jobs) for _, jobs, _ in self.groups]
                    for (_, _, g, i), result in zip(tasks, it):
                        out[g][i] = result
                    self.results = out
                except broken:
                    pass
            if self.results is None:
                self.results = [[local(job) for job in jobs] for _, jobs, local in self.groups]
        return self.results


def run_files(run: Run, folder: Path, warnings: list[str]) -> rundata.RunData:
    """A run's page data: computed and written into `folder` (the run page's folder)."""
    rd, comps, ops = runpagedata.run_data(run, warnings)
    if _KEEP_RECENT and run.path is not None:  # a worker process: kept for the diffs whose head this run is
        _PAGES[str(run.path)] = comps
        while len(_PAGES) > _KEEP_RECENT:
            _PAGES.popitem(last=False)
    rundata.write_run_files(run, folder, comps, ops, templating.dump_json)
    drawn = roofline.roofline_data(comps)
    if drawn is not None:
        templating.dump_json({"roofline": drawn}, folder / "roofline.json")
        rd.roofline = True
    return rd


def run_job(job: tuple[Path, Path, Path | None], run: Run | None = None) -> dict[str, Any]:
    """One run page's data, computed and written into its folder; runs in a worker process beside the diffs
    (in-process: with the catalog's `run`). Returns what the cache keeps of it (the RunData without its Run,
    and the warnings); with a third path, also publishes the run's artifacts there (`published`: its warnings)."""
    path, folder, publish_to = job
    found: list[str] = []
    run = run if run is not None else _read(path)
    rd = run_files(run, folder, found)
    value = bcache.run_value(rd, found)
    if publish_to is not None:
        value["published"] = []
        rundata.copy_artifacts(run, publish_to, value["published"])
    return value
