"""The components stage: every component captured, counted and measured alone, breadth-first by depth.

One bad component never aborts a run: its error is recorded (`failed`), its children are still measured (even
beyond --max-depth: that is the fallback), and its additive metrics are estimated from them (`estimated`).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from rich.markup import escape
from torch import nn

from cbsite.collector import memory
from cbsite.collector.capture import Capture, Rider
from cbsite.collector.config import DTYPES, Batch, CollectConfig
from cbsite.collector.counting import Counts
from cbsite.collector.measure import (
    REAL_COUNT_BELOW_S,
    ComponentMeasurement,
    Known,
    NothingToDifferentiate,
    PhaseResult,
)
from cbsite.collector.pipeline.capture_plan import CaptureOutOfMemory, Planned
from cbsite.collector.pipeline.failures import error_text, traceback_text
from cbsite.collector.pipeline.progress import progress_bar
from cbsite.collector.plan import Component, breadth_first, selected
from cbsite.collector.plugins import registry
from cbsite.collector.plugins.base import PhaseContext, RunContext
from cbsite.collector.plugins.runner import PluginRunner, RowPatch, label, slug, staging_folder
from cbsite.collector.session import rounds
from cbsite.collector.timing.blocks import TimingConfig
from cbsite.collector.timing.graphs import GradOutputs
from cbsite.collector.twins import Twins, signature


@dataclass
class Outcome:
    """One component's phase as its row will say it: status, the measurement's result or the error, notes."""

    status: str
    result: PhaseResult | None = None
    error: str | None = None
    input_shapes: str | None = None
    notes: list[str] = field(default_factory=list)
    traceback: str | None = None  # full text, for the log plugin; `error` is the one-line summary
    patch: RowPatch | None = None  # what profiler plugins add to the row


@dataclass(frozen=True)
class Plugins:
    """The selected plugins of a run: profiler plugins run around and after each component's measurement into the
    staging folder `artifacts` (None where no profiler plugin is selected)."""

    selection: registry.Selection
    runner: PluginRunner
    artifacts: Path | None

    @classmethod
    def start(cls, config: CollectConfig, model_name: str) -> "Plugins":
        selection = config.selection()
        artifacts = staging_folder() if selection.profilers else None
        runner = PluginRunner(
            selection.instances("profilers"),
            RunContext(device=torch.device(config.device), dtype=DTYPES[config.dtype], model_name=model_name,
                       artifacts_root=artifacts or Path(".")),
        )
        return cls(selection, runner, artifacts)


@dataclass
class Plugged:
    """The plugin side of measuring one component: the runner and what a PhaseContext needs."""

    runner: PluginRunner
    comp: Component
    device: torch.device
    dtype: torch.dtype
    artifacts: Path

    def context(self, module: nn.Module, phase: str, outcome: Outcome, measurement: ComponentMeasurement | None,
                batches: list[list[Any]], timing: TimingConfig) -> PhaseContext:
        replay: Callable[[], Any] | None = None
        replay_with: Callable[[nn.Module], Callable[[], Any]] | None = None
        if measurement is not None and outcome.status == "measured":
            replay = measurement.replay(phase)
            replay_with = functools.partial(measurement.replay, phase)
        calls = batches[0] if batches and batches[0] else []
        return PhaseContext(
            path=self.comp.path, slug=slug(self.comp.path), phase=phase, module=module,
            module_type=self.comp.module_type, is_leaf=self.comp.is_leaf, depth=self.comp.depth,
            status=outcome.status, error=outcome.error, traceback=outcome.traceback, result=outcome.result,
            replay=replay, replay_with=replay_with,
            calls_per_replay=len(calls) or 1, calls=list(calls), timing=timing, device=self.device,
            dtype=self.dtype, artifacts_root=self.artifacts, label=label(self.comp.path, phase),
        )


@dataclass(frozen=True)
class Measured:
    """The components stage's result: each component's outcome per phase, the components that have rows, the order
    they were measured in, and what the memory record needs of the stage."""

    order: list[Component]
    outcomes: dict[str, dict[str, Outcome]]
    in_run: set[str]
    twins: Twins | None
    raisers: memory.PeakRaisers
    returns: memory.HeapReturns
    capture_s: float  # the stage's own captures: re-captures for the re-measurement belong to that stage

    def results(self) -> Iterator[PhaseResult]:
        return (o.result for per in self.outcomes.values() for o in per.values() if o.result)

    @property
    def timed_s(self) -> float:
        return sum(r.timing.timed_s for r in self.results())

    @property
    def quiet_s(self) -> float:
        return sum(r.timing.quiet_wait_s for r in self.results())

    def passes_s(self) -> dict[str, float]:
        """The untimed passes of every measured phase (counting, peaks, graphs)."""
        passes: dict[str, float] = {}
        for r in self.results():
            for key, seconds in r.untimed_s.items():
                passes[key] = passes.get(key, 0.0) + seconds
        return passes

    def samples(self, run_id: str) -> list[dict[str, Any]]:
        return [
            s for path, per in self.outcomes.items() for phase, o in per.items() if o.result is not None
            for s in rounds.block_samples(path, phase, o.result.timing.blocks, run_id)
        ]

    def counted(self, path: str, phase: str) -> Counts | None:
        """A measured phase's counting pass (its own, or its twin's), for check_peaks' component shapes."""
        outcome = self.outcomes.get(path, {}).get(phase)
        return outcome.result.counts if outcome is not None and outcome.result is not None else None

    def root_seconds(self) -> dict[str, float]:
        """The root's seconds per phase: the step's warm-up ran the same work on the same batches (step.py)."""
        return {phase: o.result.timing.median_ms / 1e3 for phase, o in self.outcomes.get("", {}).items()
                if o.status == "measured" and o.result is not None}

    def counting(self) -> tuple[int, int]:
        """Measured phases counted on shapes, and on a real run (counting.count_on_shapes); a twin's as its twin's."""
        return (sum(1 for r in self.results() if r.counts.on_shapes),
                sum(1 for r in self.results() if not r.counts.on_shapes))

    @property
    def failed_measurements(self) -> int:
        return sum(1 for per in self.outcomes.values() for o in per.values() if o.status == "failed")

    def out_of_memory(self) -> list[str]:
        return sorted(f"{path or '<root>'} ({phase})" for path, per in self.outcomes.items() for phase, o in per.items()
                      if o.status == "failed" and (o.error or "").startswith(memory.OOM_PREFIX))


