"""The collector's driver: capture -> plan -> measure every component -> a `Run`.

One bad component never aborts a run: its error is recorded (`failed`), its children are still
measured (even beyond --max-depth: that is the fallback), and its additive metrics are estimated
from them (`estimated`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
import traceback
import weakref
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import polars as pl
import torch
from rich.markup import escape
from torch import nn

from cbsite import archive, schema, tree
from cbsite.collector.anchors import Anchors
from cbsite.collector.capture import Call, Capture, Rider, capture, moved, refuse_iterators, root_calls
from cbsite.collector import hierarchy, memory, variation
from cbsite.collector.session import rounds
from cbsite.collector.device import describe_device, kept_worker, start_calibration_running
from cbsite.collector.measure import (BLOCKS_PER_BUDGET, REAL_COUNT_BELOW_S, ComponentMeasurement, GradOutputs, Known,
                                      NothingToDifferentiate, PhaseResult, TimingConfig)
from cbsite.collector.counting import Counts, count_on_shapes
from cbsite.collector.counting import warm_up as warm_counting
from cbsite.collector.cpu_plan import DEFAULT_CPU_THREADS
from cbsite.collector.peaks import check_peaks, shapes_budget
from cbsite.collector.preprocess import batch_size_of
from cbsite.collector.restore import preserved
from cbsite.collector.step import collect_step
from cbsite.collector.providers import Inputs as ProvidedInputs
from cbsite.collector.plan import Component, PlanConfig, breadth_first, component_tree, selected
from cbsite.collector.plugins import registry
from cbsite.collector.plugins.base import PhaseContext, RunContext
from cbsite.collector.plugins.runner import PluginRunner, RowPatch, label, slug, staging_folder
from cbsite.collector.twins import TWINS_RULE, Twins, signature
from cbsite.errors import CbsiteError, user_code_error
from cbsite.provenance import git_state, package_versions

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_BUDGET_S = 60.0  # a larger budget per component and phase is a slip (hours for a model), not a choice


def _seconds(value: Any, most: float) -> bool:
    """A real number of seconds in (0, most]: not a bool, not nan, not inf."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= most


@dataclass(frozen=True)
class CollectConfig:
    """Everything that shapes a collection; recorded in run.json's `config`."""

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


Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def _static_size(module: nn.Module) -> tuple[int, int]:
    """Bytes and element count of the unique parameters and buffers of a subtree (tied weights once)."""
    seen: dict[int, torch.Tensor] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        seen.setdefault(id(t), t)
    return sum(t.numel() * t.element_size() for t in seen.values()), sum(t.numel() for t in seen.values())


def _error_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    oom = f"{memory.OOM_PREFIX}: " if memory.is_out_of_memory(exc) else ""
    return f"{oom}{type(exc).__name__}: {exc}{where}"[:2000]


@dataclass
class _Outcome:
    status: str
    result: PhaseResult | None = None
    error: str | None = None
    input_shapes: str | None = None
    notes: list[str] = field(default_factory=list)
    traceback: str | None = None  # full text, for the log plugin; `error` is the one-line summary
    patch: RowPatch | None = None  # what profiler plugins add to the row


@dataclass
class _Plugged:
    """The plugin side of measuring one component: the runner and what a PhaseContext needs."""

    runner: PluginRunner
    comp: Component
    device: torch.device
    dtype: torch.dtype
    artifacts: Path

    def context(self, module: nn.Module, phase: str, outcome: _Outcome, measurement: ComponentMeasurement | None,
                batches: list[list[Any]], timing: TimingConfig) -> PhaseContext:
        replay = None
        if measurement is not None and outcome.status == "measured":
            replay = measurement.replay(phase)
        calls = batches[0] if batches and batches[0] else []
        return PhaseContext(
            path=self.comp.path, slug=slug(self.comp.path), phase=phase, module=module,
            module_type=self.comp.module_type, is_leaf=self.comp.is_leaf, depth=self.comp.depth,
            status=outcome.status, error=outcome.error, traceback=outcome.traceback, result=outcome.result,
            replay=replay, replay_with=(lambda m, ph=phase: measurement.replay(ph, m)) if replay else None,
            calls_per_replay=len(calls) or 1, calls=list(calls), timing=timing, device=self.device,
            dtype=self.dtype, artifacts_root=self.artifacts, label=label(self.comp.path, phase),
        )


def _measure(
    module: nn.Module,
    batches: list[list[Any]],
    phases: Sequence[str],
    cfg: TimingConfig,
    plugged: _Plugged | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
    graph_bytes: int | None = None,
    saved_bytes: int | None = None,
    twins: Twins | None = None,
    path: str = "",
    grad_outputs: GradOutputs | None = None,
    count_real: set[str] | None = None,
    rider: Rider | None = None,
) -> dict[str, _Outcome]:
    outcomes: dict[str, _Outcome] = {}
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
        outcomes = {p: _Outcome("failed", error=_error_text(exc), traceback=_traceback_text(exc)) for p in phases}
        measurement = None
        shapes = None
    forward_failed: _Outcome | None = None
    for phase in phases:
        on_phase(phase)
        if phase in outcomes:
            pass
        elif forward_failed is not None:
            outcomes[phase] = _Outcome("failed", error=forward_failed.error, input_shapes=shapes, traceback=forward_failed.traceback)
        else:
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
                    twins.timed(sig, phase, statement_s)
            outcomes[phase].patch = patch
            if phase == "forward" and outcomes[phase].status == "failed":
                forward_failed = outcomes[phase]
        if plugged is not None and outcomes[phase].status in ("measured", "failed"):
            outcome = outcomes[phase]
            ctx = plugged.context(module, phase, outcome, measurement, batches, cfg)
            outcome.patch = plugged.runner.after(ctx, outcome.patch or RowPatch())
    return outcomes


def _timed_ancestor(comp: Component, parent_of: dict[str, str | None], outcomes: dict[str, dict[str, _Outcome]],
                    census: Capture) -> tuple[dict[str, _Outcome] | None, int]:
    """The outcomes of the nearest ancestor measured so far (a container that is never called is passed over) and its
    calls per forward; (None, 0) where there is none (the root)."""
    ancestor = comp.parent
    while ancestor is not None and not any(o.result is not None for o in outcomes.get(ancestor, {}).values()):
        ancestor = parent_of.get(ancestor)
    return (None, 0) if ancestor is None else (outcomes[ancestor], census.call_count(ancestor))


