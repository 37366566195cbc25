"""What a CPU collection settles before it imports torch: the cores it may use, its intra-op threads by default, and
the job of its start calibration (device.py runs it), so that `cbsite collect` can hand that job to its calibration
worker the moment the worker starts (clean_worker.kept_worker's `first`), beside the command's own imports. No torch
here."""

from __future__ import annotations

import os
from typing import Any

# Intra-op threads when --threads is not given: one on CPU. Two threads spread more from run to run and stall far
# longer beside busy neighbours (OpenMP barriers waiting for a descheduled thread); benchmarks/threads.py and README
# "Why one thread" have the figures. A user measuring multi-threaded kernels says --threads N.
DEFAULT_CPU_THREADS = 1

MATMUL_SHAPES = ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 512, 2048), (4096, 256, 1024))
COPY_BYTES = 256 * 2**20
CALIBRATION_REPEATS = 3
# The end of the run checks drift on the start's best shape: one pass, not three. The peak is the higher of start and
# end, so fewer passes can only leave the start's standing (benchmarks/collect_scale.py, "calib" column).
END_CALIBRATION_REPEATS = 1
LATER_PASS_SHAPES = 2  # the passes after the first time the first pass's fastest shapes only
CALIBRATION_MIN_RUN_TIME = 0.1  # seconds of timed runs per shape (and for the copy), per repeat

CALIBRATION_JOB = ("cbsite.collector.device", "_calibrate_repeats")  # module and function the worker runs


def calibration_args(dtype_name: str, num_threads: int, repeats: int = CALIBRATION_REPEATS,
                     min_run_time: float = CALIBRATION_MIN_RUN_TIME,
                     shapes: Any = MATMUL_SHAPES) -> tuple[Any, ...]:
    """The arguments of a calibration job: equal arguments are the same calibration (device._take_early compares)."""
    return (dtype_name, num_threads, repeats, min_run_time, [list(x) for x in shapes])


def usable_cores() -> list[int]:
    """The cores this process may run on: its affinity, not the machine's count."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def free_cores() -> int:
    """How many cores this process may run on (usable_cores)."""
    return len(usable_cores())


def start_job(dtype_name: str, num_threads: int) -> tuple[str, str, tuple[Any, ...]] | None:
    """The start calibration of a collection on `num_threads` threads in `dtype_name`, as (module, function,
    arguments) for kept_worker's `first`; None where it would not leave this process a core of its own, the rule of
    device.start_calibration (the calibration must not wait for a CPU, nor this process take one from it)."""
    if free_cores() - num_threads < 1:
        return None
    return (*CALIBRATION_JOB, calibration_args(dtype_name, num_threads))
