"""What betrays waiting: the time this process's threads spent runnable but not running.

A busy neighbour does not slow a component down, it makes it *wait*: the kernel leaves one of our
threads on a run queue while another process holds the core (with several intra-op threads, one
descheduled OpenMP worker stalls all the others at the next barrier, which is how a 24 us Linear comes
out at 8 ms). Linux counts that wait per thread in `/proc/self/task/<tid>/schedstat` (second field,
nanoseconds), so a timed block can say how much of its wall time was spent waiting, whatever the cause
and however many threads: no load-average guess, no quantisation heuristic.

Where schedstat is missing (not Linux, or a kernel without schedstats), the fallback compares the
calling thread's CPU time with the wall time, which is exact for one intra-op thread and blind to
stalls of the others.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from cbsite.errors import CbsiteError

_TASKS = "/proc/self/task"

# A block is contended when its threads waited for a CPU for more than this share of its wall time,
# plus a small absolute allowance for the kernel's own housekeeping on a quiet machine.
WAIT_SHARE = 0.05
WAIT_ALLOWANCE_S = 50e-6


def _schedstat_available() -> bool:
    try:
        with open(f"{_TASKS}/{os.getpid()}/schedstat") as f:
            return len(f.read().split()) >= 2
    except OSError:
        return False


HAVE_SCHEDSTAT = _schedstat_available()


# Each thread's schedstat file, kept open and read again from its start (two reads per timed block, each of every
# thread: opening them afresh every time was most of what a probe cost). Keyed by this process's pid: a forked child
# has threads of its own.
_open: dict[str, int] = {}
_open_pid = [0]


def _drop(tid: str) -> None:
    try:
        os.close(_open.pop(tid))
    except (KeyError, OSError):
        pass


def run_queue_wait_s() -> float:
    """Seconds every thread of this process has spent waiting on a run queue, since it started."""
    if _open_pid[0] != os.getpid():
        _open.clear()  # a forked child's copies of its parent's descriptors are the parent's threads' files
        _open_pid[0] = os.getpid()
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return 0.0
    for gone in set(_open) - set(tids):
        _drop(gone)
    for tid in tids:
        try:
            fd = _open.get(tid)
            if fd is None:
                fd = _open[tid] = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
            total += int(os.pread(fd, 256, 0).split()[1])
        except (OSError, IndexError, ValueError):
            _drop(tid)  # a thread that ended between listdir and the read
    return total / 1e9


@dataclass
class WaitProbe:
    """Brackets one timed block: `start()` before, `stop(wall_s)` after; returns the waiting seconds."""

    _wait0: float = 0.0
    _cpu0: float = 0.0

    def start(self) -> None:
        self._wait0 = run_queue_wait_s() if HAVE_SCHEDSTAT else 0.0
        self._cpu0 = time.thread_time()

    def stop(self, wall_s: float) -> float:
        if HAVE_SCHEDSTAT:
            return max(0.0, run_queue_wait_s() - self._wait0)
        return max(0.0, wall_s - (time.thread_time() - self._cpu0))


def contended(wait_s: float, wall_s: float) -> bool:
    """Did a block wait for a CPU long enough to distort its time?"""
    return wait_s > WAIT_SHARE * wall_s + WAIT_ALLOWANCE_S


# Seconds per wait for a quiet machine (timing pauses at most 3 times per component and phase). A machine that is
# never quiet (a shared CI runner, a test suite beside its own workers) gains nothing from waiting: 0 never waits.
QUIET_WAIT_ENV = "CBSITE_QUIET_WAIT_S"
QUIET_WAIT_S = 5.0


def quiet_wait_s() -> float:
    """$CBSITE_QUIET_WAIT_S, else 5 s."""
    text = os.environ.get(QUIET_WAIT_ENV, "").strip()
    if not text:
        return QUIET_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise CbsiteError(f"{QUIET_WAIT_ENV}={text!r} is not a number of seconds: set it to 0 or more "
                          f"(0: never wait for a quiet machine), or unset it for {QUIET_WAIT_S:g} s")
    return value


# Under a load that does not go away, every component would spend its three waits in vain (most of a small
# collection's wall beside a busy test suite). After GIVE_UP_AFTER waits in a row that found no quiet,
# the process stops waiting (rows keep their `contended` flags) and tries again RETRY_AFTER_S later.
GIVE_UP_AFTER = 3
RETRY_AFTER_S = 60.0
_busy = {"in_a_row": 0, "last": 0.0}


def wait_for_quiet(max_s: float, probe_s: float = 0.05) -> bool:
    """Sleep-and-probe until a short busy loop of this process no longer waits for a CPU.

    Returns True when the machine looked quiet within `max_s`. The probe spins in Python for `probe_s`
    (one thread), so it asks the scheduler exactly the question the next block will ask. Returns False
    at once while the machine has stayed busy through the last GIVE_UP_AFTER waits (see above).
    """
    if _busy["in_a_row"] >= GIVE_UP_AFTER and time.perf_counter() - _busy["last"] < RETRY_AFTER_S:
        return False
    deadline = time.perf_counter() + max_s
    probe = WaitProbe()
    while True:
        probe.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < probe_s:
            pass
        wall = time.perf_counter() - t0
        if not contended(probe.stop(wall), wall):
            _busy["in_a_row"] = 0
            return True
        if time.perf_counter() >= deadline:
            _busy["in_a_row"] += 1
            _busy["last"] = time.perf_counter()
            return False
        time.sleep(min(0.25, max(0.0, deadline - time.perf_counter())))