def _cheap_phases(ancestor: dict[str, _Outcome] | None, ancestor_calls: int) -> set[str]:
    """The phases whose statement (every call of one batch) ran under REAL_COUNT_BELOW_S in the ancestor: a
    component's run is part of its ancestor's, so it is counted on a real run, not first on shapes (measure.py)."""
    cheap = set()
    for phase, outcome in (ancestor or {}).items():
        if outcome.result is not None and outcome.result.timing.median_ms / 1e3 * max(1, ancestor_calls) < REAL_COUNT_BELOW_S:
            cheap.add(phase)
    return cheap


def _measure_phase(measurement: ComponentMeasurement, phase: str, shapes: str | None, cfg: TimingConfig,
                   known: Known | None = None) -> _Outcome:
    try:
        result = measurement.forward(known) if phase == "forward" else measurement.backward(known)
        return _Outcome("measured", result=result, input_shapes=shapes, notes=result.notes)
    except NothingToDifferentiate as exc:
        return _Outcome("skipped", error=f"backward not applicable: {exc}", input_shapes=shapes)
    except Exception as exc:  # noqa: BLE001
        if cfg.device.startswith("cuda"):
            torch.cuda.empty_cache()  # an out-of-memory component must not starve the next one
        return _Outcome("failed", error=_error_text(exc), input_shapes=shapes, traceback=_traceback_text(exc))


def _bare_context(plugged: _Plugged, module: nn.Module, phase: str, cfg: TimingConfig) -> PhaseContext:
    """The context a watcher sees before the measurement: identity only, nothing measured yet."""
    return plugged.context(module, phase, _Outcome("measuring"), None, [], cfg)


def _traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:]


def profile_model(
    model: nn.Module,
    batches: Sequence[Inputs],
    config: CollectConfig = CollectConfig(),
    *,
    model_name: str = "model",
    version: str = "v0",
    provider: dict[str, Any] | None = None,
    preprocessing: Sequence[dict[str, Any]] = (),
    inputs_description: dict[str, Any] | None = None,
    tags: Sequence[str] = (),
    notes: str = "",
    request: Any = None,
    keep_model: bool = True,
) -> archive.Run:
    """Profile every submodule of `model` independently on the captured inputs of `batches`.

    Several batches are captured and replayed in rotation so that repeated ids do not stay hot in
    cache; a module called several times per forward is timed over all its calls, per call.
    `keep_model`: leave the caller's model as it was found (restore.py). False where the model was built for this
    collection alone and is dropped after it (`cbsite collect`'s providers): keeping its values would be a copy of
    every one (a file past 64 MiB) that nobody reads back: 0.8-1.3 s of the wall at dlrm medium and GPT-2 small 2 x 128
    (README "Memory and scale").
    """
    schema.check_name("model", model_name)
    schema.check_name("version", version)
    if not batches:
        raise CbsiteError("no example inputs: give at least one batch of (args, kwargs)")
    refuse_iterators(batches)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(threads_for(config))
    # The collection's wall time starts here: keeping the caller's model values (a spill to a file past
    # restore.SPILL_BYTES) is the collection's own work (run.json breakdown_s.preserve_model). Putting them back
    # comes after the run is recorded, so it is not in `wall_time_s`.
    started = time.perf_counter()
    try:
        # The caller's model is left as it was found, unless it is the collection's own: values, dtype, device, RNG
        # (restore.py). The memory limit turns an allocation that would summon the OOM killer into a failed component
        # (memory.py). One clean worker serves every calibration of the run (device.kept_worker).
        kept = preserved(model) if keep_model else contextlib.nullcontext()
        with kept, memory.MemoryLimit(config.memory_limit, torch.device(config.device)) as limit, kept_worker(), \
                memory.older_objects_frozen():
            return _profile(model, batches, config, model_name, version, provider, preprocessing, inputs_description, tags,
                            notes, request, limit, started)
    finally:
        torch.set_num_threads(caller_threads)  # a notebook keeps its own setting


def _captured(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, index: int,
              keep_bytes: int | None = None, stop_past_keep: bool = False) -> Capture:
    """The capture of one batch; a forward that raises is the user's to fix: one line, the traceback in a file."""
    try:
        return capture(model, args, kwargs, grad=grad, keep_bytes=keep_bytes, stop_past_keep=stop_past_keep)
    except Exception as exc:  # noqa: BLE001 - the user's model, not cbsite
        raise _forward_error(exc, index) from exc


def _forward_error(exc: Exception, index: int) -> CbsiteError:
    """The one line a collection stops with when the model's own forward raises or does not fit."""
    if memory.is_out_of_memory(exc):
        return CbsiteError(
            f"the model's own forward on example batch {index} does not fit in memory ({_error_text(exc)}); "
            "give a larger --memory-limit, a smaller batch (-o batch_size=...) or a smaller model"
        )
    return user_code_error(f"the model's forward on example batch {index}", exc, "forward")


def census_on_shapes(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool,
                     keep_bytes: int) -> Capture | None:
    """The census on fake tensors (counting.count_on_shapes: the same ops, shapes and what autograd saves, without
    the arithmetic), where a real census would not keep batch 0's inputs anyway (they pass `keep_bytes`): GPT-2
    small's at 8 x 512 took 17 s for real. None where it cannot stand for a real one (a value-dependent op, an op
    without a shape rule) or where batch 0's inputs fit: the real census keeps them, and saves the groups a forward
    of batch 0 each (planned_captures tries the real one first, up to where they pass `keep_bytes`)."""
    found: list[Capture] = []
    # The same keep as the real census's (a fake clone costs nothing), so `complete` says what the real one would do.
    counted = count_on_shapes(lambda: None, lambda _: found.append(capture(model, args, kwargs, grad=grad, keep_bytes=keep_bytes)),
                              model.modules())
    if counted is None or not found or found[0].complete:
        return None
    census = found.pop()
    census.calls, census.on_shapes = {}, True
    return census


class _CaptureOutOfMemory(Exception):
    """Capturing one component's inputs alone ran out of memory."""


