"""Measure one component alone, from its captured calls: forward and backward, timed and counted.

Timing follows the design's rules (timing/: warm-up, blocks of about budget/20, the median with its IQR). Counting
(FLOPs, bytes, memory) runs in a separate, untimed pass, because dispatch modes and profilers add microseconds per op.
Backward is timed on graphs built from the captured inputs, without its forward (timing/graphs.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, cast

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cbsite.collector.capture import Call, Rider, describe, tensors_in
from cbsite.collector.counting import Counts, count, count_on_shapes
from cbsite.collector.cpu_memory import cpu_peak
from cbsite.collector.memory import trimmed_if_left
from cbsite.collector.timing.blocks import Timing, TimingConfig, time_fn
from cbsite.collector.timing.graphs import FreshGraphs, GradOutputs, Graph, GraphCycle, _grad, _grad_freeing
from cbsite.collector.timing.replay import (
    INPLACE_NOTE,
    FreshInputs,
    Replay,
    StateNotReplayable,
    _input_notes,
    _mutated_inputs,
    pool_limit,
    used_up,
)


class NothingToDifferentiate(Exception):
    """Backward is not applicable: no output requires grad or nothing to take a gradient for."""


@dataclass
class PhaseResult:
    timing: Timing
    counts: Counts
    peak_memory_bytes: int
    notes: list[str] = field(default_factory=list)
    # Wall seconds of the phase's untimed passes: "counting" (FLOPs and bytes), "memory_peaks" (the
    # allocator pass), "backward_graphs" (the forwards that build the graphs a backward is timed on).
    untimed_s: dict[str, float] = field(default_factory=dict)


# A component whose nearest measured ancestor's statement of a phase ran under this is counted on a real run, not first
# on fake tensors: a run that short (its own is part of its ancestor's) costs less than a pass on shapes, which pays per
# op for making and tracking fake tensors, and which a value-dependent op sends to a real run anyway. The counts are
# the same either way (count_on_shapes stands only where they are).
REAL_COUNT_BELOW_S = 0.01


PLUGIN_RUNS = 4  # fresh inputs made up front for a plugin's runs of a forward that changes its inputs


def phase_peak(device: str, fn: Callable[[], Any], excluded: Callable[[], Collection[int]] | None = None) -> int:
    """Peak bytes the phase allocates in one run of batch 0, from the allocator itself: CUDA's peak
    statistics, or on CPU the profiler's allocation events (not the census: see cpu_memory.py). `excluded` (CPU
    only): the live blocks the run made that are not the phase's (cpu_memory.cpu_peak)."""
    if device.startswith("cuda"):
        if excluded is not None:
            raise ValueError("CUDA's peak statistics cannot leave allocations out: no rider on CUDA")
        return _cuda_peak(fn)
    return cpu_peak(fn, excluded)


def _timed_peak(device: str, fn: Callable[[], Any], excluded: Callable[[], Collection[int]] | None = None) -> tuple[int, float]:
    """`phase_peak` and the wall seconds its (profiled, so slightly slower) run took."""
    t0 = time.perf_counter()
    peak = phase_peak(device, fn, excluded)
    return peak, time.perf_counter() - t0


