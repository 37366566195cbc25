"""`cbsite compare BASE HEAD`: one session measures both sides, pair by pair, and decides per component.

1. Each side is collected as a run in this process (FLOPs, bytes, memory, plugins; its timing is round 0).
2. Components are aligned as the diff aligns them (moved modules too); a component measured on both
   sides in a phase becomes a task.
3. Worker processes (default 6, one after another) load both models and time every task in random
   A/B block pairs on the same captured inputs where the shapes agree (`interleaved`), or, when the two
   sides cannot share a process (`--base-rev`: another git revision of the user's package), load one
   side each in ABBA order (`abba`).
4. Per component and phase the units (per-process median paired log ratios) give a verdict
   (cbsite.stats). Each run's latency becomes the median of its rounds (rounds.py); the two runs, and a
   comparison record holding every sample and verdict, go into the archive.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import polars as pl
import pyarrow as pa

from cbsite import archive, schema, stats
from cbsite.archive import Run
from cbsite.collector import hierarchy, peaks
from cbsite.collector.session import rounds
from cbsite.collector.session.scheduler import LAYOUTS, plan_jobs, run_jobs
from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task
from cbsite.diff import comparison
from cbsite.diff.rundiff import diff_runs
from cbsite.errors import CbsiteError

DEFAULT_PROCESSES = 6


@dataclass(frozen=True)
class CompareConfig:
    processes: int = DEFAULT_PROCESSES
    layout: str = "interleaved"
    pairs: int = 8  # A/B block pairs per task and process
    block_s: float = 0.01  # target seconds of one block
    alpha: float = stats.ALPHA
    floor: float = stats.FLOOR
    share_inputs: bool = True
    base_sys_path: tuple[str, ...] = ()  # a worktree of another revision for the base side (forces abba)

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.processes, int) or self.processes < 2:
            problems.append(f"--processes must be 2 or more (a verdict needs at least 2 units), got {self.processes!r}")
        if self.layout not in LAYOUTS:
            problems.append(f"--order must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.layout == "abba" and self.processes % 2:
            problems.append(f"the abba order needs an even number of processes, got {self.processes}")
        if not isinstance(self.pairs, int) or self.pairs < 1:
            problems.append(f"--pairs must be at least 1, got {self.pairs!r}")
        if not (0 < self.block_s < 10):
            problems.append(f"--block-time must be between 0 and 10 seconds, got {self.block_s!r}")
        if not (0 < self.alpha < 0.5):
            problems.append(f"--alpha must be between 0 and 0.5, got {self.alpha!r}")
        if not (0 <= self.floor < 10):
            problems.append(f"--floor must be a fraction such as 0.05, got {self.floor!r}")
        if problems:
            raise CbsiteError("; ".join(problems))


@dataclass
class Comparison:
    base: Run
    head: Run
    record: dict[str, Any]
    samples: pl.DataFrame | None
    verdicts: dict[tuple[str, str], stats.Verdict]
    path: Path | None = None

    def save(self, root: str | os.PathLike[str]) -> Path:
        """Both runs, then the comparison record that names them (each written atomically)."""
        self.base.save(root)
        self.head.save(root)
        table = self.samples.to_arrow() if self.samples is not None else None
        self.path = comparison.write_comparison(root, self.record, table)
        return self.path


def compare(
    base_request: Any,
    head_request: Any,
    cfg: CompareConfig = CompareConfig(),
    *,
    progress: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> Comparison:
    """Collect both sides, time them together in worker processes, and judge every component."""
    from cbsite.collector.collect import collect

    started = time.perf_counter()
    layout = "abba" if cfg.base_sys_path else cfg.layout
    say(f"collecting base {base_request.model_name or base_request.provider}@{base_request.version} (round 0) ...")
    base_run = _collect_side(base_request, cfg.base_sys_path, collect)
    say(f"collecting head {head_request.model_name or head_request.provider}@{head_request.version} (round 0) ...")
    head_run = collect(head_request)
    session_id = archive.new_run_id()

    tasks = _paired_tasks(base_run, head_run)
    if not tasks:
        raise CbsiteError("no component was measured on both sides: nothing to compare (check --phases and filters)")

    threads = head_run.meta["config"]["num_threads"]
    arms = [
        ArmSpec(arm="base", request=base_request, sys_path=cfg.base_sys_path,
                device=base_request.config.device, dtype=base_request.config.dtype),
        ArmSpec(arm="head", request=head_request, device=head_request.config.device, dtype=head_request.config.dtype),
    ]
    template = ProcessJob(session_id=session_id, process=0, arms=(), tasks=(), threads=threads, pairs=cfg.pairs,
                          block_s=cfg.block_s, warmup=head_request.config.warmup, share_inputs=cfg.share_inputs,
                          max_task_s=max(5.0, 40 * cfg.pairs * cfg.block_s),
                          memory_limit=head_request.config.memory_limit)
    jobs = plan_jobs(session_id, arms, tasks, cfg.processes, layout, template)
    say(f"timing {len(tasks)} component phases in {len(jobs)} fresh processes ({layout}, {threads} thread"
        f"{'s' * (threads != 1)}, {cfg.pairs} pairs of ~{cfg.block_s * 1e3:.0f} ms blocks each) ...")
    session = _run_with_progress(jobs, layout, progress)

    raw = session.samples
    samples = _samples_frame(raw, base_run, head_run)
    units = comparison.paired_units(samples, layout) if samples is not None else {}
    flagged, errors = session.notes("process")
    verdicts = {(t.key, t.phase): stats.paired(units.get((t.key, t.phase), []), alpha=cfg.alpha, floor=cfg.floor)
                for t in tasks}
    # A component whose work varies per call (variation.py) does different work on every replay: its blocks are draws,
    # and their ratio says nothing of the code. Not judged, whatever the units say.
    unjudged = _varying(tasks, base_run, head_run)
    for key, reason in unjudged.items():
        verdicts[key] = stats.Verdict("not judged", None, None, None, None, None, len(units.get(key, [])), None, None,
                                      None, reason)

    # Each run's latency: the median of its rounds (round 0 here, then every session process it was in).
    for run, arm in ((base_run, "base"), (head_run, "head")):
        _apply_session(run, [s for s in raw if s["arm"] == arm], flagged, arm_paths={t.path(arm): t.key for t in tasks})

    record = {
        "comparison_version": comparison.COMPARISON_VERSION,
        "schema_version": schema.SCHEMA_VERSION,
        "comparison_id": session_id,
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "base": _side(base_run, cfg.base_sys_path),
        "head": _side(head_run, ()),
        "layout": layout,
        "processes": cfg.processes,
        "processes_died": {str(k): v for k, v in session.died.items()},
        "process_seconds": {str(r.process): {k: round(v, 3) for k, v in r.seconds.items()} for r in session.results},
        "threads": threads,
        "pairs": cfg.pairs,
        "block_s": cfg.block_s,
        "alpha": cfg.alpha,
        "floor": cfg.floor,
        "share_inputs": cfg.share_inputs,
        "load_average": _load(),
        "wall_s": round(time.perf_counter() - started, 3),
        "session_wall_s": round(session.wall_s, 3),
        "rule": ("per process: median over uncontended A/B block pairs of log(head/base); across processes: "
                 "one-sided t-tests at alpha with a magnitude floor, 95 % interval, equivalence for 'unchanged' (cbsite.stats)"),
        "components": [
            {
                "key": t.key, "base_path": t.path("base"), "phase": t.phase,
                "units": units.get((t.key, t.phase), []),
                "verdict": verdicts[(t.key, t.phase)].to_dict(),
                "flagged": flagged.get((t.key, t.phase), []),
                "not_judged": unjudged.get((t.key, t.phase)),
                "errors": errors.get((t.key, t.phase), []),
            }
            for t in tasks
        ],
        "summary": comparison.summary(verdicts),
    }
    for run in (base_run, head_run):
        run.meta.setdefault("comparisons", []).append(session_id)
    return Comparison(base=base_run, head=head_run, record=record, samples=samples, verdicts=verdicts)


def _paired_tasks(base_run: Run, head_run: Run) -> list[Task]:
    """One task per component phase measured on both sides, aligned by the diff (moves matched)."""
    rd = diff_runs(base_run, head_run, match_moved=True)
    base_status = {(r["path"], r["phase"]): r["status"] for r in base_run.rows.iter_rows(named=True)}
    head_status = {(r["path"], r["phase"]): r["status"] for r in head_run.rows.iter_rows(named=True)}
    tasks = []
    for c in rd.components:
        if c.kind in ("added", "removed") or c.base_path is None:
            continue
        if base_status.get((c.base_path, c.phase)) == "measured" and head_status.get((c.path, c.phase)) == "measured":
            tasks.append(Task(key=c.path, phase=c.phase, paths=(("base", c.base_path), ("head", c.path))))
    return tasks


def _varying(tasks: list[Task], base_run: Run, head_run: Run) -> dict[tuple[str, str], str]:
    """(key, phase) -> why not judged, for the tasks whose component's work varies per call on either side."""
    from cbsite.collector.variation import varies

    noted: dict[tuple[str, str, str], str] = {}
    for arm, run in (("base", base_run), ("head", head_run)):
        for row in run.rows.select("path", "phase", "notes").iter_rows(named=True):
            note = varies(row["notes"])
            if note:
                noted[(arm, row["path"], row["phase"])] = note
    out = {}
    for t in tasks:
        for arm in ("base", "head"):
            note = noted.get((arm, t.path(arm), t.phase))
            if note:
                out[(t.key, t.phase)] = f"work varies per call: not judged ({arm} side: {note.split(': ', 1)[-1]})"
                break
    return out


