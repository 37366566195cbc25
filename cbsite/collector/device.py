"""Peak FLOP/s and bandwidth: the denominators of MFU and bandwidth utilisation, and where each came from.

GPU peaks come from a table of dense (not sparsity) datasheet figures and can be overridden. A CPU has
no trustworthy datasheet figure for the cores a process actually gets, so its peaks are calibrated here:
the best of several matmul shapes (one shape alone is beaten by some components) and a large copy,
repeated (best of repeats) in a fresh spawned worker with the run's intra-op thread count, so that
no plugin, compiler or thread pool of the collecting process weighs on it. `peaks.check_peaks`
calibrates again at the end of the run and on the shapes of any component that beats the peak.

The worker is `clean_worker.kept_worker`'s (no torch there: `cbsite collect` starts it before its own imports).
A collection starts its start calibration before it builds the model (`start_calibration`): the calibration
runs while the collecting process builds the model and takes its census, on the cores that process leaves
free, instead of after them (benchmarks/calibration_overlap.py measures the peaks beside a build and alone).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Sequence

import torch
from torch.utils.benchmark import Timer

from cbsite.collector.clean_worker import (
    WORKER_TIMEOUT_S,
    _kept,
    _main_not_reimported,
    drop_kept,
    in_clean_worker,
    take_first,
)
from cbsite.collector.cpu_plan import (
    CALIBRATION_JOB,
    CALIBRATION_MIN_RUN_TIME,
    CALIBRATION_REPEATS,
    COPY_BYTES,
    END_CALIBRATION_REPEATS,
    LATER_PASS_SHAPES,
    MATMUL_SHAPES,
    calibration_args,
    free_cores,
)
from cbsite.collector.timing.contention import WaitProbe

# Dense peak FLOP/s per dtype and peak memory bandwidth (bytes/s), SXM parts, from vendor datasheets.
# float32 means plain FP32 (no TF32); "tf32" is listed separately for matmuls that use it.
GPU_PEAKS: dict[str, dict[str, Any]] = {
    "V100": {"flops": {"float32": 15.7e12, "float16": 125e12}, "bandwidth": 900e9},
    "A100": {"flops": {"float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12}, "bandwidth": 2039e9},
    "H100": {"flops": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1978.9e12}, "bandwidth": 3.35e12},
    "H200": {"flops": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12, "float8": 1978.9e12}, "bandwidth": 4.8e12},
    "B200": {"flops": {"float32": 80e12, "tf32": 1.1e15, "bfloat16": 2.25e15, "float16": 2.25e15, "float8": 4.5e15}, "bandwidth": 8e12},
}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibrate_once(dtype: torch.dtype, num_threads: int, min_run_time: float = CALIBRATION_MIN_RUN_TIME,
                   shapes: Sequence[Sequence[int]] = MATMUL_SHAPES,
                   copy_buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, Any]:
    """One calibration pass on this process's threads: the best matmul FLOP/s over the shapes, and the copy bandwidth.

    Also every shape's rate (`rates`, so later passes can take the best shapes) and how long this process's threads
    waited for a CPU during the pass (`waited_s`, contention.py: a pass that waited measured a neighbour too).
    `copy_buffers`: the copy's source and destination, when the caller keeps them between passes.
    """
    probe = WaitProbe()
    probe.start()
    started = time.perf_counter()
    rates = []
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        t = Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}, num_threads=num_threads)
        rates.append([m, k, n, 2 * m * k * n / t.blocked_autorange(min_run_time=min_run_time).median])
    best = max(rates, key=lambda r: r[3], default=None)
    src, dst = copy_buffers or _copy_buffers()
    t = Timer("dst.copy_(src)", globals={"src": src, "dst": dst}, num_threads=num_threads)
    bandwidth = 2 * COPY_BYTES / t.blocked_autorange(min_run_time=min_run_time).median  # read + write
    return {"flops": best[3] if best else 0.0, "bandwidth": bandwidth, "best_matmul_shape": best[:3] if best else None,
            "rates": rates, "waited_s": round(probe.stop(time.perf_counter() - started), 4)}


def _copy_buffers() -> tuple[torch.Tensor, torch.Tensor]:
    """The copy's source (filled, so its pages exist: a read of untouched pages reads the one zero page) and
    destination, COPY_BYTES each, far past any cache. The destination is left untouched: the copy's first run, Timer's
    block-size estimate, which no block includes, makes its pages; a fill before it was one more pass over COPY_BYTES."""
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32).fill_(1.0)
    return src, torch.empty_like(src)


def best_shapes(first_pass: dict[str, Any], count: int = LATER_PASS_SHAPES) -> list[list[int]]:
    """The first pass's `count` fastest matmul shapes, fastest first: what the later passes time."""
    ranked = sorted(first_pass["rates"], key=lambda r: -r[3])
    return [list(r[:3]) for r in ranked[:count]]


