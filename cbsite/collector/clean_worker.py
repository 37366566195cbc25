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


def _exit_with(parent: int) -> None:
    """The worker's watch on the process that started it: a parent killed outright (SIGKILL, the OOM killer) cannot
    stop its worker, which would otherwise wait for jobs for ever, holding whatever pipes it inherited."""
    while True:
        time.sleep(WATCH_EVERY_S)
        if os.getppid() != parent:
            os._exit(0)


def _watch_parent() -> None:
    """A worker's initializer: a daemon thread that ends the worker once its parent is gone (one getppid a second)."""
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True, name="cbsite-parent-watch").start()


def _spawn_pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_watch_parent)


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