def _collect_side(request: Any, sys_path: tuple[str, ...], collect: Callable[[Any], Run]) -> Run:
    """The base side of `--base-rev` imports another revision of the user's package: collect it in a worker."""
    if not sys_path:
        return collect(request)
    from cbsite.collector.clean_worker import spawn_pool

    with spawn_pool(1) as pool:  # the worker dies with this process
        return pool.submit(_collect_with_path, request, sys_path).result()


def _collect_with_path(request: Any, sys_path: tuple[str, ...]) -> Run:
    import sys

    from cbsite.collector.collect import collect

    for entry in reversed(sys_path):
        sys.path.insert(0, entry)
    run = collect(request)
    run.artifacts = None  # the worker's staging folder dies with it; plugins' files are not carried back
    return run


def _run_with_progress(jobs: list[ProcessJob], layout: str, progress: bool) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), disable=not progress)
    with bar:
        task = bar.add_task("worker processes", total=len(jobs))
        return run_jobs(jobs, layout, on_done=lambda done, total, elapsed: bar.update(task, completed=done))


def _samples_frame(raw: list[dict[str, Any]], base_run: Run, head_run: Run) -> pl.DataFrame | None:
    if not raw:
        return None
    ids = {"base": base_run, "head": head_run}
    rows = [{**s, "run_id": ids[s["arm"]].run_id, "model": ids[s["arm"]].model, "version": ids[s["arm"]].version}
            for s in raw]
    frame = pl.from_arrow(pa.Table.from_pylist(rows, schema=schema.SAMPLES_SCHEMA))
    assert isinstance(frame, pl.DataFrame)  # a Table gives a DataFrame (a Series comes from an Array)
    return frame