def _calibrate_repeats(dtype_name: str, num_threads: int, repeats: int, min_run_time: float,
                       shapes: Sequence[Sequence[int]] = MATMUL_SHAPES) -> list[dict[str, Any]]:
    """The worker's job (module level, so a spawned process can import it): `repeats` passes in a row.

    The first pass times every shape; the later ones its fastest two only (two of the five default shapes). The peak
    is the best of the passes; benchmarks/calibration_overlap.py compares it with the best of every shape in every
    pass."""
    dtype = getattr(torch, dtype_name)
    torch.set_num_threads(num_threads)
    buffers = _copy_buffers()  # allocated once: their page faults are not the copy's work
    passes = [calibrate_once(dtype, num_threads, min_run_time, shapes, buffers)]
    for _ in range(repeats - 1):
        passes.append(calibrate_once(dtype, num_threads, min_run_time, best_shapes(passes[0]), buffers))
    return passes


@dataclasses.dataclass
class _Early:
    """A start calibration submitted to the kept worker before the model was built."""

    pool: ProcessPoolExecutor  # the kept worker that runs it: taken only from that worker
    args: tuple[Any, ...]
    future: Future
    submitted: float  # time.perf_counter() at submission


_early: _Early | None = None  # the one started calibration not yet taken


def start_calibration(dtype: torch.dtype, num_threads: int, min_run_time: float = CALIBRATION_MIN_RUN_TIME,
                      shapes: Sequence[Sequence[int]] = MATMUL_SHAPES) -> int | None:
    """Start the run's start calibration now, in the kept worker, so that it runs while this process builds the
    model and takes its census (untimed work); `calibrate_cpu` with the same arguments then waits for it instead of
    starting another.

    Only inside a `kept_worker()` block and where the calibration's threads leave this process a core of its own:
    the calibration must not wait for a CPU, and this process must not take one from it. Returns the threads this
    process may use until the calibration is taken (the caller builds the model with them), or None when the
    calibration was not started (it then runs when `calibrate_cpu` is called, as before).
    """
    global _early
    left = free_cores() - num_threads
    if not _kept or left < 1:
        return None
    pool = _kept[-1]
    args = calibration_args(str(dtype).replace("torch.", ""), num_threads, CALIBRATION_REPEATS, min_run_time, shapes)
    # `cbsite collect` may have handed this very job to the worker as it started (cpu_plan.start_job): it has run
    # since, beside the command's imports, and is taken as it stands.
    begun = take_first(pool, CALIBRATION_JOB, args)
    if begun is not None:
        future, submitted = begun
    else:
        try:
            with _main_not_reimported():
                future = pool.submit(_calibrate_repeats, *args)
        except Exception:  # noqa: BLE001 - a broken worker: calibrate_cpu starts over when it is called
            return None
        submitted = time.perf_counter()
    _early = _Early(pool, args, future, submitted)  # one at a time: an older one's worker is gone or busy
    return left


def start_calibration_running() -> bool:
    """Is a started calibration still running in the clean worker (the caller would wait for it)?"""
    return _early is not None and not _early.future.done()


