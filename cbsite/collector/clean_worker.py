"""One clean spawned worker process for a collection's calibration jobs (device.py), shared by every job of a
`kept_worker()` block.

No torch here: `cbsite collect` starts the worker before it imports torch and the collector, so that the worker's
interpreter and torch import run beside the command's own imports. The worker imports torch as soon as it starts
(`_ready`), and runs nothing but the jobs it is given, so it stays as clean as a fresh process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable

WORKER_TIMEOUT_S = 300.0
WATCH_EVERY_S = 1.0  # how often a worker checks that the process that started it is still there


def _refuse_in_bootstrap() -> None:
    """A spawned worker imports the caller's main script: a profiling call at its top level must not run there."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "cbsite was asked to profile while a spawned worker imported the main script; "
            "put the profiling call under `if __name__ == \"__main__\":`"
        )


@contextlib.contextmanager
def _main_not_reimported():
    """While a spawned worker starts, hide the main script from it (spawn would import it again).

    The worker only runs cbsite functions, so it needs nothing from the caller's script; importing it
    again would run an unguarded script's top level (building its model) in the worker. The main
    module's `__spec__` and `__file__` are restored as soon as the worker has started.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


_kept: list[ProcessPoolExecutor] = []  # the worker a `kept_worker()` block shares, innermost last
# The job a kept worker was handed as it started (kept_worker's `first`), until taken: its pool -> ((module, function),
# arguments, future, when it was submitted).
_first: dict[ProcessPoolExecutor, tuple[tuple[str, str], tuple[Any, ...], Future, float]] = {}


def _ready() -> bool:
    """A kept worker's first job: importing torch, so that the first calibration finds it imported."""
    import torch  # noqa: F401 - imported for its side effect: the worker's torch import happens now

    return True


def _run_named(module: str, name: str, args: tuple[Any, ...]) -> Any:
    """`module.name(*args)`, imported in the worker: the caller names a job without importing what it needs (torch)."""
    import importlib

    return getattr(importlib.import_module(module), name)(*args)


def take_first(pool: ProcessPoolExecutor, job: tuple[str, str], args: tuple[Any, ...]) -> tuple[Future, float] | None:
    """The future of the job `pool` was handed as it started (kept_worker's `first`) and when it was submitted, where
    that job is `job` (module, function) with `args`; taken once. None otherwise: a job that was not asked for
    still runs, and the worker's next job waits for it."""
    begun = _first.pop(pool, None)
    if begun is None or begun[0] != tuple(job) or begun[1] != args:
        return None
    return begun[2], begun[3]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Shut a worker pool down without waiting for a job that may hang (a timed-out worker is killed)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PARENT: dict[str, int] = {}  # this worker's launcher: "pid" its parent (die_with_parent), "driver" a sweep (watch_driver)


def _exit_with(parent: int) -> None:
    """The worker's watch on the process that started it: a parent killed outright (SIGKILL, the OOM killer) cannot
    stop its worker, which would otherwise wait for jobs (or go on measuring) for ever, holding the pipes it inherited."""
    while True:
        if not parent_alive(parent):
            os._exit(0)
        time.sleep(WATCH_EVERY_S)


def parent_alive(parent: int | None = None) -> bool:
    """Is the process that started this one still its parent? (An orphan is re-parented: its getppid changes.)
    `parent`: the pid to expect (default: the one `die_with_parent` recorded, else any parent but init)."""
    expected = parent if parent is not None else _PARENT.get("pid")
    return os.getppid() == expected if expected is not None else os.getppid() != 1


