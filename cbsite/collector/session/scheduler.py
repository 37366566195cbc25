"""The one scheduler of measurement tasks: fresh worker processes, one after another.

Workers run one at a time (two timing processes on a 2-core machine would be each other's busy
neighbour), each in a new process from the standard library's process pool with the spawn start method,
so nothing of the collecting process (plugins, compile threads, allocator state) leaks into timing.
A worker that dies (the kernel's OOM killer, a segfault in an extension) is a result for its tasks,
not the end of the session.

Two layouts of arms over processes:
- `interleaved`: every process loads both arms and times them in random A/B block pairs (the default;
  the unit of the statistics is the process).
- `abba`: each process loads one arm, in the order A B B A A B B A ... (for arms that cannot share a
  process, e.g. two git revisions of the same package); the unit is a pair of neighbouring processes.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from cbsite.collector.clean_worker import spawn_pool
from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task
from cbsite.collector.session.worker import ProcessResult, run_process

LAYOUTS = ("interleaved", "abba")


@dataclass
class SessionResult:
    session_id: str
    layout: str
    results: list[ProcessResult] = field(default_factory=list)
    died: dict[int, str] = field(default_factory=dict)  # process -> why
    arm_of_process: dict[int, tuple[str, ...]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def samples(self) -> list[dict]:
        return [s for r in self.results for s in r.samples]

    def notes(self, unit: str = "process") -> tuple[dict[tuple[str, str], list[str]], dict[tuple[str, str], list[str]]]:
        """(key, phase) -> the workers' contention notes, and -> their errors, each prefixed with `unit` N."""
        flagged: dict[tuple[str, str], list[str]] = {}
        errors: dict[tuple[str, str], list[str]] = {}
        for result in self.results:
            for where, note in result.flagged.items():
                flagged.setdefault(where, []).append(f"{unit} {result.process}: {note}")
            for where, error in result.errors.items():
                errors.setdefault(where, []).append(f"{unit} {result.process}: {error}")
        return flagged, errors


def abba_order(processes: int, arms: Sequence[str] = ("base", "head")) -> list[str]:
    """A B B A A B B A ...: each arm equally often first, so a linear drift cancels in neighbour pairs."""
    a, b = arms
    pattern = (a, b, b, a)
    return [pattern[i % 4] for i in range(processes)]


def plan_jobs(
    session_id: str, arms: Sequence[ArmSpec], tasks: Sequence[Task], processes: int, layout: str,
    template: ProcessJob | None = None, first_process: int = 1,
) -> list[ProcessJob]:
    """One job per worker process; processes are numbered from `first_process` (0 is the collecting one)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}")
    base = template or ProcessJob(session_id=session_id, process=0, arms=(), tasks=())
    jobs = []
    by_name = {a.arm: a for a in arms}
    names = abba_order(processes, [a.arm for a in arms]) if layout == "abba" and len(arms) == 2 else None
    for i in range(processes):
        chosen = (by_name[names[i]],) if names else tuple(arms)
        jobs.append(replace(base, session_id=session_id, process=first_process + i, arms=chosen, tasks=tuple(tasks)))
    return jobs


def _death(workers: list) -> str:
    """Why a worker died without a Python error, from its exit code where the pool let us see it."""
    for process in workers:
        process.join(timeout=5)
        code = process.exitcode
        if code == -signal.SIGKILL:
            return ("the worker process was killed (SIGKILL): most likely the kernel's OOM killer, as the memory "
                    "limit did not stop it first; give a smaller batch or a lower --memory-limit")
        if code is not None and code < 0:
            return f"the worker process died of signal {signal.Signals(-code).name} (a crash in native code)"
    return "the worker process died without a Python error (killed: out of memory, or a crash in native code)"


def run_jobs(
    jobs: Sequence[ProcessJob],
    layout: str = "interleaved",
    on_done: Callable[[int, int, float], None] = lambda done, total, elapsed: None,
) -> SessionResult:
    """Run each job in its own fresh process, one at a time; a dead worker is recorded, never fatal."""
    started = time.perf_counter()
    session = SessionResult(session_id=jobs[0].session_id if jobs else "", layout=layout)
    for done, job in enumerate(jobs, 1):
        session.arm_of_process[job.process] = tuple(a.arm for a in job.arms)
        workers: list = []
        try:
            with spawn_pool(1) as pool:  # the worker dies with this process (clean_worker.die_with_parent)
                future = pool.submit(run_process, job)
                workers = list((getattr(pool, "_processes", None) or {}).values())  # to read how one died
                session.results.append(future.result())
        except BrokenProcessPool:
            session.died[job.process] = _death(workers)
        except Exception as exc:  # noqa: BLE001 - building the arms failed in the worker: record it
            session.died[job.process] = f"{type(exc).__name__}: {exc}"
        on_done(done, len(jobs), time.perf_counter() - started)
    session.wall_s = time.perf_counter() - started
    return session
