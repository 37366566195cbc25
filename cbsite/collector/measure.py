"""Measure one component alone, from its captured calls: forward and backward, timed and counted.

Timing follows the design's rules: warm-up, then `torch.utils.benchmark.Timer.blocked_autorange`
(it synchronises CUDA and sizes the number of runs); latency is the median of the timed blocks with
their IQR kept. Counting (FLOPs, bytes, memory) runs in a separate, untimed pass, because dispatch
modes and profilers add microseconds per op.

Backward is timed without its forward: the forward runs once with inputs requiring grad exactly as in
the full model, then `torch.autograd.grad(outputs, wrt, grad_outputs, retain_graph=True)` is timed with
fixed seeded grad_outputs. `autograd.grad` returns gradients instead of accumulating them into `.grad`,
so every timed iteration does identical work and nothing has to be cleared inside the timed region.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.benchmark import Timer

from cbsite.collector.capture import Call, describe, tensors_in
from cbsite.collector.counting import Counts, count
from cbsite.collector.cpu_memory import cpu_peak


class NothingToDifferentiate(Exception):
    """Backward is not applicable: no output requires grad or nothing to take a gradient for."""


@dataclass
class Timing:
    median_ms: float
    p25_ms: float
    p75_ms: float
    samples: int
    cpu_time_ms: float
    device_time_ms: float | None
    timed_s: float = 0.0  # wall seconds spent inside Timer's timed blocks (the floor of any collector)


@dataclass
class PhaseResult:
    timing: Timing
    counts: Counts
    peak_memory_bytes: int
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TimingConfig:
    min_run_time: float = 0.1  # seconds of timed runs per component and phase
    warmup: int = 3
    num_threads: int = 1
    device: str = "cpu"


MIN_BLOCKS = 5


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], Any], calls_per_stmt: int, cfg: TimingConfig) -> Timing:
    """Time `fn` (which makes `calls_per_stmt` calls of the component) and return per-call figures."""
    for _ in range(cfg.warmup):
        fn()
    _sync(cfg.device)
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=cfg.num_threads)
    m = timer.blocked_autorange(min_run_time=cfg.min_run_time)
    times = list(m.times)  # seconds per stmt, one value per timed block
    # A component slower than the budget gets one block; a median and quartiles need a few more.
    while len(times) < MIN_BLOCKS:
        times.extend(timer.timeit(m.number_per_run).times)
    times.sort()
    if len(times) >= 2:
        q = statistics.quantiles(times, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = times[0]
    per_call = 1e3 / calls_per_stmt
    # CPU time of the whole process (all intra-op threads) over a short untimed-by-Timer loop: beside
    # the wall latency it shows how parallel the component runs.
    loops = max(1, min(m.number_per_run * len(times), int(cfg.min_run_time / 4 / max(times[len(times) // 2], 1e-9))))
    cpu0 = time.process_time()
    for _ in range(loops):
        fn()
    _sync(cfg.device)
    cpu_ms = (time.process_time() - cpu0) / loops * per_call
    device_ms = None
    if cfg.device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(loops):
            fn()
        end.record()
        torch.cuda.synchronize()
        device_ms = start.elapsed_time(end) / loops / calls_per_stmt
    return Timing(
        median_ms=statistics.median(times) * per_call,
        p25_ms=p25 * per_call,
        p75_ms=p75 * per_call,
        samples=m.number_per_run * len(times),
        cpu_time_ms=cpu_ms,
        device_time_ms=device_ms,
        timed_s=sum(times) * m.number_per_run,
    )


def _peak(device: str, fn: Callable[[], Any]) -> int:
    """Peak bytes the phase allocates in one run of batch 0, from the allocator itself: CUDA's peak
    statistics, or on CPU the profiler's allocation events (not the census: see cpu_memory.py)."""
    return _cuda_peak(fn) if device.startswith("cuda") else cpu_peak(fn)


