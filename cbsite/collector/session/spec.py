"""What a measurement session is made of: arms, tasks and the job of one worker process.

A session times (component, phase) tasks for one or two arms in fresh worker processes. Everything a
worker needs crosses the process boundary in a `ProcessJob` (pickled by the spawn start method), so
these are plain frozen dataclasses: no modules, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARMS_ONE = ("run",)
ARMS_AB = ("base", "head")


@dataclass(frozen=True)
class ArmSpec:
    """How a worker rebuilds one arm's model and example batches.

    Either `request` (a `CollectRequest`: provider, options, seed and preprocessing, deterministic) or
    `payload` (a file written by `torch.save({"model": ..., "batches": ...})`, for models handed to
    the Python API). `sys_path` is put in front of `sys.path` first: a worktree of another git
    revision of the user's package.
    """

    arm: str
    request: Any | None = None
    payload: str | None = None
    sys_path: tuple[str, ...] = ()
    device: str = "cpu"
    dtype: str = "float32"


@dataclass(frozen=True)
class Task:
    """Time one component in one phase; `paths` names it in each arm's model (aligned by the diff)."""

    key: str
    phase: str
    paths: tuple[tuple[str, str], ...]  # ((arm, path), ...)

    def path(self, arm: str) -> str:
        return dict(self.paths)[arm]


@dataclass(frozen=True)
class ProcessJob:
    """Everything one worker process does: build its arms, then time every task in random order."""

    session_id: str
    process: int
    arms: tuple[ArmSpec, ...]
    tasks: tuple[Task, ...]
    threads: int = 1
    pairs: int = 8  # A/B block pairs (blocks, for one arm) per task
    block_s: float = 0.01  # target wall time of one block
    warmup: int = 3
    seed: int = 0
    share_inputs: bool = True  # time both arms on the base arm's captured inputs where their shapes agree
    max_task_s: float = 30.0  # per task, contended pairs included
    # The worker's data segment cap (memory.MemoryLimit; None: 90 % of what is available when it starts):
    # a task that allocates past it fails with "out of memory" instead of the kernel killing the worker.
    memory_limit: int | None = None
