"""A sharded model's collection on every rank: discovery, lockstep, local measurement, one run on rank 0.

Run on each rank torchrun started (`cbsite collect ... --distributed`):

1. the provider builds the sharded model (`DistributedModelParallel`); the components are those of the
   model it wraps (`dmp.module`), so paths are the unsharded model's, plus the sharded pieces;
2. a warm-up forward creates the input dists; capture forwards record the pieces' inputs and which
   modules issued collectives; one replay of each piece on every rank shows which pieces communicate;
   every rank's findings are merged (a component that communicates on any rank communicates);
3. the schedule (communicating components x phases) is compared across ranks, then each is measured in
   lockstep (lockstep.py);
4. everything else is measured on each rank alone by the existing collector (`profile_model`, with the
   communicating modules excluded from it and without its whole-model step, which would communicate) and
   by `ComponentMeasurement` for the pieces that do not communicate (lookups);
5. the DMP model's whole step, in lockstep (step.py);
6. rank 0 gathers every rank's rows and writes one run (ranks.py).

A rank that fails or dies makes the others' next collective fail (gloo: the peer closed the connection;
a hang ends at the group's timeout): each rank then says what it saw and which ranks reported a failure
through torchrun's store, and the job ends with no run written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch import nn

from cbsite import archive
from cbsite.collector.capture import moved
from cbsite.collector.config import DTYPES, threads_for
from cbsite.collector.distributed import ranks
from cbsite.collector.distributed.collectives import CollectiveMode, Traffic
from cbsite.collector.distributed.discovery import (
    Captured,
    Piece,
    Resolved,
    capture_pieces,
    pieces,
    promote_grad_buffers,
)
from cbsite.collector.distributed.group import Group
from cbsite.collector.distributed.lockstep import Agreement, LockstepResult, measure
from cbsite.collector.distributed.sharding import planned, same_on_every_rank, with_default_plan
from cbsite.collector.measure import ComponentMeasurement, NothingToDifferentiate, PhaseResult
from cbsite.collector.plan import PlanConfig, component_tree, selected
from cbsite.collector.profiler import profile_model
from cbsite.collector.request import CollectRequest, prepare
from cbsite.collector.timing.blocks import TimingConfig
from cbsite.errors import CbsiteError

FAILED_KEY = "cbsite/failed/"


def _unwrap(model: nn.Module) -> nn.Module:
    from torchrec.distributed.model_parallel import DistributedModelParallel

    if not isinstance(model, DistributedModelParallel):
        raise CbsiteError(
            f"--distributed profiles a sharded model, and the provider gave a {type(model).__name__} with no torchrec "
            "EmbeddingBagCollection to shard: give the built-in providers -o sharding=table_wise (or row_wise, "
            "column_wise, table_row_wise, data_parallel, planner, or a list per table; unset: planner), or return "
            "a model with torchrec tables or torchrec's DistributedModelParallel from your module:function"
        )
    return model.module


class Stage:
    """Where the rank is, for the message when a collective fails."""

    def __init__(self) -> None:
        self.now = "setup"

    @contextlib.contextmanager
    def at(self, what: str) -> Iterator[None]:
        self.now = what
        yield


def _store() -> Any:
    try:
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store, no report: the message says less, nothing breaks
        return None


def _reported(store: Any, world: int, me: int, grace_s: float = 3.0) -> tuple[dict[int, str], list[int]]:
    """(rank -> the failure it reported, ranks that reported nothing) after a short grace period."""
    time.sleep(grace_s)  # a failing rank writes its report before it exits
    reports: dict[int, str] = {}
    for r in range(world):
        if r == me or store is None:
            continue
        try:
            if store.check([f"{FAILED_KEY}{r}"]):
                reports[r] = store.get(f"{FAILED_KEY}{r}").decode(errors="replace")
        except Exception:  # noqa: BLE001 - the store's host may be gone too
            break
    silent = [r for r in range(world) if r != me and r not in reports]
    return reports, silent


def _report(store: Any, rank: int, text: str) -> None:
    if store is not None:
        with contextlib.suppress(Exception):
            store.set(f"{FAILED_KEY}{rank}", text[:500])


@contextlib.contextmanager
def _said_when_stopped(rank: int, stage: Stage) -> Iterator[None]:
    """On SIGTERM, print where this rank was before anything is raised, then do what was installed before.

    torchrun stops the other ranks (SIGTERM) as soon as one fails or is killed. The exception the CLI's
    handler raises lands wherever the main thread is, which can be Python called from C++ that cannot
    unwind (seen in CI: "terminate called after throwing an instance of 'python_error'", SIGABRT), so
    the rank's line must not wait for an except clause to print it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals and may set handlers
        return
    before = signal.getsignal(signal.SIGTERM)
    # The terminal's stderr as it is now: the line must reach it while a profiler has fd 2 silenced for its block
    # (quiet_profiler: a CPU memory measurement is silenced whole) or a plugin has sys.stderr captured (log).
    try:
        terminal: int | None = os.dup(2)
    except OSError:
        terminal = None

    def stopped(signum: int, frame: Any) -> None:
        _say(terminal, f"cbsite: rank {rank}: stopped during {stage.now}: another rank failed or was killed (the "
                       f"launcher's summary names it); no run was written")
        if before is signal.SIG_IGN:
            return
        if callable(before):
            before(signum, frame)  # the CLI's raises its Terminated
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stopped)
    try:
        try:
            yield
        except Exception:
            # The rank's error (a CbsiteError, or a RuntimeError a collective raised in words _is_comm_failure does
            # not know) is on its way to the CLI, which prints it; torchrun's SIGTERM landing before that would
            # replace it with a bare "terminated", so the handler stays to say that no run was written.
            raise
        except BaseException:  # the handler's own KeyboardInterrupt or Terminated: its line is out
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
            raise
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
    finally:
        if terminal is not None and signal.getsignal(signal.SIGTERM) is not stopped:
            os.close(terminal)