class GroupedCaptures:
    """Captured inputs group by group, in measuring order (memory.py): a component's calls are captured
    with the components after it that fit the allowance, and the previous group is dropped first."""

    def __init__(self, model: nn.Module, batches: Sequence[Inputs], grad: bool, plan: memory.Plan, census: Capture,
                 everything: bool = False, census_forwards: int = 1, ride: bool = False) -> None:
        self.model, self.batches, self.grad, self.plan = model, batches, grad, plan
        self.everything = everything  # one group of every module, captured once (CollectConfig.capture_all_at_once)
        self.counts = dict(census.counts)  # every module's calls per forward (where a group's capture may stop)
        # Batch 0's inputs of every module when the census could keep them within the allowance (small
        # models): then groups need no forward of batch 0, and a model captures in as many forwards as
        # it has batches, as before the plan.
        self.batch0 = census.calls if census.complete else None
        # Has a real forward of the whole model run? Not yet after a census on shapes: until one has, a forward that
        # does not fit is the model's own (the collection stops with one line), not one component's.
        self.whole_forward_ran = not census.on_shapes
        self.last_called = next(reversed(census.counts), "")  # the module the forward calls last (census order)
        self.root_mutates = census.mutates_inputs.get("")
        self.held: dict[str, list[list[Any]]] = {}
        self.groups = 0
        self.forwards = 0
        self.census_forwards = census_forwards  # real forwards of the census (planned_captures)
        self.seconds = 0.0
        self.most_bytes = 0  # the largest group's cloned inputs
        # Groups of modules inside anchors (GPT-2's blocks) are captured by replaying those anchors (anchors.py).
        self.anchors = Anchors(census.counts, dict(model.named_modules()), enabled=not everything)
        # The first group after the whole model takes batch 0's inputs from the whole model's forward peak pass
        # (capture.Rider), where no census kept them (`batch0`) and peaks can leave its clones out (CPU): `ride`.
        self.ride = ride and not everything and self.batch0 is None
        self.rider: Rider | None = None
        self.rode = False  # did a group take batch 0's inputs from the rider (run.json memory.capture_rode_root)?

    def calls(self, path: str, candidates: Callable[[], list[str]]) -> list[list[Any]]:
        """Per batch, the captured calls of `path` (captured now, with a group, if not held)."""
        if path == "" and not self.everything:
            # The whole model's inputs are the batches themselves: a group of its own, and no forward. Nothing else is
            # held while it is measured, the measurement that needs the most memory, but the rider's batch 0 of the
            # next group, within the allowance.
            self.held = {}
            self.groups += 1
            self.held[""] = [root_calls(*self.batches[i], self.grad, self.root_mutates)
                             for i in range(self.plan.batches_for(""))]
            if self.ride:
                self.ride = False  # once: a re-measurement of the whole model needs no rider
                self.anchors.fit(self.plan.input_bytes, self.plan.batches_for, self.plan.allowance_bytes)
                following = [c for c in candidates() if c != ""]
                # Batch 0's inputs are held through the whole model's measurement, which sets the collection's peak
                # where nothing else is held: the group is cut where they would pass the allowance, what the plan lets
                # captured inputs hold beside any measurement; the members past the cut go to the next group, captured
                # through the anchors (GPT-2 small at 8 x 512: 42 anchor calls, not 39, run.json memory.capture_anchors).
                group = (self.plan.group(following, held=self.anchors.held_bytes(), batch0_room=self.plan.allowance_bytes)
                         if following else [])
                fits = sum(self.plan.input_bytes.get(p, 0) for p in group) <= self.plan.allowance_bytes
                self.rider = Rider(self.model, group, self.counts) if group and fits else None
            return self.held[""]
        if self.everything:
            if not self.groups:
                started = time.perf_counter()
                self._capture(None)
                self.seconds += time.perf_counter() - started
            return self.held.get(path, [])[: self.plan.batches_for(path)]
        if path not in self.held:
            started = time.perf_counter()
            self.anchors.fit(self.plan.input_bytes, self.plan.batches_for, self.plan.allowance_bytes)
            if self.rider is not None and self.rider.paths[0] == path:
                group = self.rider.paths  # the group the rider was cut for (batch 0 from it, where it captured)
            else:
                group = self.plan.group([path] + [c for c in candidates() if c != path],  # starts with `path`
                                        held=self.anchors.held_bytes())
            try:
                self._capture(group)
            except _CaptureOutOfMemory:
                if len(group) == 1:
                    raise
                self._capture([path])  # the group did not fit: this component alone
            finally:
                self.seconds += time.perf_counter() - started
        return self.held[path]

    def _capture(self, group: list[str] | None) -> None:
        """Capture `group` (None: every module, every batch, as one group that is never dropped)."""
        self.held = {}  # the previous group's inputs are freed before the next are cloned
        self.groups += 1
        held_bytes = 0
        for i, (args, kwargs) in enumerate(self.batches):
            wanted = list(self.counts) if group is None else [p for p in group if i < self.plan.batches_for(p)]
            if group is not None and not wanted:
                continue
            if i == 0 and self.batch0 is not None:
                for p in wanted:
                    self.held.setdefault(p, []).append(self.batch0.get(p, []))
                continue
            rode = self._rode(wanted) if i == 0 else None
            if rode is not None:
                held_bytes += rode.kept_bytes()
                for p in wanted:
                    self.held.setdefault(p, []).append(rode.calls.get(p, []))
                continue
            through = None if group is None else self.anchors.through(wanted, i)
            cap = None if through is None else self._anchored(wanted, through, i)
            if cap is None:
                try:
                    # Only the members this batch needs (a batch-0-only member is not cloned again), and the
                    # forward stops once they have all made their calls.
                    cap = capture(self.model, args, kwargs, grad=self.grad, census=False,
                                  paths=None if group is None else wanted,
                                  stop_after=None if group is None else {p: self.counts.get(p, 0) for p in wanted})
                except Exception as exc:  # noqa: BLE001 - after a real census forward, only memory can differ
                    self.held = {}
                    if memory.is_out_of_memory(exc) and self.whole_forward_ran:
                        raise _CaptureOutOfMemory(_error_text(exc)) from exc
                    raise _forward_error(exc, i) from exc
                self.whole_forward_ran = self.whole_forward_ran or not cap.stopped_early or self.last_called in wanted
                self.forwards += 1
            held_bytes += cap.kept_bytes()
            for p in wanted:
                self.held.setdefault(p, []).append(cap.calls.get(p, []))
        self.most_bytes = max(self.most_bytes, held_bytes)
        self.anchors.keep(self.held)

    def _rode(self, wanted: list[str]) -> Capture | None:
        """Batch 0's calls of `wanted` from the whole model's forward peak pass (capture.Rider), or None where it
        did not capture them all. The rider is let go either way: only the first group after the root may use it."""
        rider, self.rider = self.rider, None
        cap = rider.captured if rider is not None else None
        if cap is None or not set(wanted) <= set(rider.paths):
            return None
        cap.calls = {p: cap.calls[p] for p in wanted}  # members the group does not take are let go
        self.rode = self.whole_forward_ran = True
        return cap

    def _anchored(self, wanted: list[str], through: list[tuple[nn.Module, Call]], batch: int) -> Capture | None:
        """`wanted`'s calls of `batch` from replaying their anchors (anchors.py), or None where that cannot stand for
        the whole forward: the anchors are then let go, and the caller runs one."""
        try:
            cap = capture(self.model, (), {}, grad=self.grad, census=False, paths=wanted,
                          stop_after={p: self.counts.get(p, 0) for p in wanted}, through=through)
        except Exception as exc:  # noqa: BLE001 - the user's modules, replayed on their own
            if memory.is_out_of_memory(exc) and self.whole_forward_ran:
                self.held = {}
                raise _CaptureOutOfMemory(_error_text(exc)) from exc
            self.anchors.let_go(f"replaying an anchor raised {_error_text(exc)}")
            return None
        why = (None if cap.stopped_early else
               "a module of a group did not make its calls within the anchors replayed (one shared with another part of "
               "the model)")
        why = why or (self.anchors.mismatch(wanted, cap.input_bytes, self.plan.input_bytes) if batch == 0 else None)
        if why:
            self.anchors.let_go(why)
            return None
        self.anchors.batches += 1
        self.anchors.calls += len(through)
        return cap

    def drop(self) -> None:
        self.held = {}
        self.batch0 = None
        self.rider = None
        self.anchors.drop()


