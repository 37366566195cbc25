"""Backward takes the graphs forward's own runs built (measure.ComponentMeasurement.hold_graphs).

Building a backward graph is a forward of the component; the forward phase has just run that forward twice
(its peak pass and its timed runs). These tests check that backward, given those graphs, measures exactly what it
measured on graphs of its own (counts, allocator peak, gradients) while making fewer forwards, and that it never
holds more graphs at once than the allowance lets it.
"""

from __future__ import annotations

import torch
from torch import nn

from cbsite.collector.capture import capture
from cbsite.collector.measure import ComponentMeasurement
from cbsite.collector.timing.blocks import TimingConfig
from cbsite.collector.timing.graphs import FreshGraphs, _grad


class Counted(nn.Module):
    """A small block that counts its forwards (one per run of the component, one per graph built)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.net(x) + x


def _batches(model: nn.Module, n: int) -> list:
    torch.manual_seed(0)
    return [capture(model, (torch.randn(16, 32, requires_grad=True),), {}, grad=True).calls[""] for _ in range(n)]


def _both_phases(model: Counted, batches: list, cfg: TimingConfig, hold: bool, **sizes) -> tuple:
    m = ComponentMeasurement(model, batches, cfg, **sizes)
    m.hold_graphs = hold
    fwd = m.forward()
    before = model.forwards
    bwd = m.backward()
    return m, fwd, bwd, model.forwards - before


CFG = TimingConfig(min_run_time=0.005, warmup=1)


def test_backward_on_the_forward_phases_graphs_counts_and_peaks_as_on_its_own_and_builds_none():
    model = Counted()
    batches = _batches(model, 1)
    _, fwd_own, bwd_own, built_own = _both_phases(model, batches, CFG, hold=False)
    m, fwd_held, bwd_held, built_held = _both_phases(model, batches, CFG, hold=True)
    assert built_own == 1 and built_held == 0  # batch 0's graph came from the forward peak pass
    assert m.held == {} and m.early_backward is None  # nothing outlives the backward phase
    for own, held in ((fwd_own, fwd_held), (bwd_own, bwd_held)):
        assert (own.counts.flops, own.counts.bytes_moved) == (held.counts.flops, held.counts.bytes_moved)
        assert own.peak_memory_bytes == held.peak_memory_bytes


def test_a_graph_left_by_forwards_timed_run_is_the_graph_backward_would_build():
    model = Counted()
    batches = _batches(model, 3)
    m = ComponentMeasurement(model, batches, CFG)
    stmt = m.rotation("forward", keep_last=True)
    for _ in range(5):  # batches 0, 1, 2, 0, 1: the last run was batch 1
        stmt()
    index, inputs, modes, outs = stmt.last.pop("run")
    assert index == 1
    left = m._graph_of(inputs, modes, outs, seed=index)
    built = m._graph(batches[1], seed=1)
    for a, b in zip(_grad(left), _grad(built)):
        assert torch.equal(a, b)
    # A statement that keeps nothing is the plain one.
    assert not hasattr(m.rotation("forward"), "last")
    # Keeping batches 1 and 2: the last run of each, one run per batch at any time, and batch 0's runs let go.
    stmt = m.rotation("forward", keep_last=True, keep_batches={1, 2})
    kept = []
    for _ in range(5):  # batches 0, 1, 2, 0, 1
        stmt()
        kept.append(sorted(stmt.last["every"]))
    assert kept == [[], [1], [1, 2], [1, 2], [1, 2]]
    assert stmt.last["every"][1] is stmt.last["run"]
    index, inputs, modes, outs = stmt.last["every"][2]
    left = m._graph_of(inputs, modes, outs, seed=index)
    for a, b in zip(_grad(left), _grad(m._graph(batches[2], seed=2))):
        assert torch.equal(a, b)


def test_rotating_backward_takes_every_graph_forward_left_and_builds_the_rest():
    model = Counted()
    batches = _batches(model, 3)
    m = ComponentMeasurement(model, batches, CFG)
    m.hold_graphs = True
    m.forward()
    assert m.graphs_fit()
    # Batch 0 from the peak pass, every other batch from the last of forward's timed runs on it: backward builds none.
    assert set(m.held) == {0, 1, 2}
    before = model.forwards
    bwd = m.backward()
    assert model.forwards == before
    _, _, own, built_own = _both_phases(model, batches, CFG, hold=False)
    assert built_own == 3
    assert (own.counts.flops, own.peak_memory_bytes) == (bwd.counts.flops, bwd.peak_memory_bytes)


def test_forwards_timing_holds_another_graph_only_where_backward_holds_one_per_batch(monkeypatch):
    import cbsite.collector.measure as measure

    held_at_timing = []
    real_time_fn = measure.time_fn

    def watching(fn, *args, **kwargs):
        held_at_timing.append(len(m.held))
        return real_time_fn(fn, *args, **kwargs)

    monkeypatch.setattr(measure, "time_fn", watching)
    model = Counted()
    three = _batches(model, 3)
    # Several batches whose graphs fit together: the peak pass's graph is held beside each timed run's.
    m = ComponentMeasurement(model, three, CFG, graph_bytes=10_000)
    m.hold_graphs = True
    m.forward()
    assert held_at_timing[-1] == 1
    # One graph fits, two do not: forward's timing holds none beside the one it builds, and only a batch 0 graph is
    # left for backward (its peak pass and first block take batch 0).
    tight = TimingConfig(min_run_time=0.005, warmup=1, graph_allowance_bytes=15_000)
    m = ComponentMeasurement(model, three, tight, graph_bytes=10_000)
    m.hold_graphs = True
    m.forward()
    assert held_at_timing[-1] == 0 and set(m.held) <= {0}
    # Replayed on batch 0 alone: backward holds one graph, so forward's timing holds none beside its own; its last
    # timed run leaves batch 0's graph, and backward builds none.
    m = ComponentMeasurement(model, three[:1], CFG, graph_bytes=10_000)
    m.hold_graphs = True
    m.forward()
    assert held_at_timing[-1] == 0 and set(m.held) == {0}
    before = model.forwards
    m.backward()
    assert model.forwards == before


def test_a_freeing_component_takes_backwards_passes_on_the_peak_pass_graph_before_forward_is_timed():
    model = Counted()
    batches = _batches(model, 2)
    # No warm-up calls (each would take a graph, and whether a phase gets one depends on how long its peak pass took).
    cfg = TimingConfig(min_run_time=0.005, warmup=0, graph_allowance_bytes=5_000)
    sizes = dict(graph_bytes=10_000, saved_bytes=6_000)
    m, fwd_held, bwd_held, built_held = _both_phases(model, batches, cfg, hold=True, **sizes)
    assert m.frees_graphs()
    _, fwd_own, bwd_own, built_own = _both_phases(model, batches, cfg, hold=False, **sizes)
    assert (bwd_own.counts.flops, bwd_own.counts.bytes_moved) == (bwd_held.counts.flops, bwd_held.counts.bytes_moved)
    assert bwd_own.peak_memory_bytes == bwd_held.peak_memory_bytes
    assert fwd_own.peak_memory_bytes == fwd_held.peak_memory_bytes
    # Every call takes a graph. On its own backward builds one for the peak pass and one per block; held, the peak
    # pass took the forward peak pass's graph and the first block forward's last timed run's: two forwards fewer.
    assert built_own == len(bwd_own.timing.blocks) + 1
    assert built_held == len(bwd_held.timing.blocks) - 1
    assert all(b.calls == 1 for b in bwd_held.timing.blocks)
    assert any("each call on a graph of its own" in n for n in bwd_held.notes)


def test_fresh_graphs_start_on_a_given_graph_and_go_on_with_the_next_batch():
    model = Counted()
    batches = _batches(model, 3)
    m = ComponentMeasurement(model, batches, CFG)
    first = m._graph(batches[2], seed=2)
    built = []
    stmt = FreshGraphs(lambda i: built.append(i) or m._graph(batches[i], seed=i), 3, (2, first))
    for block in range(3):
        stmt.before_block(block, 3)
        stmt()
    assert built == [0, 1]


def test_grad_outputs_past_the_tile_repeat_the_drawn_values_in_order(monkeypatch):
    from cbsite.collector import random_values
    from cbsite.collector.timing.graphs import GradOutputs

    monkeypatch.setattr(random_values, "NORMAL_TILE", 16)
    small, large = torch.zeros(3, 5), torch.zeros(5, 7)  # 15 values: drawn; 35: two tiles and 3 values
    drawn = torch.randn(16, generator=torch.Generator().manual_seed(4))
    got_small, got_large = GradOutputs().of([small], seed=4)[0], GradOutputs().of([large], seed=4)[0]
    assert torch.equal(got_small, torch.randn(3, 5, generator=torch.Generator().manual_seed(4)))
    assert got_large.shape == (5, 7) and got_large.is_contiguous()
    assert torch.equal(got_large.flatten(), torch.cat([drawn, drawn, drawn[:3]]))


def test_grad_outputs_drawn_once_per_batch_and_shape_are_the_values_drawn_anew():
    from cbsite.collector.timing.graphs import GradOutputs

    roots = [torch.zeros(4, 8), torch.zeros(3)]
    fresh = GradOutputs().of(roots, seed=1)
    kept = GradOutputs(limit_bytes=1 << 20)
    first, again = kept.of(roots, seed=1), kept.of([torch.ones(4, 8), torch.ones(3)], seed=1)
    assert again is first and all(torch.equal(a, b) for a, b in zip(first, fresh))
    assert not torch.equal(kept.of(roots, seed=2)[0], first[0])  # another batch, other values
    assert kept.kept_bytes == 2 * (32 + 3) * 4
    tight = GradOutputs(limit_bytes=100)  # past the limit: drawn each time, never kept
    assert tight.of(roots, seed=1) is not tight.of(roots, seed=1) and tight.kept_bytes == 0
    # Twins share them: the same shapes, the same batch.
    model_a, model_b = Counted(), Counted()
    batches = _batches(model_a, 1)
    a = ComponentMeasurement(model_a, batches, CFG, grad_outputs=kept)
    b = ComponentMeasurement(model_b, batches, CFG, grad_outputs=kept)
    assert a._graph(batches[0], seed=0)[1] is b._graph(batches[0], seed=0)[1]
