"""Executors of a study: where the points of a sweep run. Each point collects and saves its own run.

* **local**: a `concurrent.futures.ProcessPoolExecutor` with the spawn start method. Each worker pins
  itself (`os.sched_setaffinity`) to an exclusive set of the cores this process may use, the sets
  cut evenly, and sets torch's intra-op threads to match, so two points never share a core and one
  point's timing is not the other's contention. With CUDA devices, worker i also sees only device
  i modulo their count (`CUDA_VISIBLE_DEVICES`, set before torch is imported in the worker).
* **submitit**: `submitit.AutoExecutor`: a Slurm job array on a cluster (`map_array`), submitit's
  local or debug executor elsewhere (`--executor-option cluster=local|debug`). Slurm places the cores
  (`cpus_per_task`); the point uses as many threads as it is given.
* **ray**: imported only when chosen; one task per point with `num_cpus` = cores per point.

A point never raises into the driver: a Python error becomes a `failed` result with its message; a
worker that dies (a crash, out of memory) fails the points it held, and the driver records that too.
Every point saves its run atomically with `Run.save`, so nothing is merged afterwards.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from cbsite.collector.cpu_plan import usable_cores
from cbsite.errors import CbsiteError

EXECUTORS = ("local", "submitit", "ray")


@dataclass(frozen=True)
class PointJob:
    """One point: what to collect (a CollectRequest), where to save it, and run.json's `study`."""

    label: str
    request: Any  # cbsite.collector.request.CollectRequest
    root: str
    study: dict[str, Any] = field(default_factory=dict)
    cores: tuple[int, ...] | None = None  # pin to these (None: as given by the executor)
    threads: int | None = None  # torch intra-op threads (None: one per core it may use)
    # The sweep's own process where it is not the point's parent (submitit's local executor: a controller between
    # them): the point ends when it is gone. The local pool's workers die with their parent anyway.
    driver: int | None = None


def _pin(cores: Sequence[int] | None) -> list[int]:
    """Pin this process to `cores` and return the cores it may use."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    return usable_cores()


def run_point(job: PointJob) -> dict[str, Any]:
    """Collect and save one point (top level, picklable). Returns its result; never raises for the point's errors."""
    started = time.perf_counter()
    result: dict[str, Any] = {"label": job.label, "pid": os.getpid()}
    from cbsite.collector.clean_worker import launcher_alive, watch_driver

    if job.driver is not None and job.driver != os.getpid():
        watch_driver(job.driver)
    try:
        cores = _pin(job.cores)
        import torch

        if job.request.config.num_threads is None:
            torch.set_num_threads(max(1, job.threads or len(cores)))
        result.update(affinity=cores, threads=torch.get_num_threads())
        from cbsite.archive import staging_dir
        from cbsite.collector.collect import collect
        from cbsite.collector.plugins.runner import staging_in

        with staging_in(staging_dir(job.root)):
            run = collect(job.request)
        run.meta["study"] = dict(job.study)
        if not launcher_alive():  # the sweep was killed while this point measured: nothing goes into the archive
            os._exit(0)
        path = run.save(job.root)
        result.update(status="done", run_id=run.run_id, path=str(path), error=None)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:2000],
                      traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:])
    result["wall_s"] = round(time.perf_counter() - started, 3)
    return result