def planned_captures(model: nn.Module, batches: Sequence[Inputs], grad: bool, device: torch.device,
                     everything: bool = False) -> tuple[Capture, memory.Plan, "GroupedCaptures"]:
    """The census of batch 0 (one forward that keeps no inputs past the provisional allowance, only what
    every module received and how much its graph saved), the memory plan made from it and the model's own
    size, and the captures that follow that plan. Used by the collection and by session workers alike."""
    model_bytes = _static_size(model)[0]
    keep_bytes = None if everything else memory.provisional_allowance(model_bytes)
    # The real census first, stopped where batch 0's inputs pass the allowance. Where they fit (the small models) it is
    # the whole census, and the one on shapes is not tried: it was futile there (the real census had to run anyway to
    # keep the inputs), and dropping it took 2.4-2.5 s off GPT-2 small's setup at 2 x 128 (benchmarks/collect_scale.py).
    # Where they do not (GPT-2 small at 8 x 512), it stops at the first module whose inputs pass the allowance, and the
    # census on shapes stands in for the whole forward; where that cannot (a value-dependent op), a real census to the
    # end that keeps nothing.
    census = _captured(model, *batches[0], grad, 0, keep_bytes=keep_bytes, stop_past_keep=not everything)
    stopped = not census.complete
    if stopped:
        census = (census_on_shapes(model, *batches[0], grad, keep_bytes)
                  or _captured(model, *batches[0], grad, 0, keep_bytes=0))
    mem_plan = memory.plan(census.input_bytes, model_bytes, census.saved_bytes.get("", 0), len(batches),
                           memory.cache_bytes(device), census.output_bytes, census.saved_bytes)
    # Real census forwards: the stopped one, and one to the end where no census on shapes stood in.
    return census, mem_plan, GroupedCaptures(model, batches, grad, mem_plan, census, everything=everything,
                                             census_forwards=1 + (stopped and not census.on_shapes),
                                             ride=device.type == "cpu")


def threads_for(config: CollectConfig) -> int:
    """The intra-op thread count a collection times with (recorded in run.json)."""
    if config.num_threads:
        return config.num_threads
    return DEFAULT_CPU_THREADS if config.device == "cpu" else torch.get_num_threads()