def _cuda_peak(fn: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _mutated_inputs(module: nn.Module, call: Call) -> bool:
    """Does the module write into its inputs (an in-place activation, say)?"""
    args, kwargs = call.replay_inputs(with_grad=False)
    leaves = tensors_in((args, kwargs))
    before = [t._version for t in leaves]
    with torch.no_grad():
        module(*args, **kwargs)
    return any(t._version != v for t, v in zip(leaves, before))


class ComponentMeasurement:
    """Replays one module's captured calls (several batches in rotation) for each phase."""

    def __init__(self, module: nn.Module, batches: list[list[Call]], cfg: TimingConfig) -> None:
        self.module = module
        self.batches = [b for b in batches if b]
        self.cfg = cfg
        self.calls_per_batch = len(self.batches[0])
        self.inplace = _mutated_inputs(module, self.batches[0][0])
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.static = list(module.parameters()) + list(module.buffers())

    def input_shapes(self) -> str:
        call = self.batches[0][0]
        return describe((call.args, call.kwargs))

    def _run(
        self, call_inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], grad_modes: list[bool], module: nn.Module | None = None
    ) -> list[Any]:
        module = module if module is not None else self.module
        outs = []
        for (args, kwargs), grad in zip(call_inputs, grad_modes):
            if self.inplace:
                # In-place modules write into their input: give each run its own copy (its cost is
                # included and noted) so repeated runs see the same values and no leaf is modified.
                args, kwargs = torch.utils._pytree.tree_map(
                    lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (args, kwargs)
                )
            with torch.set_grad_enabled(grad):
                outs.append(module(*args, **kwargs))
        return outs

    def replay(self, phase: str, module: nn.Module | None = None) -> Callable[[], Any]:
        """One untimed run of `phase` on batch 0 (every call of the component), for profiler plugins.

        Inputs (and, for backward, the forward graph) are prepared here, before the callable is
        returned, so a profiler wrapped around it sees only the component's own work. `module`
        replaces the component (e.g. its compiled form) with the same inputs.
        """
        batch = self.batches[0]
        if phase == "forward":
            inputs = [c.replay_inputs(with_grad=c.grad_enabled) for c in batch]
            modes = [c.grad_enabled for c in batch]
            return lambda: self._run(inputs, modes, module)
        roots, grads, wrt = self._graph(batch, seed=0, module=module)
        return lambda: torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)

    def forward(self) -> PhaseResult:
        prepared = [
            ([c.replay_inputs(with_grad=c.grad_enabled) for c in batch], [c.grad_enabled for c in batch])
            for batch in self.batches
        ]
        state = {"i": 0}

        def fn() -> None:
            inputs, modes = prepared[state["i"] % len(prepared)]
            state["i"] += 1
            self._run(inputs, modes)

        first_inputs, first_modes = prepared[0]
        _, counts = count(lambda: self._run(first_inputs, first_modes))
        timing = time_fn(fn, self.calls_per_batch, self.cfg)
        peak = _peak(self.cfg.device, lambda: self._run(first_inputs, first_modes))
        notes = ["timed with a copy of the inputs per run (in-place module)"] if self.inplace else []
        return PhaseResult(timing, _per_call(counts, self.calls_per_batch), peak, notes)

    def _graph(
        self, batch: list[Call], seed: int, module: nn.Module | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Forward once with grad: (outputs to differentiate, their grad_outputs, tensors to differentiate for)."""
        inputs = [c.replay_inputs(with_grad=True) for c in batch]
        leaves = [t for t in tensors_in(inputs) if t.requires_grad]
        outs = self._run(inputs, [True] * len(batch), module)
        roots = [t for t in tensors_in(outs) if t.requires_grad and t.grad_fn is not None]
        wrt = leaves + self.params
        if not roots or not wrt:
            raise NothingToDifferentiate(
                "no output requires grad" if not roots else "no input or parameter requires grad"
            )
        gen = torch.Generator(device=roots[0].device).manual_seed(seed)
        grads = [torch.randn(r.shape, dtype=r.dtype, device=r.device, generator=gen) for r in roots]
        return roots, grads, wrt

    def backward(self) -> PhaseResult:
        graphs = [self._graph(batch, seed=i) for i, batch in enumerate(self.batches)]
        state = {"i": 0}

        def grad_of(graph: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]) -> Any:
            roots, grads, wrt = graph
            return torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)

        def fn() -> None:
            grad_of(graphs[state["i"] % len(graphs)])
            state["i"] += 1

        roots, grads, wrt = graphs[0]
        _, counts = count(lambda: grad_of(graphs[0]))
        timing = time_fn(fn, self.calls_per_batch, self.cfg)
        peak = _peak(self.cfg.device, lambda: grad_of(graphs[0]))
        notes = []
        dense_tables = [
            m for m in self.module.modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and not m.sparse and m.weight.requires_grad
        ]
        if dense_tables:
            rows = sum(m.num_embeddings for m in dense_tables)
            notes.append(
                f"dense embedding gradient: backward writes whole tables ({rows} rows), not just the rows looked up"
            )
        return PhaseResult(timing, _per_call(counts, self.calls_per_batch), peak, notes)


def _per_call(counts: Counts, calls: int) -> Counts:
    if calls == 1:
        return counts
    return Counts(
        flops=counts.flops // calls,
        bytes_moved=counts.bytes_moved // calls,
        unsupported_ops=counts.unsupported_ops,
        flops_by_op={k: v // calls for k, v in counts.flops_by_op.items()},
        op_calls=counts.op_calls,
    )
