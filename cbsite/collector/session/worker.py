"""One worker process of a session: rebuild the arms, capture their inputs, time every task.

Runs in a fresh process started by the scheduler (spawn), so every process samples its own thread
placement, frequency and allocator state: the run-to-run effects that blocks inside one process never
see. Within the process, the two arms of a comparison are timed in *pairs of blocks* of the same number
of calls, the order inside each pair drawn at random, so slow drifts and neighbours hit both arms alike
and cancel in the paired ratio.

The per-component measurement is the collector's own (`ComponentMeasurement.rotation`: the statement
`cbsite collect` times); this module only schedules it.

Memory follows the collection's plan (memory.py): a census of batch 0, then inputs captured group by
group (`capture_plan.GroupedCaptures`). The tasks are cut into groups in the model's order, the groups are
timed in random order and the tasks within each group in random order, so a drift still does not line
up with one part of the model, while a process holds one group's inputs per arm at a time.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task


@dataclass
class ProcessResult:
    process: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)  # (key, phase) -> one line
    flagged: dict[tuple[str, str], str] = field(default_factory=dict)  # (key, phase) -> contention note
    seconds: dict[str, float] = field(default_factory=dict)  # build, capture, timing
    pid: int = 0
    threads: int = 1
    capture_groups: int = 0  # inputs captured group by group (memory.py), every arm together
    largest_capture_bytes: int = 0  # the most one group's cloned inputs held (one arm)


def _load_arm(spec: ArmSpec) -> tuple[Any, list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    import torch

    for entry in reversed(spec.sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if spec.payload is not None:
        payload = torch.load(spec.payload, weights_only=False)
        return payload["model"], payload["batches"]
    from cbsite.collector.request import prepare

    assert spec.request is not None  # an arm is rebuilt from a payload or from a request (ArmSpec)
    prepared = prepare(spec.request)
    return prepared.model, prepared.batches


def run_process(job: ProcessJob) -> ProcessResult:
    """The worker's entry point (picklable, top level): build, capture, then time every task, under the
    job's memory limit (memory.MemoryLimit), so a task past it is an "out of memory" error, not a killed worker."""
    import torch

    from cbsite.collector.memory import MemoryLimit

    device = torch.device(job.arms[0].device) if job.arms else torch.device("cpu")
    with MemoryLimit(job.memory_limit, device):
        return _run(job)


def _run(job: ProcessJob) -> ProcessResult:
    import torch
    from torch.utils.benchmark import Timer

    from cbsite.collector.capture import describe
    from cbsite.collector.measure import ComponentMeasurement, NothingToDifferentiate
    from cbsite.collector.memory import OOM_PREFIX, is_out_of_memory
    from cbsite.collector.pipeline.capture_plan import CaptureOutOfMemory
    from cbsite.collector.timing.blocks import TimingConfig, before_block, block_size
    from cbsite.collector.timing.contention import WaitProbe

    torch.set_num_threads(job.threads)
    result = ProcessResult(process=job.process, pid=os.getpid(), threads=torch.get_num_threads())
    t0 = time.perf_counter()
    arms = _build_arms(job)
    result.seconds["build_and_capture"] = time.perf_counter() - t0

    names = [spec.arm for spec in job.arms]
    rng = random.Random(f"{job.session_id}/{job.process}/{job.seed}")
    groups = capture_groups(list(job.tasks), arms[names[0]]["plan"], names[0])
    rng.shuffle(groups)  # a drift during the process must not line up with one part of the model
    for group in groups:
        rng.shuffle(group)
    result.seconds["capture"] = 0.0
    cfg = TimingConfig(min_run_time=job.block_s, warmup=job.warmup, num_threads=job.threads, device=job.arms[0].device)
    probe = WaitProbe()
    t_timing = time.perf_counter()
    for group, position, task in ((g, i, t) for g in groups for i, t in enumerate(g)):
        where = (task.key, task.phase)
        started = time.perf_counter()
        try:
            stmts: dict[str, Any] = {}
            per_stmt: dict[str, int] = {}
            measurements: dict[str, Any] = {}
            first_calls = None
            for arm in names:
                state = arms[arm]
                path = task.path(arm)
                t_capture = time.perf_counter()
                # This group's remaining tasks are the candidates to capture with it (at most one group held).
                per_batch = state["captures"].calls(path, lambda arm=arm, rest=group[position:]: [t.path(arm) for t in rest])
                result.seconds["capture"] += time.perf_counter() - t_capture
                if job.share_inputs and first_calls is not None and _same_shapes(first_calls, per_batch, describe):
                    per_batch = first_calls  # the same inputs for both arms: only the module differs
                if first_calls is None:
                    first_calls = per_batch
                # The plan's graph allowance as in the collection: a component whose saved activations are past it is
                # differentiated freeing, on a fresh graph per block (measure.FreshGraphs).
                arm_cfg = dataclasses.replace(cfg, graph_allowance_bytes=state["plan"].allowance_bytes)
                measurements[arm] = ComponentMeasurement(state["modules"][path], per_batch, arm_cfg,
                                                         state["census"].graph_bytes(path),
                                                         state["census"].saved_bytes.get(path))
            # Both arms timed alike: freeing for both when either one's graph is past its allowance.
            freeing = task.phase == "backward" and any(m.frees_graphs() for m in measurements.values())
            for arm, measurement in measurements.items():
                stmts[arm] = measurement.rotation(task.phase, freeing=freeing)
                per_stmt[arm] = measurement.calls_per_batch
            measurements.clear()
            timers = {arm: Timer(stmt="fn()", globals={"fn": fn}, num_threads=job.threads) for arm, fn in stmts.items()}
            steps = {arm: before_block(fn) for arm, fn in stmts.items()}  # a graph cycle or fresh graph per block
            for arm in names:
                for _ in range(job.warmup):
                    stmts[arm]()
            # The same number of statements for every arm, sized on the slower one, so a pair is equal work.
            number = 1 if freeing else min(block_size(timers[arm], job.block_s) for arm in names)
            # Pairs with a block that waited for a CPU are kept as samples but do not count: timing goes on
            # until `pairs` clean pairs or the task's time is up. No quiet-waiting here: a neighbour that
            # slows both blocks of a pair alike cancels in the ratio; one that hits one block is dropped.
            pair, good_pairs = 0, 0
            while good_pairs < job.pairs:
                order = names[:]
                rng.shuffle(order)
                blocks = [(arm, _block(steps[arm], timers[arm], number, per_stmt[arm], probe, pair, job.pairs))
                          for arm in order]
                for position, (arm, block) in enumerate(blocks):
                    result.samples.append(_sample(job, task, arm, pair, position, block))
                pair += 1
                good_pairs += not any(b.contended for _, b in blocks)
                if good_pairs < job.pairs and (time.perf_counter() - started > job.max_task_s or pair >= 2 * job.pairs):
                    result.flagged[where] = (f"contended: {pair - good_pairs} of {pair} block pairs waited for a CPU; "
                                             f"{good_pairs} clean pairs" + ("" if good_pairs >= 3 else ", so every pair counts"))
                    break
        except NothingToDifferentiate as exc:
            result.errors[where] = f"backward not applicable: {exc}"
        except Exception as exc:  # noqa: BLE001 - one task failing never ends the process's other tasks
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            oom = f"{OOM_PREFIX}: " if is_out_of_memory(exc) or isinstance(exc, CaptureOutOfMemory) else ""
            result.errors[where] = f"{oom}{type(exc).__name__}: {exc}" + (f" (at {last[0].name})" if last else "")
    result.seconds["timing"] = time.perf_counter() - t_timing
    result.capture_groups = sum(state["captures"].groups for state in arms.values())
    result.largest_capture_bytes = max((state["captures"].most_bytes for state in arms.values()), default=0)
    return result