def _load_warnings(num_threads: int, when: str) -> list[str]:
    """Timing on a loaded machine measures the contention: say so in the run, not only in numbers.

    The load average counts this process's own running threads too, so only a load above the core
    count means that something waited for a core.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return []
    cores = os.cpu_count() or 1
    if load > cores + 0.5:
        return [
            f"the machine was busy {when} timing (1-minute load average {load:.1f} on {cores} cores, "
            f"{num_threads} intra-op threads): latencies may include waiting for other processes"
        ]
    return []


COUNTING_RULE = ("FLOPs and bytes moved are counted on fake tensors (shapes, strides and dtypes, no arithmetic) where "
                 "that pass runs and meets no op whose work may depend on values; otherwise on a real run of batch 0. "
                 f"A component whose nearest measured ancestor's statement of the phase ran under {REAL_COUNT_BELOW_S * 1e3:g} ms is "
                 "counted on a real run straight away (cheaper than the pass on fake tensors; the counts are the same)")


def _profile(
    model: nn.Module,
    batches: Sequence[Inputs],
    config: CollectConfig,
    model_name: str,
    version: str,
    provider: dict[str, Any] | None,
    preprocessing: Sequence[dict[str, Any]],
    inputs_description: dict[str, Any] | None,
    tags: Sequence[str],
    notes: str,
    request: Any = None,
    limit: memory.MemoryLimit | None = None,
    started: float | None = None,
) -> archive.Run:
    """`started`: when the collection began (profile_model, before the model's values were kept)."""
    started = time.perf_counter() if started is None else started
    # where the wall time (and memory) goes: run.json `breakdown_s`
    stages = _Stages(started, torch.device(config.device).type == "cpu")
    stages.done("preserve_model")  # restore.preserved's copy of the model's values, the memory limit, the kept worker
    device = torch.device(config.device)
    dtype = DTYPES[config.dtype]
    num_threads = torch.get_num_threads()
    load_warnings = _load_warnings(num_threads, "before")
    model = model.to(device)
    if dtype != torch.float32:
        model = model.to(dtype)
    batches = [moved(b, device, dtype) for b in batches]

    grad = "backward" in config.phases
    # The census: one forward of batch 0 that keeps no inputs, only what every module received and how
    # much its graph saved; the memory plan (memory.py) comes from it and the model's own size.
    census, mem_plan, captures = planned_captures(model, batches, grad, device, everything=config.capture_all_at_once)
    stages.done("setup_and_capture")
    components = component_tree(model)
    modules = dict(model.named_modules())
    plan = PlanConfig(config.max_depth, config.include, config.exclude)
    if not config.capture_all_at_once and not selected(components[0], plan):
        # The whole model is measured: its graph is memory the collection needs anyway (memory.Plan.group).
        mem_plan = dataclasses.replace(mem_plan, headroom_bytes=census.graph_bytes("") or 0)
        captures.plan = mem_plan
    timing = TimingConfig(config.min_run_time, config.warmup, num_threads, config.device,
                          max_component_s=config.max_component_s, graph_allowance_bytes=mem_plan.allowance_bytes)
    if start_calibration_running():
        # The process would only wait for the worker: the counting passes' one-time set-up is made in that wait (tiny and
        # small models waited for their start calibration while their first counting pass paid it).
        warm_counting()
    device_info = describe_device(
        device, dtype, peak_flops=config.peak_flops, peak_bandwidth=config.peak_bandwidth, calibrate=config.calibrate
    )
    stages.done("calibration_start")
    peak_flops = next(iter(device_info["peak_flops"].values()), None)
    peak_bw = device_info["peak_bandwidth"]
    selection = config.selection()
    artifacts = staging_folder() if selection.profilers else None
    runner = PluginRunner(
        selection.instances("profilers"),
        RunContext(device=device, dtype=dtype, model_name=model_name, artifacts_root=artifacts or Path(".")),
    )

    # Which components get rows: those within --max-depth, plus (fallback) the children of any
    # component that could not be measured as a whole, however deep.
    outcomes: dict[str, dict[str, _Outcome]] = {}
    in_run: set[str] = set()
    # Within a depth, components replayed on batch 0 only come last: fewer capture forwards of the other batches.
    order = breadth_first(components, later=lambda c: mem_plan.batches_for(c.path) < len(batches))
    parent_of = {c.path: c.parent for c in components}
    raisers = memory.PeakRaisers(stages.memory)  # which capture or measurement raised the peak (run.json memory)
    returns = memory.HeapReturns()  # freed heap handed back after a component's measurement (run.json memory)
    twins = Twins() if config.count_twins_once else None  # identical components counted once (twins.py)
    # Backward graphs' grad_outputs drawn once per batch and shape, within a quarter of the allowance: twins and a
    # component's own graphs share them (measure.GradOutputs). Let go before the whole-model step.
    grad_outputs = GradOutputs(mem_plan.allowance_bytes // 4)
    progress = _progress(config.progress, len(order))
    with progress:
        task = progress.add_task("collecting", total=len(order))

        def planned(comp: Component) -> bool:
            """Will this component likely be measured (so its inputs are worth capturing with a group)?"""
            return ((config.max_depth is None or comp.depth <= config.max_depth) and census.call_count(comp.path) > 0
                    and not selected(comp, plan))

        for position, comp in enumerate(order):
            progress.update(task, advance=1)
            # A parent that failed or cannot be called alone is estimated from its children: they
            # are measured even beyond --max-depth. A parent skipped by a filter is not.
            parent_fell_back = any(o.status in ("failed", "estimated") for o in outcomes.get(comp.parent, {}).values())
            within = config.max_depth is None or comp.depth <= config.max_depth
            if comp.path != "" and (comp.parent not in in_run or not (within or parent_fell_back)):
                continue
            in_run.add(comp.path)
            calls = census.call_count(comp.path)
            reason = selected(comp, plan)
            if calls == 0 and not comp.is_leaf:
                why = "container: never called on its own"
                outcomes[comp.path] = {p: _Outcome("estimated", notes=[why]) for p in config.phases}
                continue
            if calls == 0:
                why = "never called during the forward pass"
                outcomes[comp.path] = {p: _Outcome("skipped", error=why, notes=[why]) for p in config.phases}
                continue
            if reason:
                outcomes[comp.path] = {p: _Outcome("skipped", error=reason) for p in config.phases}
                continue
            name = comp.path or model_name
            progress.update(task, description=f"{escape(name)} · capturing inputs")
            try:
                per_batch = captures.calls(comp.path, lambda: [c.path for c in order[position:] if planned(c)])
                raisers.step("capture", comp.path)
            except _CaptureOutOfMemory as exc:
                why = f"{memory.OOM_PREFIX}: capturing its inputs alone did not fit ({exc})"
                outcomes[comp.path] = {p: _Outcome("failed", error=why) for p in config.phases}
                continue
            plugged = _Plugged(runner, comp, device, dtype, artifacts) if runner and artifacts else None

            def on_phase(phase: str, name: str = name) -> None:
                progress.update(task, description=f"{escape(name)} · {phase}")

            # What a measurement freed stays in glibc's heap, resident, wherever something live sits above it (the
            # heap's top cannot shrink past it), and the next component allocates beside it. dlrm medium's sparse_arch,
            # whose backward writes every table's dense gradient, raised the collection's peak by 0.59 GB in one run and
            # by 0.02-0.10 GB in most (run.json memory.peak_raised_most_by), after the whole model's measurement, which
            # frees as many gradients. Handed back only past the plan's allowance (what it lets a group's captured
            # inputs hold): a smaller leftover is within what the plan budgets, and the next component faults handed-
            # back pages in again, in its first timed block (run.json memory.heap_returned says where it happened).
            with memory.trimmed_if_left(returns, comp.path, mem_plan.allowance_bytes):
                outcomes[comp.path] = _measure(modules[comp.path], per_batch, config.phases, timing, plugged, on_phase,
                                               census.graph_bytes(comp.path), census.saved_bytes.get(comp.path), twins,
                                               comp.path, grad_outputs,
                                               _cheap_phases(*_timed_ancestor(comp, parent_of, outcomes, census)),
                                               captures.rider if comp.path == "" else None)
            raisers.step("measurement", comp.path)
            if mem_plan.batches_for(comp.path) < len(batches):
                for outcome in outcomes[comp.path].values():
                    outcome.notes.append(
                        f"replayed on batch 0 only: {mem_plan.past_cache(comp.path)}, so rotating batches would not change "
                        "what is cached; the other batches were not captured")
    stages.done("components")
    # The components stage's own captures: re-captures for the hierarchy re-measurement belong to that stage.
    capture_s = captures.seconds
    measurements = _Remeasure(order, outcomes, captures, modules, timing, census)
    rows = _rows(components, in_run, outcomes, census, modules, config.phases, model_name, version)
    run_id = archive.new_run_id()
    for row in rows:
        row["run_id"] = run_id
    rows = _estimate(rows, config.phases, peak_flops, peak_bw)
    # Modules whose work differs between forwards of the same batch (random control flow) are said so in their rows
    # (variation.py); probed after the measurement, so a model that counts its own calls saw the collection's first.
    # Not on a sharded model's ranks: every forward communicates, and the ranks' forwards must agree.
    variation.annotate(rows, {} if config.capture_all_at_once else variation.probe(model, *batches[0]))
    samples = [
        s for path, per in outcomes.items() for phase, o in per.items() if o.result is not None
        for s in rounds.block_samples(path, phase, o.result.timing.blocks, run_id)
    ]
    # Children slower than their parents beyond both intervals are timed again, interleaved with them.
    pair_index = {(s["path"], s["phase"]): s["pair"] for s in samples}
    measurements.needed(row["path"] for pair in hierarchy.inverted_pairs(rows) for row in pair)
    extra, remeasured = hierarchy.remeasure(
        rows, measurements.statement,
        timing.block_s(), num_threads, run_id,
        lambda path, phase: pair_index.get((path, phase), -1) + 1,
    )
    samples += extra
    # The re-timing's blocks are timed blocks too (their samples join the rows' medians): breakdown_s says how long.
    remeasure_timed_s = sum(s["seconds_per_call"] * s["calls"] for s in extra)
    measurements.drop()  # the last use of the captured inputs
    del grad_outputs
    memory.release_freed()  # what the components freed goes back before the step needs its own
    stages.done("hierarchy_remeasure")
    session_record = None
    if config.rounds > 1:
        samples, session_record = _more_rounds(model, batches, config, timing, run_id, rows, samples, request)
    noise = rounds.apply_rounds(rows, samples, config.phases, peak_flops, peak_bw,
                                (session_record or {}).pop("flagged_notes", None))
    stages.done("rounds")
    hierarchy_record = hierarchy.check(rows, remeasured)
    timed_s = sum(o.result.timing.timed_s for per in outcomes.values() for o in per.values() if o.result)
    peak_warnings = check_peaks(rows, device_info, lambda path, phase: _counted(outcomes, path, phase),
                                shapes_budget(timed_s))
    stages.done("calibration_end_and_peak_checks")
    # The components by the status their rows carry, so run.json agrees with the Parquet; the failed attempts
    # (a failed parent estimated from its children, a failed backward) are counted apart.
    counts = {s: sum(1 for r in rows if r["phase"] == config.phases[0] and r["status"] == s) for s in schema.STATUSES}
    failed_measurements = sum(1 for per in outcomes.values() for o in per.values() if o.status == "failed")
    out_of_memory = sorted(f"{path or '<root>'} ({phase})" for path, per in outcomes.items() for phase, o in per.items()
                           if o.status == "failed" and (o.error or "").startswith(memory.OOM_PREFIX))
    # The root's forward and backward ran the step's work on the same batches: the step's warm-up (step.py).
    root_seconds = {phase: o.result.timing.median_ms / 1e3 for phase, o in outcomes.get("", {}).items()
                    if o.status == "measured" and o.result is not None}
    training = model.training  # as the caller left it: the step changes modes and leaves them to `preserved`
    step = collect_step(model, batches, config, num_threads, request, root_seconds) if config.step else None
    stages.done("step")
    if limit is not None:
        limit.release()  # the memory limit is for measurement; the run's record is cbsite's own work (memory.MemoryLimit)
    quiet_s = sum(o.result.timing.quiet_wait_s for per in outcomes.values() for o in per.values() if o.result)
    passes_s: dict[str, float] = {}  # the untimed passes of every measured phase (counting, peaks, graphs)
    for o in (o for per in outcomes.values() for o in per.values() if o.result):
        for key, seconds in o.result.untimed_s.items():
            passes_s[key] = passes_s.get(key, 0.0) + seconds
    meta = {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": run_id,
        "model": model_name,
        "version": version,
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": package_versions(),
        "device": device_info,
        "dtype": config.dtype,
        "provider": provider or {"name": "python", "options": {}},
        "config": {
            **{k: v for k, v in asdict(config).items() if k not in ("plugins", "plugin_options")},
            "batch_size": batch_size_of(ProvidedInputs(*batches[0])), "batches": len(batches),
            "training": training, "num_threads": num_threads,
            "threads_source": "given (--threads)" if config.num_threads else
            ("default: one intra-op thread on CPU (README: Why one thread)" if config.device == "cpu" else "torch default"),
            "plugins": _plugins_record(selection, runner.status, runner.seconds),
        },
        "preprocessing": list(preprocessing),
        "inputs": inputs_description or {"batches": len(batches)},
        "rotation": {
            "batches": len(batches),
            "rule": "timed runs cycle through the captured batches in order; FLOPs, bytes and memory are counted on batch 0",
        },
        "git": git_state(),
        "tags": list(tags),
        "notes": notes,
        "wall_time_s": round(time.perf_counter() - started, 3),
        # Seconds inside timed regions: what no collector can avoid; the rest is capture, warm-up,
        # counting passes and calibration.
        "timed_s": round(timed_s, 3),
        "breakdown_s": {**stages.record(timed_s, sum(runner.seconds.values()), capture_s, quiet_s, passes_s),
                        "hierarchy_remeasure_timed_blocks": round(remeasure_timed_s, 3)},
        "counts": counts,
        "failed_measurements": failed_measurements,
        "components": len(in_run),
        "warnings": load_warnings + _load_warnings(num_threads, "after") + peak_warnings + _memory_warnings(out_of_memory, limit),
        "counts_phase": config.phases[0],
        "step": step,
        "rounds": noise["rounds"],
        "noise": noise,
        "samples": {"file": archive.SAMPLES_FILE, "rows": len(samples)} if samples else None,
        "session": session_record,
        "hierarchy": hierarchy_record,
        # How each measured phase's FLOPs and bytes were counted (counting.count_on_shapes); a twin's as its twin's.
        "counting": {
            "on_shapes": sum(1 for per in outcomes.values() for o in per.values() if o.result and o.result.counts.on_shapes),
            "real": sum(1 for per in outcomes.values() for o in per.values() if o.result and not o.result.counts.on_shapes),
            "rule": COUNTING_RULE,
        },
        # Phases whose FLOPs, bytes and peak memory were taken from an identical component (twins.py).
        "twins": {"phases_counted_on_a_twin": twins.reused if twins is not None else 0,
                  "enabled": twins is not None, "rule": TWINS_RULE},
        "memory": {
            **(limit.record() if limit else {}), **mem_plan.record(),
            # Real forwards that captured inputs, the census's included (planned_captures: a real one stopped where
            # batch 0's inputs passed the allowance, before one on shapes, counts as one).
            "capture_groups": captures.groups, "capture_forwards": captures.forwards + captures.census_forwards,
            # The first group after the whole model took batch 0's inputs from its forward peak pass (capture.Rider).
            "capture_rode_root": captures.rode,
            "census": "on shapes" if census.on_shapes else "real",
            "largest_capture_bytes": captures.most_bytes,
            # Groups captured by replaying the anchors that contain them, not by forwards (anchors.py).
            "capture_anchors": captures.anchors.record(),
            "peak_rss_bytes": memory.peak_rss_bytes() if stages.memory else None,
            "peak_rss_bytes_after_stage": dict(stages.memory.peaks) if stages.memory else None,
            **(raisers.record() if stages.memory else {}),
            **returns.record(),
            "peak_device_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "out_of_memory": out_of_memory,
        },
    }
    table = pl.from_arrow(archive.rows_to_table(rows))
    run = archive.Run(meta=meta, rows=table, artifacts=artifacts, ops=_ops_frame(runner.ops, run_id, model_name, version),
                      samples=samples_frame(samples, run_id, model_name, version))
    if artifacts is not None:
        weakref.finalize(run, shutil.rmtree, artifacts, True)  # the staging folder lives as long as the Run
    _report(run, selection)
    return run


def samples_frame(samples: list[dict[str, Any]], run_id: str, model_name: str, version: str) -> pl.DataFrame | None:
    """samples.parquet's rows with the run's identity, typed by schema.SAMPLES_SCHEMA."""
    if not samples:
        return None
    import pyarrow as pa

    rows = [{**s, "run_id": run_id, "model": model_name, "version": version} for s in samples]
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=schema.SAMPLES_SCHEMA))


