"""The four plugin kinds as small typed protocols, and what the collector hands a profiler plugin.

- Provider: `(options, *, batches, seed) -> Provided` builds a model and example batches.
- Preprocessor: changes the model or inputs between provider and capture, returning a record.
- Profiler: per component and phase, after the timed measurement, produces metrics, columns,
  notes, artifacts and op rows. It runs on separate, untimed passes: a profiler adds microseconds
  per op, so no latency ever comes from a profiled pass.
- Reporter: post-processes the finished `Run` (metadata, extra artifacts) before it is saved.

A plugin class declares `name`, `description` and `options` (name -> `Option`); cbsite validates
the user's options against them before anything runs and instantiates the class with the full,
defaulted options dict.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from cbsite.archive import Run
    from cbsite.collector.capture import Call
    from cbsite.collector.measure import PhaseResult
    from cbsite.collector.providers import Inputs, Provided
    from cbsite.collector.timing.blocks import TimingConfig

KINDS = ("providers", "preprocessors", "profilers", "reporters")


@dataclass(frozen=True)
class Option:
    """A declared plugin option: its default and, through the default's type, what values it takes."""

    default: Any
    help: str = ""
    choices: tuple[Any, ...] | None = None
    kind: type | tuple[type, ...] | None = None  # defaults to type(default); None default takes any value

    def check(self, value: Any) -> str | None:
        """None when `value` is acceptable, else what is wrong with it."""
        if self.choices is not None and value not in self.choices:
            return f"use one of {', '.join(map(repr, self.choices))}"
        kind = self.kind or (type(self.default) if self.default is not None else None)
        if kind is None:
            return None
        if kind is float:
            kind = (int, float)
        if isinstance(value, bool) and kind is not bool and not (isinstance(kind, tuple) and bool in kind):
            return f"use a {_kind_name(kind)}, not a boolean"
        if not isinstance(value, kind):
            return f"use a {_kind_name(kind)}"
        return None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


@dataclass
class PhaseContext:
    """One component in one phase, as a profiler plugin sees it after the timed measurement.

    `replay` runs the phase once on the first captured batch (every call of the component in one
    forward of the model): forward calls, or the backward of a forward graph built beforehand, so a
    profiler around `replay` sees only the component's own work. It is None when the phase was not
    measured (failed or skipped); `status`, `error` and `traceback` then say why.
    """

    path: str
    slug: str
    phase: str
    module: "nn.Module"
    module_type: str
    is_leaf: bool
    depth: int
    status: str
    error: str | None
    traceback: str | None
    result: "PhaseResult | None"
    replay: Callable[[], Any] | None
    # The same replay with another module in the component's place (its compiled form, a copy).
    replay_with: "Callable[[nn.Module], Callable[[], Any]] | None"
    calls_per_replay: int
    calls: "list[Call]"  # the captured calls of batch 0 (inputs for compile and numerics)
    timing: "TimingConfig"
    device: "torch.device"
    dtype: "torch.dtype"
    artifacts_root: Path
    label: str  # record_function label of this component and phase
    shared: dict[str, Any] = field(default_factory=dict)  # results plugins share (one profiled pass)

    def artifact_dir(self) -> Path:
        """`<staging>/<slug>/`, created on first use; files there land in `<run>/artifacts/<slug>/`."""
        folder = self.artifacts_root / self.slug
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def link(self, file: Path) -> str:
        """A file's path relative to the run folder, as the link columns hold it."""
        return f"artifacts/{file.relative_to(self.artifacts_root).as_posix()}"


@dataclass
class PluginResult:
    """What a profiler plugin returns for one component and phase.

    `columns` may set the schema's plugin and link columns (compile_*, numerics_*, trace_file, ...);
    `metrics` land in `plugin_metrics` as `<plugin>.<name>`; `ops` are rows for ops.parquet (the
    identity columns are added by the collector).
    """

    columns: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class RunContext:
    """What a profiler plugin learns once, before the first component."""

    device: "torch.device"
    dtype: "torch.dtype"
    model_name: str
    artifacts_root: Path


@runtime_checkable
class ProfilerPlugin(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[Mapping[str, Option]]

    def start(self, run: RunContext) -> str | None:
        """Called once before measuring. Return a status line for run.json (e.g. why it does nothing here)."""

    def watch(self, ctx: PhaseContext) -> ContextManager[Any]:
        """Entered around the timed measurement of one phase (most plugins: `contextlib.nullcontext()`)."""

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        """Called after the phase was measured (or failed); may run its own untimed passes via ctx.replay."""


@runtime_checkable
class ReporterPlugin(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[Mapping[str, Option]]

    def report(self, run: "Run") -> None:
        """Post-process a finished run in place: add to `run.meta` or write files under `run.artifacts`."""


@runtime_checkable
class PreprocessorPlugin(Protocol):
    name: ClassVar[str]
    description: ClassVar[str]
    options: ClassVar[Mapping[str, Option]]

    def apply(self, model: "nn.Module", inputs: "list[Inputs]") -> tuple["nn.Module", "list[Inputs]", dict[str, Any]]:
        """Return the changed model and inputs and a record `{"name", "parameters", "changed"}`."""


class ProviderPlugin(Protocol):
    def __call__(self, options: Mapping[str, Any] | None = None, *, batches: int = 1, seed: int = 0) -> "Provided":
        """Build the model and `batches` example batches."""


class Profiler:
    """Convenience base for profiler plugins: no status, no watch; subclasses implement `profile`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[Mapping[str, Option]] = {}

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.opts = {k: o.default for k, o in self.options.items()} | dict(options or {})

    def start(self, run: RunContext) -> str | None:
        return None

    def watch(self, ctx: PhaseContext) -> ContextManager[Any]:
        return contextlib.nullcontext()

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        raise NotImplementedError