def _cuda_peak(fn: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@dataclass(frozen=True)
class Known:
    """What an identical component's counting and peak passes found (twins.py): they stand for this one's."""

    counts: Counts  # per call
    peak: int
    source: str  # the twin's path
    # Seconds of one timed statement of the twin timed just before (twins.Source.statement_s): the same code on
    # the same shapes ran for this long right before, so time_fn treats it as this one's warm-up, as it does a
    # component's own counting and peak passes.
    warm_s: float = 0.0

    def note(self) -> str:
        return (f"FLOPs, bytes moved and peak memory counted on its twin {self.source or '<root>'} (same modules, "
                "parameters and input shapes, no value-dependent op); timed on its own inputs")


class ComponentMeasurement:
    """Replays one module's captured calls (several batches in rotation) for each phase."""

    def __init__(self, module: nn.Module, batches: list[list[Call]], cfg: TimingConfig,
                 graph_bytes: int | None = None, saved_bytes: int | None = None,
                 grad_outputs: GradOutputs | None = None) -> None:
        self.module = module
        self.grad_outputs = grad_outputs or GradOutputs()
        self.batches = [b for b in batches if b]
        self.cfg = cfg
        # Bytes autograd saves in one forward of this component (the capture's census), for the
        # decision between holding every batch's graph and building them one at a time.
        self.graph_bytes = graph_bytes
        # Of those, what autograd saved (activations): what a backward that frees its graph lets go as it goes.
        self.saved_bytes = saved_bytes
        self.calls_per_batch = len(self.batches[0])
        # In-place modules as the capture saw them in the full model (free); a replay only where it did not watch.
        problems = [p for b in self.batches for c in b if (p := used_up(c) or c.state_problem()) is not None]
        if problems:
            raise StateNotReplayable(problems[0])
        seen = [c.mutates_inputs for c in self.batches[0]]
        self.inplace = any(seen) if None not in seen else _mutated_inputs(module, self.batches[0][0])
        # Inputs that hold state the call changes (a cache grows): every run takes a copy of its own, as of the call,
        # made before any timed block, as an in-place module's inputs are (FreshInputs). Where it was not watched
        # (state_changed None), it is taken to.
        self.stateful = any(c.stateful and c.state_changed is not False for b in self.batches for c in b)
        self.fresh_per_call = self.inplace or self.stateful
        self.notes = _input_notes(self.batches, self.inplace)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.static = list(module.parameters()) + list(module.buffers())
        # Set by the collector when backward is measured right after forward with nothing in between (no
        # plugin replays): the forward phase then leaves the graphs its own runs built for backward to take
        # (`held`), instead of backward building them again with forwards of its own (one per graph).
        self.hold_graphs = False
        self.held: dict[int, Graph] = {}  # batch index -> a graph the forward phase's runs built
        # Backward's counts, peak and untimed seconds, taken on the forward peak pass's graph before forward was
        # timed: for a component that frees its graphs, which cannot hold that graph through forward's timing.
        self.early_backward: tuple[Counts, int, dict[str, float]] | None = None
        self.holding_s = 0.0  # seconds forward spent making the graphs it leaves (their grad_outputs): backward's graphs
        # Phases counted on a real run straight away (set by the collector where the nearest measured ancestor's
        # statement of that phase ran under REAL_COUNT_BELOW_S): the run is cheaper than the same pass on fake tensors.
        self.count_real: set[str] = set()
        # Set by the collector for the whole model on CPU (capture.Rider): the next capture group's inputs of batch 0
        # are captured during forward's peak pass, a forward that runs anyway, instead of in a forward of their own.
        self.rider: Rider | None = None

    def input_shapes(self) -> str:
        call = self.batches[0][0]
        return describe((call.args, call.kwargs))

    def _run(
        self, call_inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], grad_modes: list[bool], module: nn.Module | None = None
    ) -> list[Any]:
        """Call the module on each call's inputs as given (Replay.given): a run that changes them (in place, or a
        cache) must have been given its own (`_replay`, FreshInputs)."""
        module = module if module is not None else self.module
        outs = []
        for (args, kwargs), grad in zip(call_inputs, grad_modes):
            with torch.set_grad_enabled(grad):
                outs.append(module(*args, **kwargs))
        return outs

    def _replay(self, batch: list[Call], grad: bool | None = None) -> Replay:
        """Fresh inputs of every call of `batch` (capture.Call.replay_inputs: state objects copied from the snapshot),
        in each call's grad mode, or `grad` for all."""
        modes = [c.grad_enabled if grad is None else grad for c in batch]
        inputs = [c.replay_inputs(with_grad=m) for c, m in zip(batch, modes)]
        given = inputs
        if self.inplace:
            # Autograd refuses an in-place write into a leaf that requires grad: the module gets a copy (an input the
            # model had computed, as in the full model), made here, before any timing.
            given = [pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) and x.requires_grad else x, i)
                     if m else i for i, m in zip(inputs, modes)]
        return Replay(inputs, modes, given)

    def replay(self, phase: str, module: nn.Module | None = None) -> Callable[[], Any]:
        """One untimed run of `phase` on batch 0 (every call of the component), for profiler plugins.

        Inputs (and, for backward, the forward graph) are prepared here, before the callable is
        returned, so a profiler wrapped around it sees only the component's own work. `module`
        replaces the component (e.g. its compiled form) with the same inputs.
        """
        batch = self.batches[0]
        if phase == "forward":
            if self.fresh_per_call:
                # Each run on its own inputs: a few made now, outside whatever the plugin wraps around the runs.
                source = FreshInputs(lambda i: self._replay(batch), 1, [(c.args, c.kwargs) for c in batch],
                                     pool_limit(self.cfg.device))
                source.prepare(PLUGIN_RUNS)

                def fresh_run() -> list[Any]:
                    run = source.next()[1]
                    return self._run(run.given, run.modes, module)

                fresh_run.prepare = source.prepare  # type: ignore[attr-defined]  # a plugin that times it (time_fn)
                fresh_run.max_calls = source.max_calls  # type: ignore[attr-defined]
                return fresh_run
            run = self._replay(batch)
            return lambda: self._run(run.given, run.modes, module)
        roots, grads, wrt = self._graph(batch, seed=0, module=module)
        return lambda: torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)

    def rotation(self, phase: str, graphs: list[Any] | None = None, freeing: bool | None = None,
                 one_graph: bool = False, keep_last: bool = False,
                 keep_batches: Collection[int] = ()) -> Callable[[], Any]:
        """The timed statement of `phase`: one run of every call of batch i, cycling through the batches.

        Inputs (and for backward the forward graphs, one per batch) are prepared once, here, so the
        statement holds only the component's own work. The session's workers time the same statement.
        `keep_last` (forward): the statement keeps its last run's outputs (`statement.last`: batch index, inputs,
        grad modes, outputs), so that the graph that run built can serve backward. Each run lets the previous
        one's outputs go before it starts, as each run let its own go at its end before: a timed block still
        frees as many outputs as it makes, and never holds two.
        `keep_batches` (forward, with `keep_last`): also the last run of each of these batches (`statement.last`
        "every": batch index -> the run), where backward holds a graph of every batch anyway: a run on such a batch
        lets that batch's previous run go, so a block still frees as many outputs as it makes, and the statement holds
        one run per batch, what backward's rotation holds.
        """
        state = {"i": 0}
        if phase == "forward":
            source: FreshInputs | None = None
            if self.fresh_per_call:
                # Calls that change their inputs: each run on a copy of its own, made before the timed block.
                source = FreshInputs(lambda i: self._replay(self.batches[i]), len(self.batches),
                                     [(c.args, c.kwargs) for b in self.batches for c in b], pool_limit(self.cfg.device))
                next_run = source.next
            else:
                prepared = [self._replay(batch) for batch in self.batches]

                def next_run() -> tuple[int, Replay]:
                    index = state["i"] % len(prepared)
                    state["i"] += 1
                    return index, prepared[index]

            def forward_fn() -> None:
                run = next_run()[1]
                self._run(run.given, run.modes)

            last: dict[str, Any] = {}
            every: dict[int, Any] = {}
            last["every"] = every

            def forward_keeping() -> None:
                last.pop("run", None)
                index, run = next_run()
                every.pop(index, None)
                last["run"] = (index, run.inputs, run.modes, self._run(run.given, run.modes))
                if index in keep_batches:
                    every[index] = last["run"]

            statement = forward_keeping if keep_last else forward_fn
            if keep_last:
                forward_keeping.last = last  # type: ignore[attr-defined]
            if source is not None:
                statement.prepare = source.prepare  # type: ignore[attr-defined]
                statement.max_calls = source.max_calls  # type: ignore[attr-defined]
            return statement
        # `freeing`: the caller's choice (a comparison times both arms alike), else this component's own.
        if graphs is None and (self.frees_graphs() if freeing is None else freeing):
            return FreshGraphs(lambda i: self._graph(self.batches[i], seed=i), len(self.batches))
        # `one_graph`: hold one graph at a time even where every batch's would fit (a re-measurement times a
        # parent and its child interleaved, so both are held at once).
        if graphs is None and (one_graph or not self.graphs_fit()) and len(self.batches) > 1:
            return GraphCycle(lambda i: self._graph(self.batches[i], seed=i), len(self.batches), self._graph(self.batches[0], seed=0))
        graphs = graphs or [self._graph(batch, seed=i) for i, batch in enumerate(self.batches)]

        def backward_fn() -> None:
            roots, grads, wrt = graphs[state["i"] % len(graphs)]
            state["i"] += 1
            torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)

        return backward_fn

    def forward(self, known: Known | None = None) -> PhaseResult:
        """Count, take the allocator peak, then time. `known`: an identical component's counts and peak
        (twins.py), which stand for this one's; its passes are then replaced by one plain warm-up call, or none
        where the twin's statement timed just before outlasted a block (`Known.warm_s`). With `hold_graphs`, the graphs
        these runs build are left for backward (`held`, `early_backward`)."""
        notes = list(self.notes)
        if known is not None:
            statement = self.rotation("forward", keep_last=self.hold_graphs, keep_batches=self._keep_batches())
            timing = time_fn(statement, self.calls_per_batch, self.cfg, warm_s=known.warm_s)
            self._hold_last(statement)
            return PhaseResult(timing, known.counts, known.peak, notes + [known.note()] + timing.notes, _around(timing))
        # Each pass on inputs of its own where a call changes them (a counting pass on shapes leaves fake tensors in a
        # cache it grew); otherwise the passes share one set.
        first = self._replay(self.batches[0])
        runs = [first, self._replay(self.batches[0]), self._replay(self.batches[0])] if self.fresh_per_call else [first] * 3
        t0 = time.perf_counter()
        counts = (None if "forward" in self.count_real else
                  count_on_shapes(lambda: None, lambda _: self._run(runs[0].given, runs[0].modes), self.module.modules()))
        if counts is None:  # the output (and its graph) is let go at once
            counts = _counted_for_real(lambda: self._run(runs[1].given, runs[1].modes))
        counting_s = time.perf_counter() - t0
        # The allocator peak of one call, then timing, warmed by it (and by a real counting pass, where there was one).
        # The peak pass's outputs are kept only where backward takes their graph.
        outs: list[Any] = []
        first_inputs, first_modes = runs[2].inputs, runs[2].modes
        peak_pass = lambda: outs.append(self._run(runs[2].given, runs[2].modes))  # noqa: E731
        rider, self.rider = self.rider, None
        if rider is None:
            peak, peak_s = _timed_peak(self.cfg.device, peak_pass)
        else:  # its clones are not the component's: left out of the peak
            peak, peak_s = _timed_peak(self.cfg.device, rider.around(peak_pass), excluded=rider.storages)
        if self.hold_graphs:
            self._hold_peak_graph(self._left_graph(first_inputs, first_modes, outs.pop(), seed=0))
        outs.clear()
        runs.clear()  # the passes' copies are let go before timing
        # Made after the peak pass: a batch whose graph that pass left (`held`) is not kept again.
        statement = self.rotation("forward", keep_last=self.hold_graphs, keep_batches=self._keep_batches())
        timing = time_fn(statement, self.calls_per_batch, self.cfg, warm_s=peak_s)
        self._hold_last(statement)
        return PhaseResult(timing, per_call(counts, self.calls_per_batch), peak, notes + timing.notes,
                           {"counting": counting_s, "memory_peaks": peak_s, **_around(timing)})

    def _hold_peak_graph(self, graph: Graph | None) -> None:
        """Batch 0's graph from the forward peak pass. Held through forward's timing (beside the graph each timed run
        builds) only where backward holds a graph per batch anyway (several batches, within the allowance): a
        component replayed on batch 0 alone would hold two graphs where its backward holds one (a root's graphs can
        set the collection's peak). There forward's last timed run leaves batch 0's graph instead (`_hold_last`). A component that frees its graphs (past the allowance) takes its backward
        counting and peak pass on this graph now, before forward is timed (`early_backward`)."""
        if graph is None:
            return
        if not self.frees_graphs():
            if len(self.batches) > 1 and self.graphs_fit():
                self.held[0] = graph
            return
        t0 = time.perf_counter()
        shaped = self._backward_on_shapes(_grad_freeing)
        counting_s = time.perf_counter() - t0
        if shaped is None:
            return  # counted for real in backward, which uses a graph of its own up
        peak, peak_s = _timed_peak(self.cfg.device, lambda: _grad_freeing(graph))
        self.early_backward = (per_call(shaped, self.calls_per_batch), peak, {"counting": counting_s, "memory_peaks": peak_s})

    def _keep_batches(self) -> set[int]:
        """The batches whose last timed forward run is kept for backward (`rotation(keep_batches=...)`): every batch
        not held yet where backward holds a graph of every batch (they fit together, and are retained, not freed)."""
        if not self.hold_graphs or self.frees_graphs() or not self.graphs_fit():
            return set()
        return set(range(len(self.batches))) - set(self.held)

    def _hold_last(self, statement: Callable[[], Any]) -> None:
        """The graphs of forward's timed runs, held for backward where they add a batch backward needs and the
        graphs held stay within what backward itself would hold: the last run of every batch kept (`_keep_batches`),
        else the last run's. Where its graphs do not fit together it holds one at a time: any batch's where
        backward's counting and peak pass are done (`early_backward`), else batch 0's, which they take (another
        batch's would be held while they build batch 0's)."""
        last = getattr(statement, "last", {})
        run = last.pop("run", None)
        every = last.pop("every", {})
        runs = sorted(every.values()) if every else ([run] if run is not None else [])
        del run, every
        one_at_a_time = self.frees_graphs() or not self.graphs_fit()
        for index, inputs, modes, outs in runs:
            if index in self.held or (one_at_a_time and index != 0 and self.early_backward is None):
                continue
            graph = self._left_graph(inputs, modes, outs, seed=index)
            if graph is not None:
                self.held[index] = graph

    def _left_graph(self, inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], modes: list[bool], outs: list[Any],
                    seed: int) -> Graph | None:
        """`_graph_of` a run forward made, its seconds (drawing grad_outputs) counted as backward's graph time."""
        t0 = time.perf_counter()
        graph = self._graph_of(inputs, modes, outs, seed)
        self.holding_s += time.perf_counter() - t0
        return graph

    def _backward_on_shapes(self, differentiate: Callable[[Graph], Any]) -> Counts | None:
        """Backward's counts of batch 0 on a graph of fake tensors (counting.count_on_shapes), or None."""
        return count_on_shapes(lambda: self._graph(self.batches[0], seed=0), differentiate, self.module.modules())

    def _graph_of(self, inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], modes: list[bool], outs: list[Any],
                  seed: int) -> Graph | None:
        """(outputs to differentiate, their grad_outputs, tensors to differentiate for) of a run's calls with grad
        enabled, or None where there is nothing to differentiate. Seeded per batch: the same graph `_graph` builds."""
        live = [(i, o) for i, m, o in zip(inputs, modes, outs) if m]
        leaves = [t for t in tensors_in([i for i, _ in live]) if t.requires_grad]
        roots = [t for t in tensors_in([o for _, o in live]) if t.requires_grad and t.grad_fn is not None]
        wrt = leaves + self.params
        if not roots or not wrt:
            return None
        return roots, self.grad_outputs.of(roots, seed), wrt

    def _graph(
        self, batch: list[Call], seed: int, module: nn.Module | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Forward once with grad: (outputs to differentiate, their grad_outputs, tensors to differentiate for).

        Only the calls the full model made with grad enabled: a call under `torch.no_grad()` has no backward.
        """
        batch = [c for c in batch if c.grad_enabled]
        if not batch:
            raise NothingToDifferentiate(
                "every captured call ran with grad disabled (torch.no_grad or inference mode), so the model "
                "runs no backward through it"
            )
        run = self._replay(batch, grad=True)
        outs = self._run(run.given, run.modes, module)
        graph = self._graph_of(run.inputs, run.modes, outs, seed)
        if graph is None:
            roots = [t for t in tensors_in(outs) if t.requires_grad and t.grad_fn is not None]
            raise NothingToDifferentiate("no output requires grad" if not roots else "no input or parameter requires grad")
        return graph

    def graphs_fit(self) -> bool:
        """May the backward graphs of every batch be held at once (within the allowance)?"""
        allowance = self.cfg.graph_allowance_bytes
        if allowance is None or self.graph_bytes is None or len(self.batches) < 2:
            return True
        return (len(self.batches) - 1) * self.graph_bytes <= allowance

    def frees_graphs(self) -> bool:
        """Are the activations one graph of this component saved past the allowance? Then backward is timed as a
        training step runs it, freeing them as it goes (FreshGraphs), not on a retained graph. Only the saved
        activations count: freeing does not let go of the outputs and their gradients, which can be most of a language
        model's root graph (freeing it would cost time and save nothing)."""
        allowance = self.cfg.graph_allowance_bytes
        return allowance is not None and self.saved_bytes is not None and self.saved_bytes > allowance

    def backward(self, known: Known | None = None) -> PhaseResult:
        """As `forward`, on graphs built from the captured inputs (one per batch, one at a time, or a fresh one
        per call for a component whose graph is past the allowance)."""
        held, self.held = self.held, {}  # graphs the forward phase's runs built (hold_graphs), by batch
        untimed = {"backward_graphs": self.holding_s}
        self.holding_s = 0.0
        notes = [n for n in self.notes if not n.startswith(INPLACE_NOTE)]
        counts, peak, peak_s, first = self._backward_passes(known, held, untimed, notes)
        statement = self._backward_statement(held, first, untimed, notes)
        held.clear()
        del first
        if known is not None:
            peak_s = known.warm_s
        timing = time_fn(statement, self.calls_per_batch, self.cfg, warm_s=peak_s)
        untimed["backward_graphs"] += getattr(statement, "build_s", 0.0)
        untimed.update(_around(timing))
        del statement
        return PhaseResult(timing, counts, peak, notes + self._backward_notes() + timing.notes, untimed)

    def _batch0_graph(self, held: dict[int, Graph], untimed: dict[str, float]) -> Graph:
        """Batch 0's graph: the one the forward phase left, else built now (its seconds are backward's graph time)."""
        if 0 in held:
            return held.pop(0)
        t0 = time.perf_counter()
        built = self._graph(self.batches[0], seed=0)
        untimed["backward_graphs"] += time.perf_counter() - t0
        return built

    def _backward_passes(self, known: Known | None, held: dict[int, Graph], untimed: dict[str, float],
                         notes: list[str]) -> tuple[Counts, int, float | None, tuple[int, Graph | None]]:
        """Backward's counts, allocator peak and the seconds of its peak pass (its warm-up), and the first block's
        graph with its batch: taken from a twin (`known`), from the passes run on the forward peak pass's graph
        (`early_backward`), or counted and peaked here."""
        fresh = self.frees_graphs()
        differentiate = _grad_freeing if fresh else _grad
        early, self.early_backward = self.early_backward, None
        graph: Graph | None = None
        index = 0
        if known is not None or early is not None:
            if known is not None:
                counts, peak, peak_s = known.counts, known.peak, None
                notes.append(known.note())
            else:
                assert early is not None  # the branch's condition: a twin's figures or the early passes'
                # Its peak pass ran before forward was timed; it stands as the warm-up as a peak pass does elsewhere: a
                # component past the allowance streams its working set from memory on every call, so what forward's
                # timing did to the caches in between changes nothing a warm-up call would.
                counts, peak, early_untimed = early
                peak_s = early_untimed["memory_peaks"]
                untimed.update(early_untimed)
            # The first block's graph: one the forward phase left, else batch 0's (whose build also says whether there
            # is anything to differentiate; a twin's freeing timing would build its own, but not that).
            if held:
                index = min(held)
                graph = held.pop(index)
            elif not (fresh and early is not None):
                graph = self._batch0_graph(held, untimed)
            return counts, peak, peak_s, (index, graph)
        # The first graph serves the counting and peak passes and the first batch's timing.
        graph = self._batch0_graph(held, untimed)
        t1 = time.perf_counter()
        # On shapes where they stand for a real run (counting.count_on_shapes): a graph of fake tensors, which also
        # leaves the real one for the peak pass.
        shaped = None if "backward" in self.count_real else self._backward_on_shapes(differentiate)
        # cast: `graph` is set on this path (None only for the moment one is let go before the next is built).
        counts = per_call(shaped or _counted_for_real(lambda: differentiate(cast(Graph, graph))), self.calls_per_batch)
        untimed["counting"] = time.perf_counter() - t1
        if fresh and shaped is None:  # the counting pass used the graph up: another for the peak pass, the first let go first
            graph = None
            graph = self._batch0_graph(held, untimed)
        # The allocator peak of one call, before timing: a graph cycle may hold
        # another batch's graph once timing ends.
        peak, peak_s = _timed_peak(self.cfg.device, lambda: differentiate(cast(Graph, graph)))
        untimed["memory_peaks"] = peak_s
        if fresh:  # used up by the peak pass; a graph the forward phase left serves the first block
            graph = None
            if held:
                index = min(held)
                graph = held.pop(index)
        return counts, peak, peak_s, (index, graph)

    def _backward_statement(self, held: dict[int, Graph], first: tuple[int, Graph | None], untimed: dict[str, float],
                            notes: list[str]) -> Callable[[], Any]:
        """The timed statement of backward, starting on `first` (batch index, graph): freeing, a rotation over
        every batch's graph, or a cycle that holds one graph at a time."""
        index, graph = first
        build = lambda i: self._graph(self.batches[i], seed=i)  # noqa: E731
        if self.frees_graphs():
            assert self.saved_bytes is not None and self.cfg.graph_allowance_bytes is not None  # frees_graphs() says so
            notes.append(
                f"backward timed as a training step runs it: each call on a graph of its own, freed as it goes; the "
                f"activations one graph saves ({self.saved_bytes / 2**20:,.0f} MiB) are past the collection's allowance "
                f"of {self.cfg.graph_allowance_bytes / 2**20:,.0f} MiB for holding graphs"
            )
            return FreshGraphs(build, len(self.batches), None if graph is None else (index, graph))
        if self.graphs_fit():
            graphs: list[Graph | None] = [held.pop(i, None) for i in range(len(self.batches))]
            graphs[index] = graph
            t0 = time.perf_counter()
            graphs = [g if g is not None else build(i) for i, g in enumerate(graphs)]
            untimed["backward_graphs"] += time.perf_counter() - t0
            return self.rotation("backward", graphs)
        # Not freeing: _backward_passes left batch `index`'s graph; not fitting: only with an allowance and graph bytes.
        assert graph is not None and self.graph_bytes is not None and self.cfg.graph_allowance_bytes is not None
        notes.append(
            f"backward graphs built one batch at a time (rotation batch by batch between blocks): the graphs "
            f"of {len(self.batches)} batches would hold {len(self.batches) * self.graph_bytes / 2**20:,.0f} MiB "
            f"at once, past the collection's allowance of {self.cfg.graph_allowance_bytes / 2**20:,.0f} MiB"
        )
        return GraphCycle(build, len(self.batches), graph, index)

    def _backward_notes(self) -> list[str]:
        """What a backward row says about the calls it covers and the gradients it writes."""
        notes = []
        live = sum(c.grad_enabled for c in self.batches[0])
        if live < self.calls_per_batch:
            notes.append(
                f"backward of {live} of {self.calls_per_batch} calls per forward (the others ran with grad disabled); "
                "figures are per call over all of them"
            )
        dense_tables = [
            m for m in self.module.modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and not m.sparse and m.weight.requires_grad
        ]
        if dense_tables:
            rows = sum(m.num_embeddings for m in dense_tables)
            notes.append(
                f"dense embedding gradient: backward writes whole tables ({rows} rows), not just the rows looked up"
            )
        return notes


def _counted_for_real(fn: Callable[[], Any]) -> Counts:
    """`count` of a real run of `fn`, its result let go at once; as after a peak pass (cpu_memory.cpu_peak), a run
    that left more than memory.TRIM_LEFT_BYTES resident has its freed heap handed back before timing allocates
    beside it."""
    with trimmed_if_left():
        return count(fn)[1]


def _around(timing: Timing) -> dict[str, float]:
    """The untimed work around a phase's timed blocks, for run.json's breakdown."""
    return {"warm_up": timing.warm_up_s, "block_sizing": timing.sizing_s}


def per_call(counts: Counts, calls: int) -> Counts:
    """Counts of one call from those of `calls` calls."""
    if calls == 1:
        return counts
    return Counts(
        flops=counts.flops // calls,
        bytes_moved=counts.bytes_moved // calls,
        unsupported_ops=counts.unsupported_ops,
        flops_by_op={k: v // calls for k, v in counts.flops_by_op.items()},
        op_calls=counts.op_calls,
        value_dependent=counts.value_dependent,
        matmul_calls=counts.matmul_calls,  # a ceiling is a ratio of sums: all calls of the batch, undivided
        undescribed_matmuls=counts.undescribed_matmuls,
        on_shapes=counts.on_shapes,
    )