def _more_rounds(model: nn.Module, batches: Sequence[Inputs], config: CollectConfig, timing: TimingConfig, run_id: str,
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
            except Exception as exc:  # noqa: BLE001 - a model the workers cannot receive is the user's to fix
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
        progress = _progress(config.progress, len(jobs))
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


PASSES = ("counting", "memory_peaks", "backward_graphs", "warm_up", "block_sizing")  # a phase's untimed passes (measure.PhaseResult.untimed_s)


class _Stages:
    """Wall seconds per stage of a collection, so run.json says where the time went beside `timed_s`."""

    def __init__(self, started: float, cpu: bool) -> None:
        self.last = started
        self.seconds: dict[str, float] = {}
        self.memory = memory.StagePeaks() if cpu else None  # which stage needed the memory (run.json memory)

    def done(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now
        if self.memory is not None:
            self.memory.done(stage)

    def record(self, timed_s: float, plugins_s: float, capture_s: float = 0.0, quiet_s: float = 0.0,
               passes_s: dict[str, float] | None = None) -> dict[str, Any]:
        """The stages, with the components stage split into its timed blocks, its plugins, the captures
        of its groups, waits for a quiet machine, the untimed passes (counting, memory peaks, backward
        graphs, warm-up calls, block sizing) and the rest (preparing inputs and statements, bookkeeping)."""
        out = {k: round(v, 3) for k, v in self.seconds.items()}
        components = self.seconds.get("components", 0.0)
        out["components_timed_blocks"] = round(timed_s, 3)
        out["components_plugins"] = round(plugins_s, 3)
        out["components_capture"] = round(capture_s, 3)
        out["components_quiet_waits"] = round(quiet_s, 3)
        passes = {k: passes_s.get(k, 0.0) for k in PASSES} if passes_s is not None else {}
        for key, seconds in passes.items():
            out[f"components_{key}"] = round(seconds, 3)
        rest = components - timed_s - plugins_s - capture_s - quiet_s - sum(passes.values())
        out["components_other"] = round(max(0.0, rest), 3)
        return out


def _memory_warnings(out_of_memory: list[str], limit: memory.MemoryLimit | None) -> list[str]:
    if not out_of_memory:
        return []
    cap = f" under the limit of {limit.bytes / 2**30:.2f} GiB ({limit.source})" if limit and limit.bytes else ""
    named = ", ".join(out_of_memory[:8]) + (f" and {len(out_of_memory) - 8} more" if len(out_of_memory) > 8 else "")
    return [f"{len(out_of_memory)} component phase(s) ran out of memory{cap}: {named}; they are failed, their children "
            "measured and their parents estimated from them (give a larger --memory-limit to measure them whole)"]


def _plugins_record(selection: registry.Selection, status: dict[str, str], seconds: dict[str, float]) -> dict[str, Any]:
    """run.json config.plugins: each plugin's kind, options, status line (if any) and seconds spent in it."""
    record = selection.describe()
    for name, line in status.items():
        record[name]["status"] = line
    for name, spent in seconds.items():
        record[name]["seconds"] = round(spent, 3)
    return record


def _ops_frame(ops: list[dict[str, Any]], run_id: str, model_name: str, version: str) -> pl.DataFrame | None:
    if not ops:
        return None
    import pyarrow as pa

    rows = [{**op, "run_id": run_id, "model": model_name, "version": version} for op in ops]
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=schema.OPS_SCHEMA))


