"""What shapes a collection, validated before anything runs: `CollectConfig` (run.json `config`), the dtypes by
name and the intra-op thread count. The lowest floor of the collector: every stage and worker imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from cbsite import schema
from cbsite.collector.cpu_plan import DEFAULT_CPU_THREADS
from cbsite.collector.plan import PlanConfig
from cbsite.collector.plugins import registry
from cbsite.errors import CbsiteError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_BUDGET_S = 60.0  # a larger budget per component and phase is a slip (hours for a model), not a choice


def _seconds(value: Any, most: float) -> bool:
    """A real number of seconds in (0, most]: not a bool, not nan, not inf."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= most


@dataclass(frozen=True)
class CollectConfig:
    """Everything that shapes a collection; recorded in run.json's `config`.

    The fields are `cbsite collect`'s options by the same names (`max_depth` is --max-depth), except:
    `min_run_time` is --budget, `num_threads` --threads, `step=False` --no-step, `count_twins_once=False`
    --count-every-twin, `memory_limit` --memory-limit in bytes (the CLI also takes "20GB"), `progress=False`
    --no-progress, `calibrate=False` --no-calibrate, `plugins`/`plugin_options` --plugin/--plugin-option, `phases` a
    tuple (--phases a,b); `warmup` and `capture_all_at_once` have no option.
    """

    max_depth: int | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    phases: tuple[str, ...] = ("forward", "backward")
    min_run_time: float = 0.1  # seconds of timed runs per component and phase (the time budget)
    warmup: int = 3  # untimed calls before a cold statement (the step, a session worker); components warm up in their counting and peak passes
    device: str = "cpu"
    dtype: str = "float32"
    peak_flops: float | None = None
    peak_bandwidth: float | None = None
    calibrate: bool = True
    num_threads: int | None = None
    # Timing repeated in this many processes: the collecting one, then rounds-1 fresh workers, so a run
    # carries its run-to-run noise and not only its within-run spread (samples.parquet keeps every block).
    rounds: int = 1
    # Wall seconds one component and phase may spend in timing (None: 20x the budget, at least 5 s).
    max_component_s: float | None = None
    # The whole model's training step and inference forward, timed besides the components (step.py).
    step: bool = True
    # Identical components (same modules, parameter and input shapes, no value-dependent op) counted once:
    # the others take the first one's FLOPs, bytes and peak memory, and are still timed (twins.py).
    count_twins_once: bool = True
    # Bytes the collecting process's data segment may reach (CPU; None: 90 % of what is available at the
    # start). An allocation past it fails the component that made it: `failed: out of memory` (memory.py).
    memory_limit: int | None = None
    # Every module's inputs of every batch captured up front, in as many forwards as batches, instead of
    # group by group: a sharded model's every forward communicates, so every rank must make the same
    # forwards whatever its own memory plan would say (collector/distributed).
    capture_all_at_once: bool = False
    progress: bool = True
    # Plugins by name (profilers, preprocessors, reporters) and their options {plugin: {key: value}}.
    plugins: tuple[str, ...] = ()
    plugin_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        bad_phases = [p for p in self.phases if p not in schema.PHASES]
        if bad_phases or not self.phases:
            problems.append(f"phases must be a non-empty subset of {schema.PHASES}, got {self.phases}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            problems.append(f"rounds must be a whole number of at least 1, got {self.rounds!r}")
        if self.memory_limit is not None and (isinstance(self.memory_limit, bool) or not isinstance(self.memory_limit, int)
                                              or self.memory_limit <= 0):
            problems.append(f"the memory limit must be a whole number of bytes above 0, got {self.memory_limit!r}")
        if self.max_component_s is not None and not _seconds(self.max_component_s, float("inf")):
            problems.append(f"the per-component cap must be a finite number of seconds above 0, got {self.max_component_s!r}")
        if not _seconds(self.min_run_time, MAX_BUDGET_S):  # nan would never end timing, inf neither
            problems.append(f"the time budget (--budget) must be a finite number of seconds above 0 and at most "
                            f"{MAX_BUDGET_S:g} per component and phase, got {self.min_run_time!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or not 0 <= self.warmup <= 1000:
            problems.append(f"warmup must be a whole number of runs from 0 to 1000, got {self.warmup!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            problems.append(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        elif self.device.startswith("cuda") and not torch.cuda.is_available():
            problems.append("device 'cuda' was asked for but torch sees no CUDA device; use --device cpu")
        try:
            self.selection()  # an unknown plugin or option is refused before anything runs
        except CbsiteError as exc:
            problems.append(str(exc))
        try:
            PlanConfig(self.max_depth, self.include, self.exclude)  # validates the plan part
        except CbsiteError as exc:
            problems.append(str(exc))
        if problems:
            raise CbsiteError("; ".join(problems))

    def selection(self) -> registry.Selection:
        """The validated plugin selection (entry points are loaded, not run)."""
        return registry.select(self.plugins, self.plugin_options)


# One example batch as the model is called with it: (args, kwargs).
Batch = tuple[tuple[Any, ...], dict[str, Any]]


def threads_for(config: CollectConfig) -> int:
    """The intra-op thread count a collection times with (recorded in run.json)."""
    if config.num_threads:
        return config.num_threads
    return DEFAULT_CPU_THREADS if config.device == "cpu" else torch.get_num_threads()

