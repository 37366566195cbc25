"""The rounds stage: timing repeated in rounds-1 fresh worker processes (session scheduler), and every round's
samples folded into the rows (session/rounds.py)."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from cbsite.collector.config import Batch, CollectConfig
from cbsite.collector.pipeline.progress import progress_bar
from cbsite.collector.session import rounds
from cbsite.collector.timing.blocks import BLOCKS_PER_BUDGET, TimingConfig
from cbsite.errors import CbsiteError


@dataclass(frozen=True)
class Rounds:
    """Every timed block of every round, the session's record (None for one round) and the noise record."""

    samples: list[dict[str, Any]]
    session: dict[str, Any] | None
    noise: dict[str, Any]


def time_rounds(model: nn.Module, batches: Sequence[Batch], config: CollectConfig, timing: TimingConfig, run_id: str,
                rows: list[dict[str, Any]], samples: list[dict[str, Any]], request: Any,
                peak_flops: float | None, peak_bw: float | None) -> Rounds:
    session_record = None
    if config.rounds > 1:
        samples, session_record = more_rounds(model, batches, config, timing, run_id, rows, samples, request)
    noise = rounds.apply_rounds(rows, samples, config.phases, peak_flops, peak_bw,
                                (session_record or {}).pop("flagged_notes", None))
    return Rounds(samples, session_record, noise)


def more_rounds(model: nn.Module, batches: Sequence[Batch], config: CollectConfig, timing: TimingConfig, run_id: str,
                 rows: list[dict[str, Any]], samples: list[dict[str, Any]],
                 request: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time every measured component again in rounds-1 fresh worker processes (the session scheduler)."""
    from cbsite.collector.session.scheduler import plan_jobs, run_jobs
    from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task

    tasks = [Task(key=r["path"], phase=r["phase"], paths=(("run", r["path"]),)) for r in rows if r["status"] == "measured"]
    with contextlib.ExitStack() as stack:
        if request is not None:
            arm = ArmSpec(arm="run", request=request, device=config.device, dtype=config.dtype)
        else:  # a model handed to the API: the workers load a copy of it and its batches
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cbsite-payload-")))
            payload = folder / "payload.pt"
            try:
                torch.save({"model": model, "batches": list(batches)}, payload)
            except Exception as exc:
                raise CbsiteError(
                    f"--rounds {config.rounds} sends the model to fresh worker processes, but it cannot be pickled "
                    f"({type(exc).__name__}: {exc}); define its classes at module level (no lambdas or local "
                    "classes), or collect it through a provider (`cbsite collect package.module:function --rounds N`)"
                ) from exc
            arm = ArmSpec(arm="run", payload=str(payload), device=config.device, dtype=config.dtype)
        # Each worker round times the blocks round 0 timed: budget/20 long, 20 of them, under the same cap.
        template = ProcessJob(session_id=run_id, process=0, arms=(), tasks=(), threads=timing.num_threads,
                              pairs=BLOCKS_PER_BUDGET, block_s=timing.block_s(), warmup=timing.warmup,
                              max_task_s=timing.cap_s(), memory_limit=config.memory_limit)
        jobs = plan_jobs(run_id, [arm], tasks, config.rounds - 1, "interleaved", template)
        progress = progress_bar(config.progress, len(jobs))
        with progress:
            task = progress.add_task("rounds in fresh processes", total=len(jobs))
            session = run_jobs(jobs, on_done=lambda done, total, elapsed: progress.update(task, completed=done))
    flagged, errors = session.notes("round")
    for where, lines in errors.items():
        flagged.setdefault(where, []).extend(f"failed in {line}" for line in lines)
    record = {
        "layout": "rounds", "processes": config.rounds, "threads": timing.num_threads,
        "wall_s": round(session.wall_s, 3), "died": {str(k): v for k, v in session.died.items()},
        "flagged_notes": flagged,
    }
    return samples + session.samples, record