def _report(run: archive.Run, selection: registry.Selection) -> None:
    """Reporters post-process the finished run; one that raises is recorded and the others still run."""
    plugins = run.meta["config"]["plugins"]
    for reporter in selection.instances("reporters"):
        try:
            reporter.report(run)
        except Exception as exc:  # noqa: BLE001
            plugins[reporter.name]["status"] = f"failed: {_error_text(exc)}"


def _progress(enabled: bool, total: int):
    """A live bar on a terminal; where stderr is a file or a pipe (a CI log, nohup), a plain line at most
    every LINE_EVERY_S seconds, so a long collection still says where it is."""
    if enabled and not sys.stderr.isatty():
        return _LineProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}", justify="left"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),  # from the components done so far: a rough estimate, as rich says "-:--:--" until then
        disable=not enabled,
        transient=False,
    )


class _LineProgress:
    """The part of rich's Progress the collector uses, written as occasional plain lines to stderr."""

    LINE_EVERY_S = 30.0

    def __init__(self) -> None:
        self.tasks: dict[int, dict[str, Any]] = {}
        self.last = 0.0

    def __enter__(self) -> "_LineProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        for task in self.tasks.values():
            self._line(task, final=True)

    def add_task(self, description: str, total: int) -> int:
        self.tasks[len(self.tasks)] = {"description": description, "title": description, "total": total, "done": 0,
                                       "started": time.perf_counter()}
        return len(self.tasks) - 1

    def update(self, task_id: int, advance: int = 0, completed: int | None = None, description: str | None = None) -> None:
        task = self.tasks[task_id]
        task["done"] = completed if completed is not None else task["done"] + advance
        if description is not None:
            task["description"] = description
        if time.perf_counter() - self.last >= self.LINE_EVERY_S:
            self._line(task)

    def _line(self, task: dict[str, Any], final: bool = False) -> None:
        self.last = time.perf_counter()
        elapsed = self.last - task["started"]
        done, total = task["done"], task["total"]
        left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
        where = "done" if final else task["description"]
        print(f"cbsite: {task['title']} {done}/{total} ({where}), {elapsed:.0f} s elapsed{left}", file=sys.stderr, flush=True)