def _take_early(args: tuple[Any, ...]) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The passes of a started calibration with these arguments, and how it overlapped; None when there is none
    (or it failed: the caller then calibrates as if none had been started)."""
    global _early
    kept = _kept[-1] if _kept else None
    early, _early = _early, None  # taken once, or dropped when it is not this call's
    if early is None or kept is None or early.pool is not kept or early.args != args:
        return None
    asked = time.perf_counter()
    try:
        passes = early.future.result(timeout=max(1.0, WORKER_TIMEOUT_S - (asked - early.submitted)))
    except Exception:  # noqa: BLE001 - a broken or hung worker is not used again; the caller calibrates afresh
        drop_kept(kept)
        return None
    waited = time.perf_counter() - asked
    return passes, {"started_early": True, "ran_beside_setup_s": round(asked - early.submitted, 3),
                    "waited_for_s": round(waited, 3)}


def calibrate_cpu(
    dtype: torch.dtype,
    num_threads: int,
    min_run_time: float = CALIBRATION_MIN_RUN_TIME,
    *,
    repeats: int = CALIBRATION_REPEATS,
    clean: bool = True,
    shapes: Sequence[Sequence[int]] = MATMUL_SHAPES,
) -> dict[str, Any]:
    """Calibrate the CPU peaks: `repeats` passes in a clean spawned worker with `num_threads` intra-op threads.

    The peaks are the best of the repeats; every repeat is recorded. Never cached: each collection
    calibrates for itself, before its plugins start (a process that has compiled is no clean state).
    `shapes`: the matmul shapes to try (the end of a run times the start's best one only).
    """
    started = time.perf_counter()
    args = calibration_args(str(dtype).replace("torch.", ""), num_threads, repeats, min_run_time, shapes)
    early = _take_early(args) if clean else None
    overlap: dict[str, Any] = {}
    if early is not None:
        (passes, overlap), method = early, "clean worker (spawn)"
    elif clean:
        passes, method = in_clean_worker(_calibrate_repeats, *args)
    else:
        passes, method = _calibrate_repeats(*args), "in-process"
    best = max(passes, key=lambda p: p["flops"])
    return {
        "flops": best["flops"],
        "bandwidth": max(p["bandwidth"] for p in passes),
        "detail": {
            "method": method,
            "best_matmul_shape": best["best_matmul_shape"],
            "matmul_shapes": [list(x) for x in shapes],
            "repeats": [{k: p[k] for k in ("flops", "bandwidth", "best_matmul_shape", "rates", "waited_s")}
                        for p in passes],
            "seconds": round(time.perf_counter() - started, 3),
            **overlap,
        },
    }


def calibration_setup(num_threads: int) -> dict[str, Any]:
    """What every calibration of a run shares (recorded once, beside its start and end)."""
    return {
        "matmul_shapes": [list(s) for s in MATMUL_SHAPES],
        "copy_bytes": COPY_BYTES,
        "num_threads": num_threads,
        "repeats": CALIBRATION_REPEATS,
        "end_repeats": END_CALIBRATION_REPEATS,
        "min_run_time_s": CALIBRATION_MIN_RUN_TIME,
        "rule": "best of repeats; each repeat is the best matmul over its shapes and one large copy; the first repeat "
                f"times every shape, the later ones the first's {LATER_PASS_SHAPES} fastest; the end of the run times "
                f"the start's best shape only (drift measured on the same work), {END_CALIBRATION_REPEATS} repeats",
        "later_pass_shapes": LATER_PASS_SHAPES,
    }


def describe_device(
    device: torch.device,
    dtype: torch.dtype,
    *,
    peak_flops: float | None = None,
    peak_bandwidth: float | None = None,
    calibrate: bool = True,
) -> dict[str, Any]:
    """The `device` entry of run.json: kind, name, count, peaks per dtype, and the source of each peak."""
    dtype_name = str(dtype).replace("torch.", "")
    num_threads = torch.get_num_threads()
    info: dict[str, Any] = {"kind": device.type, "num_threads": num_threads}
    flops = bandwidth = None
    source: dict[str, str | None] = {"flops": None, "bandwidth": None}
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        info.update(name=name, count=torch.cuda.device_count())
        entry = next((v for k, v in GPU_PEAKS.items() if k in name.upper()), None)
        if entry:
            flops = entry["flops"].get(dtype_name)
            bandwidth = entry["bandwidth"]
            source = {"flops": "table" if flops else None, "bandwidth": "table"}
            info["peak_flops_table"] = entry["flops"]
    else:
        info.update(name=cpu_name(), count=1, cores=os.cpu_count())
        if calibrate:
            cal = calibrate_cpu(dtype, num_threads)
            flops, bandwidth = cal["flops"], cal["bandwidth"]
            source = {"flops": "calibrated", "bandwidth": "calibrated"}
            info["calibration"] = {
                **calibration_setup(num_threads),
                "method": cal["detail"]["method"],  # the start's; the end's is under "end"
                "best_matmul_shape": cal["detail"]["best_matmul_shape"],
                "start": {"flops": cal["flops"], "bandwidth": cal["bandwidth"], **cal["detail"]},
            }
    if peak_flops is not None:
        flops, source["flops"] = float(peak_flops), "given"
    if peak_bandwidth is not None:
        bandwidth, source["bandwidth"] = float(peak_bandwidth), "given"
    try:
        info["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    info.update(
        dtype=dtype_name,
        peak_flops={dtype_name: flops} if flops else {},
        peak_bandwidth=bandwidth,
        peak_source=source,
    )
    return info