def _build_arms(job: ProcessJob) -> dict[str, dict[str, Any]]:
    """Each arm's model and batches on its device and dtype, its census, memory plan and grouped captures."""
    import torch

    from cbsite.collector.capture import moved
    from cbsite.collector.config import DTYPES
    from cbsite.collector.pipeline.capture_plan import planned_captures

    grad = any(t.phase == "backward" for t in job.tasks)
    arms: dict[str, dict[str, Any]] = {}
    for spec in job.arms:
        model, batches = _load_arm(spec)
        device, dtype = torch.device(spec.device), DTYPES[spec.dtype]
        model = model.to(device)
        if dtype != torch.float32:
            model = model.to(dtype)
        batches = [moved(b, device, dtype) for b in batches]
        # The worker's own copy: nothing here is the user's object, and training mode stays as built.
        census, plan, captures = planned_captures(model, batches, grad, device)
        arms[spec.arm] = {"modules": dict(model.named_modules()), "captures": captures, "plan": plan, "spec": spec,
                          "census": census}
    return arms


def capture_groups(tasks: list[Task], plan: Any, arm: str) -> list[list[Task]]:
    """`tasks` (in the model's order) cut into runs whose components' inputs fit the plan's allowance
    together (memory.Plan.group, on `arm`'s census); a task of a path already in the group joins it."""
    groups: list[list[Task]] = []
    i = 0
    while i < len(tasks):
        members = set(plan.group(list(dict.fromkeys(t.path(arm) for t in tasks[i:]))))
        j = i + 1
        while j < len(tasks) and tasks[j].path(arm) in members:
            j += 1
        groups.append(tasks[i:j])
        i = j
    return groups


def _same_shapes(a: list[list[Any]], b: list[list[Any]], describe: Any) -> bool:
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        return False
    return all(
        describe((ca.args, ca.kwargs)) == describe((cb.args, cb.kwargs)) and ca.requires_grad == cb.requires_grad
        for x, y in zip(a, b) for ca, cb in zip(x, y)
    )


def _block(step: Any, timer: Any, number: int, calls: int, probe: Any, pair: int, pairs: int) -> Any:
    """One timed block of an arm, its statement's own step first (a graph built for it, untimed)."""
    from cbsite.collector.timing.blocks import timed_block

    step(pair, pairs)
    return timed_block(timer, number, calls, probe)


def _sample(job: ProcessJob, task: Task, arm: str, pair: int, position: int, block: Any) -> dict[str, Any]:
    return {
        "session_id": job.session_id, "path": task.path(arm), "key": task.key, "phase": task.phase,
        "process": job.process, "round": job.process, "pair": pair, "arm": arm, "position": position,
        "seconds_per_call": block.seconds_per_call, "calls": block.calls, "start_s": block.start_s,
        "wait_s": block.wait_s, "contended": block.contended,
    }