def core_sets(workers: int, available: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """`workers` disjoint, equal sets of the available cores (the remainder left idle)."""
    cores = sorted(available) if available is not None else usable_cores()
    if workers < 1:
        raise CbsiteError(f"--workers must be at least 1, got {workers}")
    per = len(cores) // workers
    if per < 1:
        raise CbsiteError(f"--workers {workers} is more than the {len(cores)} cores this process may use: "
                          f"each worker needs cores of its own (use --workers {len(cores)} or fewer)")
    return [tuple(cores[i * per:(i + 1) * per]) for i in range(workers)]


# --- local: a pinned process pool -----------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(slots: Any, pin: bool) -> None:
    """Pool initializer (runs before any task, before torch is imported): take a slot, pin, pick a device."""
    cores, device = slots.get()
    _WORKER.update(cores=cores, device=device, pinned=pin)
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    if pin:
        _pin(cores)
    threads = str(len(cores))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads


def _run_in_worker(job: PointJob) -> dict[str, Any]:
    cores = _WORKER["cores"]
    # Unpinned (a benchmark's control): the same thread count, placed wherever the kernel likes.
    result = run_point(replace(job, cores=cores if _WORKER["pinned"] else None, threads=len(cores)))
    result["device_index"] = _WORKER.get("device")
    return result


def _cuda_devices() -> int:
    """CUDA devices visible here, without initialising CUDA in the driver (nvidia-smi's count)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.splitlines() if line.startswith("GPU ")])


def run_local(jobs: Sequence[PointJob], workers: int, on_result: Callable[[dict[str, Any]], None],
              on_start: Callable[[str], None] = lambda label: None, pin: bool = True,
              cuda: bool = False) -> dict[str, Any]:
    """Run the points on `workers` pinned spawn processes; `on_result` is called in the driver as each ends."""
    import concurrent.futures
    import multiprocessing

    from cbsite.collector.clean_worker import spawn_pool

    sets = core_sets(workers)
    devices = _cuda_devices() if cuda else 0
    ctx = multiprocessing.get_context("spawn")
    slots = ctx.Queue()
    for i, cores in enumerate(sets):
        slots.put((cores, i % devices if devices else None))
    info = {"executor": "local", "workers": workers, "pinned": pin, "core_sets": [list(s) for s in sets],
            "devices": devices or None}
    # Workers die with this process (clean_worker.die_with_parent): an orphaned point would go on collecting and saving.
    with spawn_pool(workers, initializer=_init_worker, initargs=(slots, pin)) as pool:
        futures = {}
        for job in jobs:
            futures[pool.submit(_run_in_worker, job)] = job
            on_start(job.label)
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - the worker died (crash, out of memory, killed)
                result = {"label": job.label, "status": "failed",
                          "error": f"the worker process died ({type(exc).__name__}: {exc}); run the sweep again to retry"}
            on_result(result)
    return info


# --- submitit: Slurm job arrays, or its local/debug executors ------------------------------------


def run_submitit(jobs: Sequence[PointJob], workers: int, on_result: Callable[[dict[str, Any]], None],
                 folder: Path, options: Mapping[str, Any] | None = None,
                 on_start: Callable[[str], None] = lambda label: None) -> dict[str, Any]:
    """Submit the points as one job array (`map_array`) and record each as it ends."""
    try:
        import submitit
    except ImportError as exc:
        raise CbsiteError("--executor submitit needs submitit: pip install 'cbsite[collect]' or pip install submitit") from exc
    options = dict(options or {})
    cluster = options.pop("cluster", None)
    executor = submitit.AutoExecutor(folder=str(folder / "%j"), cluster=cluster)
    params = {"timeout_min": 60, "slurm_array_parallelism": workers, **options}
    try:
        executor.update_parameters(**params)
    except (TypeError, ValueError) as exc:
        raise CbsiteError(f"--executor-option: {exc}") from exc
    if executor.cluster == "local":  # a controller process sits between this driver and each point
        jobs = [replace(job, driver=os.getpid()) for job in jobs]
    submitted = executor.map_array(run_point, list(jobs))
    for job in jobs:
        on_start(job.label)
    pending = dict(zip(submitted, jobs))
    while pending:
        finished = [j for j in pending if j.done()]
        if not finished:
            time.sleep(0.5)
            continue
        for handle in finished:
            job = pending.pop(handle)
            try:
                result = handle.result()
            except Exception as exc:  # noqa: BLE001 - the job itself failed (killed, timed out, crashed)
                last = str(exc).strip().splitlines()[-1][:500] if str(exc).strip() else type(exc).__name__
                result = {"label": job.label, "status": "failed", "error": f"submitit job {handle.job_id} failed: {last}"}
            result["job_id"] = str(handle.job_id)
            on_result(result)
    return {"executor": "submitit", "cluster": executor.cluster, "workers": workers, "parameters": params,
            "folder": str(folder)}


# --- ray (optional) ----------------------------------------------------------------------------------


def run_ray(jobs: Sequence[PointJob], workers: int, on_result: Callable[[dict[str, Any]], None],
            on_start: Callable[[str], None] = lambda label: None) -> dict[str, Any]:
    try:
        import ray
    except ImportError as exc:
        raise CbsiteError("--executor ray needs ray, which is not installed: pip install 'ray>=2.9' "
                          "(or use --executor local or submitit)") from exc
    if not ray.is_initialized():  # a cluster the caller started (ray.init, RAY_ADDRESS) is used as it is
        ray.init()
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // max(1, workers))
    remote = ray.remote(num_cpus=cpus)(run_point)
    # Ray reserves `cpus` for a task but leaves the process free to use every core: torch gets as many threads.
    refs = {remote.remote(replace(job, threads=job.threads or cpus)): job for job in jobs}
    for job in jobs:
        on_start(job.label)
    waiting = list(refs)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        for ref in done:
            job = refs[ref]
            try:
                result = ray.get(ref)
            except Exception as exc:  # noqa: BLE001
                result = {"label": job.label, "status": "failed", "error": f"ray task failed: {type(exc).__name__}: {exc}"[:2000]}
            on_result(result)
    return {"executor": "ray", "workers": workers, "cpus_per_point": cpus}


def run_jobs(executor: str, jobs: Sequence[PointJob], workers: int, on_result: Callable[[dict[str, Any]], None], *,
             folder: Path, options: Mapping[str, Any] | None = None, pin: bool = True,
             on_start: Callable[[str], None] = lambda label: None) -> dict[str, Any]:
    """Run `jobs` on the named executor; returns what study.json records of the executor."""
    if executor not in EXECUTORS:
        raise CbsiteError(f"--executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if not jobs:
        return {"executor": executor, "workers": workers}
    if executor == "local":
        if options:
            raise CbsiteError("--executor-option is for submitit (and ray): the local executor takes --workers only")
        cuda = any(str(j.request.config.device).startswith("cuda") for j in jobs)
        return run_local(jobs, workers, on_result, on_start, pin=pin, cuda=cuda)
    if executor == "submitit":
        return run_submitit(jobs, workers, on_result, folder, options, on_start)
    return run_ray(jobs, workers, on_result, on_start)


def iter_jobs(study: Any, points: Iterable[Any], root: str | os.PathLike[str], request: Any) -> list[PointJob]:
    """One PointJob per point: the request with the point's options, its label as version and its tags."""
    out = []
    for p in points:
        req = replace(request, options=study.options_of(p), model_name=study.model, version=p.label,
                      tags=tuple(request.tags) + study.tags(p))
        out.append(PointJob(label=p.label, request=req, root=str(root), study=study.run_meta(p)))
    return out


# --- the driver: a sweep from its study, its record kept as points end -------------------------------


def run_sweep(study: Any, selected: Sequence[Any], root: str | os.PathLike[str], request: Any, *, executor: str = "local",
              workers: int = 1, options: Mapping[str, Any] | None = None, pin: bool = True, expression: str | None = None,
              say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Run the selected points that are not done yet; keep `<root>/_studies/<name>/study.json` up to date.

    Returns the final record. Points already in the archive for this study are skipped (resume);
    a failing point is recorded with its error and the others go on.
    """
    from cbsite import study as cstudy

    done = cstudy.done_points(root, study)
    settings = {"executor": executor, "workers": workers, "pin": pin, "executor_options": dict(options or {}),
                "selection": expression, "request": _request_record(request)}
    previous = cstudy.read_record(root, study.name)
    record = cstudy.new_record(study, selected, done, settings, previous)
    todo = [p for p in selected if p.label not in done]
    skipped = len([p for p in selected if p.label in done])
    say(f"{study.describe()}; {len(selected)} selected, {skipped} already done, {len(todo)} to run "
        f"on {executor} with {workers} worker{'s' * (workers != 1)}")
    if not todo:
        # Nothing ran: the record is rewritten only where the archive says something new (a point's run appeared
        # or went), never to restamp it; the last sweep's executor and timing stay those of the sweep that ran.
        if previous is not None and not cstudy.changes_anything(previous, record):
            return previous
        cstudy.write_record(root, record)
        return record
    for p in todo:
        cstudy.update_point(record, p.label, status="pending", error=None)
    cstudy.write_record(root, record)
    total, finished = len(todo), 0
    started = time.perf_counter()

    def on_start(label: str) -> None:
        entry = next(e for e in record["points"] if e["label"] == label)
        cstudy.update_point(record, label, status="running", attempts=int(entry.get("attempts") or 0) + 1)

    def on_result(result: dict[str, Any]) -> None:
        nonlocal finished
        finished += 1
        label = result["label"]
        cstudy.update_point(record, label, status=result.get("status", "failed"), run_id=result.get("run_id"),
                            path=result.get("path"), error=result.get("error"), wall_s=result.get("wall_s"),
                            affinity=result.get("affinity"), threads=result.get("threads"), job_id=result.get("job_id"))
        cstudy.write_record(root, record)
        tail = f"saved {result.get('path')}" if result.get("status") == "done" else f"FAILED: {result.get('error')}"
        say(f"[{finished}/{total}] {label}: {tail} ({result.get('wall_s') or 0:.1f} s)")

    info = run_jobs(executor, iter_jobs(study, todo, root, request), workers, on_result,
                    folder=cstudy.folder(root, study.name) / "submitit", options=options, pin=pin, on_start=on_start)
    record["executor"] = info
    record["last_sweep_s"] = round(time.perf_counter() - started, 3)
    cstudy.write_record(root, record)
    return record


def _request_record(request: Any) -> dict[str, Any]:
    """What study.json says of the collect settings shared by every point (JSON values only)."""
    import dataclasses
    import json

    def plain(value: Any) -> Any:
        try:
            json.dumps(value)
            return value
        except (TypeError, ValueError):
            return repr(value)

    config = {k: plain(v) for k, v in dataclasses.asdict(request.config).items()}
    return {"batches": request.batches, "seed": request.seed, "preprocessing": plain(dataclasses.asdict(request.preprocessing)),
            "config": config, "tags": list(request.tags), "notes": request.notes}