def _rows(
    components: list[Component],
    in_run: set[str],
    outcomes: dict[str, dict[str, _Outcome]],
    cap: Capture,
    modules: dict[str, nn.Module],
    phases: Sequence[str],
    model_name: str,
    version: str,
) -> list[dict[str, Any]]:
    rows = []
    for comp in components:  # pre-order
        if comp.path not in in_run:
            continue
        param_bytes, param_count = _static_size(modules[comp.path])
        for phase in phases:
            outcome = outcomes[comp.path][phase]
            row = schema.empty_row()
            row.update(
                model=model_name, version=version, path=comp.path, parent=comp.parent, name=comp.name,
                depth=comp.depth, module_type=comp.module_type, is_leaf=comp.is_leaf, order=comp.order,
                call_count=cap.call_count(comp.path), phase=phase, status=outcome.status, error=outcome.error,
                param_bytes=param_bytes, param_count=param_count, input_shapes=outcome.input_shapes,
                notes=list(outcome.notes), unsupported_ops=[],
            )
            if outcome.patch is not None:
                outcome.patch.apply(row)
            res = outcome.result
            if res is not None:
                row.update(
                    latency_ms=res.timing.median_ms, latency_p25_ms=res.timing.p25_ms,
                    latency_p75_ms=res.timing.p75_ms, samples=res.timing.samples,
                    cpu_time_ms=res.timing.cpu_time_ms, device_time_ms=res.timing.device_time_ms,
                    flops=res.counts.flops, bytes_moved=res.counts.bytes_moved,
                    peak_memory_bytes=res.peak_memory_bytes, unsupported_ops=res.counts.unsupported_ops,
                )
            rows.append(row)
    return rows


class _Remeasure:
    """Measured components rebuilt on demand after the loop, whose captures were dropped, for the
    hierarchy re-measurement: re-captured group by group as they are asked for."""

    def __init__(self, order: Sequence[Component], outcomes: dict[str, dict[str, _Outcome]], captures: GroupedCaptures,
                 modules: dict[str, nn.Module], timing: TimingConfig, census: Capture) -> None:
        self.outcomes, self.captures, self.modules, self.timing, self.census = outcomes, captures, modules, timing, census
        self.measured = [c.path for c in order if any(o.status == "measured" for o in outcomes.get(c.path, {}).values())]
        self.built: dict[str, ComponentMeasurement] = {}
        # The components the re-measurement asks for (`needed`): a group is captured for them alone, its forwards stopping
        # after the last of them, not for every measured component after the first (one run of GPT-2 small at 2 x 128
        # spent 2.8 s re-measuring two pairs, 0.55 s of it in timed blocks: run.json breakdown_s).
        self.wanted: set[str] | None = None

    def needed(self, paths: Iterable[str]) -> None:
        self.wanted = set(paths)

    def _measurement(self, path: str, phase: str) -> ComponentMeasurement | None:
        outcome = self.outcomes.get(path, {}).get(phase)
        if outcome is None or outcome.status != "measured":
            return None
        if path in self.built:
            return self.built[path]
        if path not in self.captures.held:
            self.built = {}  # a new group replaces the held one: measurements of the old one are let go
        at = self.measured.index(path)
        try:
            calls = self.captures.calls(path, lambda: [p for p in self.measured[at:] if self.wanted is None or p in self.wanted])
            built = ComponentMeasurement(self.modules[path], calls, self.timing, self.census.graph_bytes(path),
                                         self.census.saved_bytes.get(path))
        except (_CaptureOutOfMemory, MemoryError, CbsiteError):  # a model that no longer runs: nothing re-measured
            return None
        except Exception as exc:  # noqa: BLE001 - measured once already; an allocation failure now is memory
            if memory.is_out_of_memory(exc):
                return None
            raise
        self.built[path] = built
        return built

    def statement(self, path: str, phase: str) -> tuple[Callable[[], Any], int] | None:
        """A measured component's timed statement of `phase` and its calls per statement."""
        m = self._measurement(path, phase)
        # One graph at a time: the pair's parent and child are held together (their graphs of every batch were
        # twice what any component held in the main loop).
        return None if m is None else (m.rotation(phase, one_graph=True), m.calls_per_batch)

    def drop(self) -> None:
        self.built = {}
        self.captures.drop()


def _counted(outcomes: dict[str, dict[str, _Outcome]], path: str, phase: str) -> Counts | None:
    """A measured phase's counting pass (its own, or its twin's), for check_peaks' component shapes."""
    outcome = outcomes.get(path, {}).get(phase)
    return outcome.result.counts if outcome is not None and outcome.result is not None else None


def _estimate(rows: list[dict[str, Any]], phases: Sequence[str], peak_flops: float | None, peak_bw: float | None) -> list[dict[str, Any]]:
    """Ratios for measured rows; sums of children for every non-leaf that has no number of its own."""
    for phase in phases:
        t = tree.build_tree(r for r in rows if r["phase"] == phase)
        for node in t:
            row = node.row
            if row["status"] == "measured":
                tree.derive_ratios(row, peak_flops, peak_bw)
            elif node.children and row["status"] in ("failed", "skipped"):
                if row["error"]:
                    row["notes"] = list(row["notes"] or []) + [f"not measured as a whole ({row['error']})"]
                row["status"] = "estimated"
        tree.estimate_containers(t, peak_flops, peak_bw)
    return rows