def _apply_session(run: Run, arm_samples: list[dict[str, Any]], flagged: dict[tuple[str, str], list[str]],
                   arm_paths: dict[str, str]) -> None:
    """Fold the session's blocks of one arm into its run: samples, latency from rounds, ratios."""
    rows = run.rows.to_dicts()
    own = run.samples.to_dicts() if run.samples is not None else []
    for s in own:
        s.pop("run_id", None), s.pop("model", None), s.pop("version", None)
    merged = own + [{k: v for k, v in s.items()} for s in arm_samples]
    dev = run.meta["device"]
    peak_flops = next(iter(dev.get("peak_flops", {}).values()), None)
    notes = {(path, phase): flagged[(key, phase)] for path, key in arm_paths.items() for phase in schema.PHASES
             if (key, phase) in flagged}
    noise = rounds.apply_rounds(rows, merged, run.meta["config"]["phases"], peak_flops, dev.get("peak_bandwidth"), notes)
    # The hierarchy check and the MFU ceiling are judged again on the final latencies (round 0 alone was
    # judged during the collection).
    for row in rows:
        row["notes"] = [n for n in (row["notes"] or []) if not n.startswith(("slower than its parent", "faster than its child"))]
    previous = run.meta.get("hierarchy") or {}
    run.meta["hierarchy"] = hierarchy.check(rows, previous.get("remeasured_pairs", 0))
    above = [r for r in rows if r.get("mfu") is not None and r["mfu"] > 1]
    for row in above:
        if not any(n.startswith((peaks.MFU_NOTE, peaks.FLOPS_SUSPECT_NOTE)) for n in row["notes"] or []):
            row["notes"] = list(row["notes"] or []) + [f"{peaks.MFU_NOTE} after the session's rounds: see the run's warnings"]
    if above:
        run.meta.setdefault("warnings", []).append(
            f"{len(above)} row(s) above 100 % MFU once the comparison's rounds set their latency: "
            + ", ".join(f"{r['path'] or '<root>'} {r['phase']} {r['mfu']:.0%}" for r in above[:8]))
    table = pl.from_arrow(archive.rows_to_table(rows))
    assert isinstance(table, pl.DataFrame)  # a Table gives a DataFrame (a Series comes from an Array)
    run.rows = table
    from cbsite.collector.pipeline.rows import samples_frame

    run.samples = samples_frame(merged, run.run_id, run.model, run.version)
    run.meta.update(rounds=noise["rounds"], noise=noise,
                    samples={"file": archive.SAMPLES_FILE, "rows": len(merged)})


def _side(run: Run, sys_path: tuple[str, ...]) -> dict[str, Any]:
    return {
        "run_id": run.run_id, "model": run.model, "version": run.version, "provider": run.meta.get("provider"),
        "sys_path": list(sys_path),
    }


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