def process_alive(pid: int) -> bool:
    """Is process `pid` still running (not gone, not a zombie)? For a driver that is not this process's parent
    (submitit's local executor starts points from a controller process of its own)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def watch_driver(pid: int) -> None:
    """End this process once `pid` (the driver of a sweep, not its parent) is gone: one check a second."""
    def watch() -> None:
        while process_alive(pid):
            time.sleep(WATCH_EVERY_S)
        os._exit(0)

    _PARENT.setdefault("driver", pid)
    threading.Thread(target=watch, daemon=True, name="cbsite-driver-watch").start()


def launcher_alive() -> bool:
    """Is whatever started this worker still there: its parent (`die_with_parent`) and the driver (`watch_driver`)?
    Checked right before a worker publishes a run: a run saved for a sweep that was killed is a run nobody asked for."""
    driver = _PARENT.get("driver")
    return ("pid" not in _PARENT or parent_alive()) and (driver is None or process_alive(driver))


def die_with_parent(parent: int, spawned_in_main_thread: bool = True) -> None:
    """Make this (spawned) worker die with `parent`, the process that started it: every worker cbsite spawns runs this
    first (`spawn_pool`). On Linux the kernel kills it the moment its parent dies (`PR_SET_PDEATHSIG`, SIGKILL); a
    daemon thread also checks once a second that the parent is still there, for platforms without prctl.

    The kernel's signal follows the parent's *thread* that spawned the worker, so it is asked for only where that was
    the main thread (a worker spawned from a thread that ends first would be killed while its parent lives)."""
    _PARENT["pid"] = parent
    if spawned_in_main_thread and sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the watch thread alone
            pass
    if not parent_alive(parent):  # the parent died before the kernel was asked
        os._exit(0)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="cbsite-parent-watch").start()


def _initialise(parent: int, main: bool, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
    die_with_parent(parent, main)
    if initializer is not None:
        initializer(*initargs)


def spawn_pool(max_workers: int = 1, initializer: Callable[..., Any] | None = None,
               initargs: tuple[Any, ...] = ()) -> ProcessPoolExecutor:
    """A spawn process pool whose workers die with this process (`die_with_parent`), then run `initializer`: the one
    way cbsite starts workers (calibration, compare and rounds sessions, sweep points, the step's worker)."""
    main = threading.current_thread() is threading.main_thread()
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_initialise, initargs=(os.getpid(), main, initializer, tuple(initargs)))


def _spawn_pool() -> ProcessPoolExecutor:
    return spawn_pool(1)


@contextlib.contextmanager
def kept_worker(start_now: bool = False, first: tuple[str, str, tuple[Any, ...]] | None = None):
    """One clean worker for every `in_clean_worker` job inside the block (the start and end calibrations,
    re-calibrations on component shapes), instead of a fresh process each: its interpreter and torch import
    are paid once per collection (the two calibrations took about 10 s before, 6 s after, in
    benchmarks/collect_scale.py). It runs nothing but calibration jobs, so it stays as clean as a fresh one;
    between jobs it sleeps on a pipe. With `start_now` it starts at once, so its start overlaps the caller's
    own setup (building the model). `first` (module, function, arguments): a job it starts as soon as torch is
    imported (implies `start_now`), which a caller takes with `take_first` (`cbsite collect`'s start calibration:
    it then runs beside the command's own imports too, not only beside the model's build). A nested block shares the
    outer block's worker."""
    if _kept:
        yield
        return
    _refuse_in_bootstrap()
    pool = _spawn_pool()
    _kept.append(pool)
    try:
        if start_now or first is not None:
            with _main_not_reimported():  # the worker process starts inside submit()
                pool.submit(_ready)
                if first is not None:
                    module, name, args = first
                    _first[pool] = ((module, name), args, pool.submit(_run_named, module, name, args), time.perf_counter())
        yield
    finally:
        _first.pop(pool, None)
        if pool in _kept:
            _kept.remove(pool)
        _stop(pool)


def in_clean_worker(fn: Callable[..., Any], *args: Any, timeout: float = WORKER_TIMEOUT_S) -> tuple[Any, str]:
    """Run `fn(*args)` in a spawned process (no plugin, compiler or thread pool of this one), or here.

    The process is the kept worker of an enclosing `kept_worker()` block, else a fresh one.
    Returns (result, method): method is "clean worker (spawn)" or "in-process (<why the worker failed>)".
    `fn` must be importable by module and name; its result must pickle.
    """
    _refuse_in_bootstrap()
    kept = _kept[-1] if _kept else None
    try:
        if kept is not None:
            with _main_not_reimported():  # the worker may (re)start inside submit()
                future = kept.submit(fn, *args)
            return future.result(timeout=timeout), "clean worker (spawn)"
        with _spawn_pool() as pool:
            with _main_not_reimported():  # the worker process starts inside submit()
                future = pool.submit(fn, *args)
            return future.result(timeout=timeout), "clean worker (spawn)"
    except Exception as exc:  # noqa: BLE001 - any failure to start or finish the worker falls back to this process
        why = f"{type(exc).__name__}: {exc}".strip().rstrip(":")[:300]
        if kept is not None:
            drop_kept(kept)
    return fn(*args), f"in-process (the clean worker failed: {why})"


def drop_kept(pool: ProcessPoolExecutor) -> None:
    """A broken or hung kept worker is not used again: the next job of its block gets a fresh one."""
    if pool in _kept:
        _kept.remove(pool)
        _stop(pool)