def measure_components(model: nn.Module, batches: Sequence[Batch], config: CollectConfig, planned: Planned,
                       timing: TimingConfig, plugins: Plugins, stage_memory: memory.StagePeaks | None,
                       model_name: str) -> Measured:
    """Capture each component's inputs with its group, count and time it alone, forward then backward."""
    census, captures, mem_plan = planned.census, planned.captures, planned.memory
    modules = dict(model.named_modules())
    # Which components get rows: those within --max-depth, plus (fallback) the children of any
    # component that could not be measured as a whole, however deep.
    outcomes: dict[str, dict[str, Outcome]] = {}
    in_run: set[str] = set()
    # Within a depth, components replayed on batch 0 only come last: fewer capture forwards of the other batches.
    order = breadth_first(planned.components, later=lambda c: mem_plan.batches_for(c.path) < len(batches))
    parent_of = {c.path: c.parent for c in planned.components}
    raisers = memory.PeakRaisers(stage_memory)  # which capture or measurement raised the peak (run.json memory)
    returns = memory.HeapReturns()  # freed heap handed back after a component's measurement (run.json memory)
    twins = Twins() if config.count_twins_once else None  # identical components counted once (twins.py)
    # Backward graphs' grad_outputs drawn once per batch and shape, within a quarter of the allowance: twins and a
    # component's own graphs share them (measure.GradOutputs). Let go with this stage, before the whole-model step.
    grad_outputs = GradOutputs(mem_plan.allowance_bytes // 4)
    progress = progress_bar(config.progress, len(order))
    with progress:
        task = progress.add_task("collecting", total=len(order))

        def planned_to_measure(comp: Component) -> bool:
            """Will this component likely be measured (so its inputs are worth capturing with a group)?"""
            return ((config.max_depth is None or comp.depth <= config.max_depth) and census.call_count(comp.path) > 0
                    and not selected(comp, planned.selection))

        for position, comp in enumerate(order):
            progress.update(task, advance=1)
            # A parent that failed or cannot be called alone is estimated from its children: they
            # are measured even beyond --max-depth. A parent skipped by a filter is not.
            parent_outcomes = outcomes.get(comp.parent, {}) if comp.parent is not None else {}
            parent_fell_back = any(o.status in ("failed", "estimated") for o in parent_outcomes.values())
            within = config.max_depth is None or comp.depth <= config.max_depth
            if comp.path != "" and (comp.parent not in in_run or not (within or parent_fell_back)):
                continue
            in_run.add(comp.path)
            unmeasured = _not_measured(comp, census, planned, config.phases)
            if unmeasured is not None:
                outcomes[comp.path] = unmeasured
                continue
            name = comp.path or model_name
            progress.update(task, description=f"{escape(name)} · capturing inputs")
            try:
                per_batch = captures.calls(comp.path, lambda: [c.path for c in order[position:] if planned_to_measure(c)])  # noqa: B023 - called now
                raisers.step("capture", comp.path)
            except CaptureOutOfMemory as exc:
                why = f"{memory.OOM_PREFIX}: capturing its inputs alone did not fit ({exc})"
                outcomes[comp.path] = {p: Outcome("failed", error=why) for p in config.phases}
                continue
            plugged = (Plugged(plugins.runner, comp, torch.device(config.device), DTYPES[config.dtype], plugins.artifacts)
                       if plugins.runner and plugins.artifacts else None)

            def on_phase(phase: str, name: str = name) -> None:
                progress.update(task, description=f"{escape(name)} · {phase}")

            # What a measurement freed stays resident in glibc's heap below anything live, and the next component
            # allocates beside it: handed back only past the plan's allowance, since a smaller leftover is within what
            # the plan budgets and handing it back makes the next component fault its pages in again while timed.
            with memory.trimmed_if_left(returns, comp.path, mem_plan.allowance_bytes):
                outcomes[comp.path] = measure_component(
                    modules[comp.path], per_batch, config.phases, timing, plugged, on_phase,
                    census.graph_bytes(comp.path), census.saved_bytes.get(comp.path), twins, comp.path, grad_outputs,
                    _cheap_phases(*_timed_ancestor(comp, parent_of, outcomes, census)),
                    captures.rider if comp.path == "" else None)
            raisers.step("measurement", comp.path)
            if mem_plan.batches_for(comp.path) < len(batches):
                for outcome in outcomes[comp.path].values():
                    outcome.notes.append(
                        f"replayed on batch 0 only: {mem_plan.past_cache(comp.path)}, so rotating batches would not change "
                        "what is cached; the other batches were not captured")
    return Measured(order, outcomes, in_run, twins, raisers, returns, captures.seconds)


def _not_measured(comp: Component, census: Capture, planned: Planned,
                  phases: Sequence[str]) -> dict[str, Outcome] | None:
    """The outcomes of a component that is not measured (a container never called alone, a module never called, one
    a filter leaves out), or None where it is measured."""
    calls = census.call_count(comp.path)
    if calls == 0 and not comp.is_leaf:
        why = "container: never called on its own"
        return {p: Outcome("estimated", notes=[why]) for p in phases}
    if calls == 0:
        why = "never called during the forward pass"
        return {p: Outcome("skipped", error=why, notes=[why]) for p in phases}
    reason = selected(comp, planned.selection)
    if reason:
        return {p: Outcome("skipped", error=reason) for p in phases}
    return None


def measure_component(
    module: nn.Module,
    batches: list[list[Any]],
    phases: Sequence[str],
    cfg: TimingConfig,
    plugged: Plugged | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
    graph_bytes: int | None = None,
    saved_bytes: int | None = None,
    twins: Twins | None = None,
    path: str = "",
    grad_outputs: GradOutputs | None = None,
    count_real: set[str] | None = None,
    rider: Rider | None = None,
) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    measurement = None
    sig = None
    try:
        measurement = ComponentMeasurement(module, batches, cfg, graph_bytes, saved_bytes, grad_outputs)
        measurement.count_real = set(count_real or ())
        measurement.rider = rider
        # Backward right after forward, with no plugin replaying either in between: forward's own runs build the
        # graphs backward differentiates (measure.ComponentMeasurement.hold_graphs).
        order = list(phases)
        measurement.hold_graphs = (plugged is None and "forward" in order and "backward" in order
                                   and order.index("backward") == order.index("forward") + 1)
        shapes = measurement.input_shapes()
        sig = signature(module, measurement.batches[0]) if twins is not None else None
    except Exception as exc:  # noqa: BLE001 - any failure of user code is recorded, never fatal
        outcomes = {p: Outcome("failed", error=error_text(exc), traceback=traceback_text(exc)) for p in phases}
        measurement = None
        shapes = None
    forward_failed: Outcome | None = None
    for phase in phases:
        on_phase(phase)
        if phase in outcomes:
            pass
        elif forward_failed is not None:
            outcomes[phase] = Outcome("failed", error=forward_failed.error, input_shapes=shapes, traceback=forward_failed.traceback)
        else:
            assert measurement is not None  # a failed construction gave every phase its outcome above
            patch = RowPatch()
            watch = plugged.runner.watching(_bare_context(plugged, module, phase, cfg), patch) if plugged else contextlib.nullcontext()
            source = twins.source(sig) if twins is not None else None
            known = None
            if source is not None and phase in source.counts:
                known = Known(source.counts[phase], source.peaks[phase], source.path, source.statement_s.get(phase, 0.0))
            with watch:
                outcomes[phase] = _measure_phase(measurement, phase, shapes, cfg, known)
            result = outcomes[phase].result
            if twins is not None and result is not None:
                statement_s = result.timing.median_ms / 1e3 * measurement.calls_per_batch
                if known is None:
                    twins.offer(sig, path, phase, result.counts, result.peak_memory_bytes, statement_s)
                else:
                    twins.reused += 1
                    twins.timed(sig, path, phase, statement_s)
            outcomes[phase].patch = patch
            if phase == "forward" and outcomes[phase].status == "failed":
                forward_failed = outcomes[phase]
        if plugged is not None and outcomes[phase].status in ("measured", "failed"):
            outcome = outcomes[phase]
            ctx = plugged.context(module, phase, outcome, measurement, batches, cfg)
            outcome.patch = plugged.runner.after(ctx, outcome.patch or RowPatch())
    return outcomes


def _timed_ancestor(comp: Component, parent_of: dict[str, str | None], outcomes: dict[str, dict[str, Outcome]],
                    census: Capture) -> tuple[dict[str, Outcome] | None, int]:
    """The outcomes of the nearest ancestor measured so far (a container that is never called is passed over) and its
    calls per forward; (None, 0) where there is none (the root)."""
    ancestor = comp.parent
    while ancestor is not None and not any(o.result is not None for o in outcomes.get(ancestor, {}).values()):
        ancestor = parent_of.get(ancestor)
    return (None, 0) if ancestor is None else (outcomes[ancestor], census.call_count(ancestor))


def _cheap_phases(ancestor: dict[str, Outcome] | None, ancestor_calls: int) -> set[str]:
    """The phases whose statement (every call of one batch) ran under REAL_COUNT_BELOW_S in the ancestor: a
    component's run is part of its ancestor's, so it is counted on a real run, not first on shapes (measure.py)."""
    cheap = set()
    for phase, outcome in (ancestor or {}).items():
        if outcome.result is not None and outcome.result.timing.median_ms / 1e3 * max(1, ancestor_calls) < REAL_COUNT_BELOW_S:
            cheap.add(phase)
    return cheap


def _measure_phase(measurement: ComponentMeasurement, phase: str, shapes: str | None, cfg: TimingConfig,
                   known: Known | None = None) -> Outcome:
    try:
        result = measurement.forward(known) if phase == "forward" else measurement.backward(known)
        return Outcome("measured", result=result, input_shapes=shapes, notes=result.notes)
    except NothingToDifferentiate as exc:
        return Outcome("skipped", error=f"backward not applicable: {exc}", input_shapes=shapes)
    except Exception as exc:  # noqa: BLE001
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()  # an out-of-memory component must not starve the next one
        return Outcome("failed", error=error_text(exc), input_shapes=shapes, traceback=traceback_text(exc))


def _bare_context(plugged: Plugged, module: nn.Module, phase: str, cfg: TimingConfig) -> PhaseContext:
    """The context a watcher sees before the measurement: identity only, nothing measured yet."""
    return plugged.context(module, phase, Outcome("measuring"), None, [], cfg)