def _say(fd: int | None, line: str) -> None:
    """`line` on the terminal's stderr (`fd`, a copy of fd 2 made before any silencing), else on sys.stderr."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    if fd is None:
        print(line, file=sys.stderr, flush=True)
        return
    with contextlib.suppress(OSError):
        os.write(fd, (line + "\n").encode("utf-8", "replace"))


def collect_distributed(request: CollectRequest, group: Group) -> archive.Run | None:
    """Collect a sharded model on this rank; rank 0 returns the merged run (not yet saved), others None."""
    if request.config.rounds > 1:
        raise CbsiteError("--rounds repeats timing in fresh processes, which a sharded run cannot do; leave --rounds at 1")
    stage = Stage()
    store = _store()
    # The handler stays installed while a failure is handled too: a rank that saw a collective fail waits for the
    # others' reports (seconds), and torchrun's SIGTERM lands in that wait when it has seen the other rank die
    # (CI, test_a_killed_rank_ends_the_job_with_its_name_and_no_run: "cbsite: terminated" and nothing else).
    with _said_when_stopped(group.rank, stage):
        try:
            return _collect(request, group, stage)
        except KeyboardInterrupt:
            # The line itself went out from the handler; what the other ranks reported follows it.
            reports, _ = _reported(store, group.world_size, group.rank, grace_s=0.5)
            for r, t in sorted(reports.items()):
                print(f"cbsite: rank {group.rank}: rank {r} reported: {t}", file=sys.stderr, flush=True)
            raise
        except CbsiteError as exc:
            _report(store, group.rank, f"{exc}")
            raise CbsiteError(f"rank {group.rank}: {exc}") from exc
        except (RuntimeError, ConnectionError) as exc:
            if not _is_comm_failure(exc):
                _report(store, group.rank, f"{type(exc).__name__}: {exc}")
                raise
            _report(store, group.rank, f"lost the other ranks during {stage.now}")
            reports, silent = _reported(store, group.world_size, group.rank)
            said = "; ".join(f"rank {r} reported: {t}" for r, t in sorted(reports.items()))
            who = (f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))} stopped without a report (killed or crashed)"
                   if silent else "")
            raise CbsiteError(
                f"rank {group.rank}: a collective failed during {stage.now} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                f"{'; '.join(x for x in (who, said) if x) or 'no other rank reported'}. The job stops; no run was written"
            ) from exc


def _options_entry(request: CollectRequest) -> dict[str, Any]:
    """What every rank must be given alike: the provider and its options, the batches and the collection's settings."""
    from dataclasses import asdict

    config = {k: v for k, v in asdict(request.config).items() if k not in ("progress",)}
    return {"provider": request.provider, "options": request.options, "model": request.model_name,
            "version": request.version, "batches": request.batches, "seed": request.seed,
            "preprocessing": asdict(request.preprocessing), **{f"config.{k}": v for k, v in config.items()}}


