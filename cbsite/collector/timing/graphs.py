"""The backward statements: `torch.autograd.grad` on graphs built from a component's captured inputs.

Backward is timed without its forward: the forward runs once with inputs requiring grad exactly as in the full model,
then `torch.autograd.grad(outputs, wrt, grad_outputs, retain_graph=True)` is timed with fixed seeded grad_outputs.
`autograd.grad` returns gradients instead of accumulating them into `.grad`, so every timed iteration does identical
work and nothing has to be cleared inside the timed region. Graphs past the collection's allowance are held one at a
time (GraphCycle) or freed as a training step frees them (FreshGraphs).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch

from cbsite.collector.random_values import normal_values

Graph = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]  # (roots, grad_outputs, wrt)


def _grad(graph: Graph) -> Any:
    roots, grads, wrt = graph
    return torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)


def _grad_freeing(graph: Graph) -> Any:
    roots, grads, wrt = graph
    return torch.autograd.grad(roots, wrt, grads, allow_unused=True)


class GraphCycle:
    """The backward statement when the graphs of every batch would not fit in memory together: one
    graph at a time, the batches taken in turn between timed blocks instead of call by call.

    Each batch gets a run of consecutive blocks (expected blocks / batches, rounded up: five blocks on two batches
    are three and two, one graph built between them, not two and two and a last one that builds batch 0's again);
    the graph of the next batch is built (untimed, `build_s`) only after the previous one is freed, so the component
    holds one graph, as a training step does. A component this large streams its working set from memory on every
    call, so whether consecutive calls see the same batch does not change what is cached.
    """

    def __init__(self, build: Callable[[int], Graph], batches: int, first: Graph, index: int = 0) -> None:
        self.build = build
        self.batches = batches
        self.index = index  # the batch of `first` (a graph the forward phase left, ComponentMeasurement.held)
        self.start = index  # the turn starts there
        self.graph: Graph = first
        self.switches = 0
        self.build_s = 0.0  # untimed seconds spent building graphs between blocks

    def __call__(self) -> Any:
        return _grad(self.graph)

    def before_block(self, index: int, expected: int) -> bool:
        """Move to the batch block `index` takes; True where that is another graph than the last block's."""
        per_batch = max(1, math.ceil(expected / self.batches))
        wanted = (index // per_batch + self.start) % self.batches
        if wanted == self.index:
            return False
        t0 = time.perf_counter()
        self.graph = None  # type: ignore[assignment]  # freed first: never two graphs at once; build() sets it
        self.graph = self.build(wanted)
        self.build_s += time.perf_counter() - t0
        self.index = wanted
        self.switches += 1
        return True


class FreshGraphs:
    """The backward statement of a component whose graph saves more activations than the collection's allowance
    (a language model's root at a large batch): every call differentiates a graph of its own without `retain_graph`,
    so the saved activations are freed as backward goes, as a training step frees them. A retained graph keeps them
    all through backward, past what a plain step holds (benchmarks/backward_memory.py), and a root's retained graph
    can set the peak of the whole collection.

    A graph is used once, so a block is one call and its graph is built (untimed) just before it, the batches
    taken in turn; time_fn and hierarchy.remeasure keep one call per block for it (`one_call_per_block`). A
    component this large runs for far longer than a block, so it had one call per block anyway.
    """

    one_call_per_block = True

    def __init__(self, build: Callable[[int], Graph], batches: int, first: tuple[int, Graph] | None = None) -> None:
        self.build = build
        self.batches = batches
        self.graph: Graph | None = None
        self.built = 0
        if first is not None:  # a graph the forward phase left (ComponentMeasurement.held): the first block's
            self.built, self.graph = first[0] + 1, first[1]
        self.build_s = 0.0  # untimed seconds spent building graphs between blocks

    def _ready(self) -> Graph:
        if self.graph is None:
            self.graph = self.build(self.built % self.batches)
            self.built += 1
        return self.graph

    def __call__(self) -> Any:
        graph = self._ready()  # builds only outside timed blocks (a warm-up call): before_block built a timed one's
        self.graph = None
        return _grad_freeing(graph)

    def before_block(self, index: int, expected: int) -> None:
        t0 = time.perf_counter()
        self._ready()
        self.build_s += time.perf_counter() - t0


class GradOutputs:
    """The fixed seeded `grad_outputs` of backward graphs: per batch, standard normal values drawn in order from a
    generator seeded with the batch's index, shaped as the graph's outputs (past random_values.NORMAL_TILE values, the
    drawn ones repeat: `random_values.normal_values`).

    Drawing normal values is slow next to most of the work they serve (a language model's logits are batch x sequence x
    vocabulary of them per graph), and a collection draws the same ones again and again: a component's graphs of one
    batch, and its twins' (a transformer's blocks, and everything in them, have outputs of the same shapes). `limit_bytes` > 0 keeps those drawn, up to that
    many bytes, for the rest of the collection; the values are the same either way (autograd only reads them)."""

    def __init__(self, limit_bytes: int = 0) -> None:
        self.limit_bytes = limit_bytes
        self.kept: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self.kept_bytes = 0

    def of(self, roots: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
        from torch._subclasses.fake_tensor import FakeTensor

        if any(isinstance(r, FakeTensor) for r in roots):
            # A graph of fake tensors (counting on shapes) gets fake values, never kept: a real graph of the same shapes
            # given them would run fake tensors through meta kernels (a MoE model's `_grouped_mm` backward).
            gen = torch.Generator(device=roots[0].device).manual_seed(seed)
            return [normal_values(r.shape, r.dtype, r.device, gen) for r in roots]
        key = (seed, tuple((tuple(r.shape), r.dtype, str(r.device)) for r in roots))
        if key in self.kept:
            return self.kept[key]
        gen = torch.Generator(device=roots[0].device).manual_seed(seed)
        grads = [normal_values(r.shape, r.dtype, r.device, gen) for r in roots]
        size = sum(g.numel() * g.element_size() for g in grads)
        if self.kept_bytes + size <= self.limit_bytes:
            self.kept[key] = grads
            self.kept_bytes += size
        return grads
