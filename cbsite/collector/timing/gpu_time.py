"""Device time of a statement on a CUDA device: how long the GPU itself works per call, launch gaps left out.

The timed blocks measure wall time. On a GPU a small component's kernels can finish faster than the CPU launches
them (eager mode through autograd costs tens of microseconds per op), and CUDA events around a loop the CPU feeds
then time the launches, not the kernels. Here the stream first runs a sleep kernel long enough for the CPU to queue
the whole loop behind it, so the events around the loop see the kernels back to back. Where the sleep ended before
the loop was queued (a slow host, a statement that waits for the GPU itself, as `.item()` does) the measurement is
taken again behind a longer sleep; one still late is kept and says so (it then includes launch gaps: an upper bound).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

# Statements per measurement: about this much wall time, so that the loop's launches fit the driver's queue (about a
# thousand kernels) and the sleep in front of it stays short.
WINDOW_S = 2e-3
REPEATS = 5  # measurements per statement at most (fewer where they would pass the budget); the median is kept
# The first sleep: this many times the loop's wall time in the blocks (which includes queuing it) plus SLEEP_EXTRA_S,
# at most FIRST_SLEEP_CAP_S (a statement of a second is mostly GPU work: queuing it takes a fraction of that). Later
# ones: twice the longest queuing seen, plus SLEEP_EXTRA_S.
SLEEP_MARGIN = 3.0
SLEEP_EXTRA_S = 5e-4
FIRST_SLEEP_CAP_S = 0.02
RETRIES = 2  # a late measurement is taken again behind a sleep twice as long, this many times at most

_cycles_per_s: float | None = None


@dataclass(frozen=True)
class DeviceTime:
    ms_per_call: float
    late: bool  # the loop was still being queued when the sleep ended: launch gaps are in the figure


def _sleep_cycles_per_s() -> float:
    """GPU clock cycles per second of torch.cuda._sleep, timed once per process."""
    global _cycles_per_s
    if _cycles_per_s is None:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_s = cycles / max(start.elapsed_time(end) / 1e3, 1e-9)
    return _cycles_per_s


def sleep_ahead_allowed() -> bool:
    """False on a rank of a multi-process job: each rank would sleep for its own length, and a collective in the loop
    would wait inside the events for the other ranks' sleeps. There the loop runs as the CPU feeds it."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def device_time(fn: Callable[[], Any], prepare: Callable[[int], None], seconds_per_stmt: float, max_loops: int,
                calls_per_stmt: int, budget_s: float, sleep_ahead: bool = True) -> DeviceTime:
    """Median of the device milliseconds per call of `fn` (which makes `calls_per_stmt` calls) over up to REPEATS
    loops, each queued behind a sleep (with `sleep_ahead`; else as the CPU feeds it: launch gaps included, and the
    result says `late`), within about `budget_s` of statements. `prepare(n)` readies inputs for n statements;
    `seconds_per_stmt`: the statement's wall time in the blocks."""
    loops = max(1, min(max_loops, int(WINDOW_S / max(seconds_per_stmt, 1e-9))))
    repeats = max(1, min(REPEATS, int(budget_s / max(loops * seconds_per_stmt, 1e-9))))
    rate = _sleep_cycles_per_s() if sleep_ahead else 0.0
    sleep_s = min(SLEEP_MARGIN * loops * seconds_per_stmt + SLEEP_EXTRA_S, FIRST_SLEEP_CAP_S) if sleep_ahead else 0.0
    times, any_late = [], False
    for _ in range(repeats):
        for attempt in range(RETRIES + 1):
            prepare(loops)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            if sleep_ahead:
                torch.cuda._sleep(int(rate * sleep_s))
            start.record()
            queuing = time.perf_counter()
            for _ in range(loops):
                fn()
            late = start.query()  # the stream already passed the start: it waited for launches
            queuing = time.perf_counter() - queuing
            end.record()
            end.synchronize()
            sleep_s = max(sleep_s if late else 0.0, 2 * queuing + SLEEP_EXTRA_S)
            if not sleep_ahead:
                late = True  # measured with the launches in it, by design
                break
            if not late or attempt == RETRIES:
                break
            sleep_s *= 2
        any_late |= late
        times.append(start.elapsed_time(end) / loops / calls_per_stmt)
    return DeviceTime(statistics.median(times), any_late)