def _is_comm_failure(exc: BaseException) -> bool:
    import torch.distributed as dist

    text = str(exc)
    return isinstance(exc, (dist.DistError, ConnectionError)) or any(
        s in text for s in ("Connection closed by peer", "Connection reset", "gloo", "Timed out", "timed out", "NCCL"))


def _collect(request: CollectRequest, group: Group, stage: Stage) -> archive.Run | None:
    started = time.perf_counter()
    request = replace(request, options=with_default_plan(request.provider, request.options))
    config = replace(request.config, device=group.device)
    agree = Agreement()
    with stage.at("comparing the ranks' options"):
        same_on_every_rank("collection options", _options_entry(request))
    with stage.at("building the sharded model"):
        prepared = prepare(replace(request, config=config))
        model, provider = planned(prepared.model, prepared.provider)
        prepared = replace(prepared, model=model, provider=provider)
    inner = _unwrap(prepared.model)
    dtype = DTYPES[config.dtype]
    if dtype != torch.float32:
        raise CbsiteError("--distributed measures float32 models for now (sharded tables keep their own dtype); drop --dtype")
    device = torch.device(group.device)
    batches = [moved(b, device, dtype) for b in prepared.batches]
    grad = "backward" in config.phases
    caller_threads = torch.get_num_threads()
    num_threads = threads_for(config)
    torch.set_num_threads(num_threads)
    try:
        with stage.at("the warm-up forward"), torch.set_grad_enabled(grad):
            inner(*batches[0][0], **batches[0][1])  # torchrec creates the input dists on the first forward
        # Pieces appear under their owner: an owner beyond --max-depth has no row to hang them on.
        found_all = pieces(inner)
        found = [p for p in found_all if _within(p.owner, config.max_depth)]
        left_out = sorted({p.owner for p in found_all} - {p.owner for p in found})
        promote_grad_buffers(found)
        with stage.at("the capture forwards"):
            captured = capture_pieces(inner, found, batches, grad)
        timing = TimingConfig(config.min_run_time, config.warmup, num_threads, config.device,
                              max_component_s=config.max_component_s)
        with stage.at("probing the sharded pieces for collectives"):
            probes = _probe(found, captured, timing)
        comm_pieces = set().union(*agree.gather(sorted(p for p, t in probes.items() if t.communicates)))
        comm_modules = set().union(*agree.gather(sorted(captured.communicating)))
        schedule = _schedule(inner, found, _planned(inner, comm_modules, config), comm_pieces, config.phases)
        with stage.at("comparing the lockstep schedule"):
            verify_schedule(agree, schedule)
        lock_started = time.perf_counter()
        collective_s0 = agree.collective_s
        lockstep: dict[tuple[str, str], LockstepResult | str] = {}
        modules = dict(inner.named_modules())
        by_piece = {p.path: p for p in found}
        for path, phase in schedule:
            with stage.at(f"the lockstep {phase} of {path or '<root>'}"):
                lockstep[(path, phase)] = _lockstep_one(agree, path, phase, modules, by_piece, captured, timing)
        lock_wall = time.perf_counter() - lock_started
        lock_agree = agree.collective_s - collective_s0
        with stage.at("the per-rank measurement"):
            # Peaks given on the command line need no calibration: each rank would calibrate beside the others.
            local_config = replace(config, exclude=tuple(config.exclude) + tuple(_glob_literal(p) for p in sorted(comm_modules)),
                                   step=False, rounds=1, calibrate=config.calibrate and not (config.peak_flops and config.peak_bandwidth),
                                   capture_all_at_once=True)  # every forward communicates: equal forwards on every rank
            run = profile_model(inner, batches, local_config, model_name=prepared.name, version=request.version,
                                provider=prepared.provider, preprocessing=prepared.steps,
                                inputs_description=prepared.inputs_description, tags=request.tags, notes=request.notes)
            local = {(p.path, phase): _local_one(p, phase, captured, timing)
                     for p in found if p.path not in comm_pieces for phase in config.phases}
        step_record, trace = None, None
        if config.step:
            with stage.at("the lockstep training step and eval forward"):
                step_record = _step(agree, prepared.model, batches, config, num_threads)
            if "trace" in config.plugins and grad and (step_record.get("train") or {}).get("status") == "measured":
                from cbsite.collector.distributed.step import trace_step
                from cbsite.collector.step import step_config_for

                with stage.at("tracing the training step"):
                    trace = trace_step(agree, prepared.model, batches, step_config_for(config, num_threads))
        rows, samples = ranks.rank_rows(run, found, comm_modules, comm_pieces, lockstep, local, probes, group.rank)
        record = {
            "rank": group.rank, "wall_s": round(time.perf_counter() - started, 3),
            "lockstep_wall_s": round(lock_wall, 3), "lockstep_agreement_s": round(lock_agree, 3),
            "lockstep_timed_s": round(sum(r.result.timing.timed_s for r in lockstep.values() if not isinstance(r, str)), 3),
            "local_timed_s": run.meta.get("timed_s"), "host": os.uname().nodename, "pid": os.getpid(),
            "threads": num_threads, "step": step_record,
        }
        with stage.at("gathering the ranks' rows on rank 0"):
            gathered = _gather_to_zero(group, (rows, samples, record, trace))
    finally:
        torch.set_num_threads(caller_threads)
    if group.rank != 0:
        return None
    merged = ranks.merged_run(run, gathered, group, schedule, _plan_of(prepared))
    if left_out:
        depth = min(_depth(o) for o in left_out)
        merged.meta["warnings"] = list(merged.meta.get("warnings") or []) + [
            f"--max-depth {config.max_depth} leaves out the sharded collection{'s' if len(left_out) > 1 else ''} "
            f"{', '.join(left_out)}: their input dists, lookups and output dists were not measured; use --max-depth {depth} or more"]
        merged.meta["distributed"]["owners_left_out"] = left_out
    return merged


def _planned(inner: nn.Module, paths: set[str], config: Any) -> set[str]:
    """The communicating modules the run has rows for: within --max-depth and selected by --include/--exclude."""
    plan = PlanConfig(config.max_depth, config.include, config.exclude)
    return {c.path for c in component_tree(inner)
            if c.path in paths and _within(c.path, config.max_depth) and selected(c, plan) is None}


def _depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def _within(path: str, max_depth: int | None) -> bool:
    return max_depth is None or _depth(path) <= max_depth


def _step(agree: Agreement, dmp: nn.Module, batches: list[Any], config: Any, num_threads: int) -> dict[str, Any]:
    """The whole sharded step in lockstep (distributed/step.py); a model with nothing to train says so."""
    from cbsite.collector.distributed.step import lockstep_step
    from cbsite.collector.step import StepNotApplicable, step_config_for

    try:
        return lockstep_step(agree, dmp, batches, step_config_for(config, num_threads))
    except StepNotApplicable as exc:  # decided by the model's structure: the same on every rank
        return {"train": {"status": "skipped", "error": str(exc)}, "eval": {"status": "skipped", "error": str(exc)}}


def _plan_of(prepared: Any) -> Any:
    return (prepared.provider.get("details") or {}).get("sharding")


def _glob_literal(path: str) -> str:
    """An --exclude pattern that matches exactly `path` (fnmatch's special characters escaped)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def _gather_to_zero(group: Group, obj: Any) -> list[Any] | None:
    import torch.distributed as dist

    out: list[Any] | None = [None] * group.world_size if group.rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def _probe(found: list[Piece], captured: Captured, timing: TimingConfig) -> dict[str, Traffic]:
    """One replay of every piece, on every rank in the same order, under CollectiveMode."""
    out = {}
    for p in found:
        batch = captured.calls[p.path][0]
        if not batch:
            out[p.path] = Traffic()
            continue
        replay = ComponentMeasurement(captured.resolved(p), [batch], timing).replay("forward")
        with CollectiveMode() as mode:
            replay()
        out[p.path] = mode.traffic.scaled(len(batch))
    return out


def _schedule(inner: nn.Module, found: list[Piece], comm_modules: set[str], comm_pieces: set[str],
              phases: tuple[str, ...]) -> list[tuple[str, str]]:
    """(component, phase) of everything that communicates: modules in pre-order, then pieces in discovery order."""
    paths = [p for p, _ in inner.named_modules() if p in comm_modules] + [p.path for p in found if p.path in comm_pieces]
    return [(path, phase) for path in paths for phase in phases]


def verify_schedule(agree: Agreement, schedule: list[tuple[str, str]]) -> None:
    """The same schedule on every rank, or a CbsiteError naming the first component where they part."""
    seen = agree.gather(schedule)
    for i in range(max(len(s) for s in seen)):
        entries = [s[i] if i < len(s) else None for s in seen]
        if len(set(entries)) > 1:
            listed = "; ".join(f"rank {r}: {e[0] or '<root>' if e else 'nothing'}{' ' + e[1] if e else ''}"
                               for r, e in enumerate(entries))
            raise CbsiteError(
                f"the ranks' lockstep schedules differ at entry {i} ({listed}); every rank must build the same model "
                "with the same sharding plan and options"
            )


def _lockstep_one(agree: Agreement, path: str, phase: str, modules: dict[str, nn.Module], by_piece: dict[str, Piece],
                  captured: Captured, timing: TimingConfig) -> LockstepResult | str:
    """A communicating component's phase in lockstep, or why it has no figures (the same on every rank)."""
    if path in by_piece:
        module = captured.resolved(by_piece[path])
    else:
        module = Resolved(modules[path], [p.module for p in by_piece.values() if p.owner == path or path == ""
                                          or p.owner.startswith(path + ".")])
    batches = captured.calls[path] if path in by_piece else captured.module_calls.get(path, [])
    if not any(batches):
        return "skipped: never called during the forward pass"
    measurement = ComponentMeasurement(module, batches, timing)
    try:
        return measure(agree, path or "<root>", measurement, phase, timing)
    except NothingToDifferentiate as exc:
        return f"skipped: backward not applicable: {exc}"


def _local_one(p: Piece, phase: str, captured: Captured, timing: TimingConfig) -> PhaseResult | str:
    """A piece that does not communicate (a lookup), measured on this rank alone by the existing machinery."""
    batches = captured.calls[p.path]
    if not any(batches):
        return "skipped: never called during the forward pass"
    try:
        m = ComponentMeasurement(captured.resolved(p), batches, timing)
        return m.forward() if phase == "forward" else m.backward()
    except NothingToDifferentiate as exc:
        return f"skipped: backward not applicable: {exc}"
    except Exception as exc:  # noqa: BLE001 - one piece failing is recorded, as the collector records any component
        return f"failed: {type(exc).__name__}: {exc}"[:2000]
