"""Anchors (anchors.py): a group of modules inside an outer module is captured by replaying that module's captured
calls, not by a forward of the whole model, and only where the replay stands for the forward."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from cbsite.collector.anchors import anchors_of
from cbsite.collector.capture import capture
from cbsite.collector.plan import breadth_first, component_tree


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Stack(nn.Module):
    """An embedding-like input layer, blocks in a container that is never called itself, a head; `autocast`
    runs the middle block under bfloat16 autocast (its inner modules then receive bfloat16 activations)."""

    def __init__(self, width: int = 16, depth: int = 3, autocast: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)
        self.autocast = autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for i, block in enumerate(self.blocks):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast and i == 1):
                x = block(x)
            x = x.float()
        return self.head(x)


class SharedInner(nn.Module):
    """Block b calls block a's fc1 too: a module registered under one anchor and called from another."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.a, self.b = Block(16), Block(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(self.inp(x))
        return self.b(x) + self.a.fc1(x)[..., :16]


def _grouped(model: nn.Module, batches: list, anchors: bool = True):
    """Every component captured in measuring order, one group per component (a tiny allowance), batch 0 not taken
    from the census: the worst case for forwards. Returns the captures and each component's calls per batch."""
    from cbsite.collector.pipeline.capture_plan import planned_captures

    census, plan, captures = planned_captures(model, batches, True, torch.device("cpu"))
    captures.anchors.fit(plan.input_bytes, plan.batches_for, plan.allowance_bytes)  # kept: the plan's own allowance
    captures.plan = dataclasses.replace(plan, allowance_bytes=1, headroom_bytes=0)
    captures.batch0 = None
    if not anchors:
        captures.anchors.let_go("turned off by the test")
    order = [c.path for c in breadth_first(component_tree(model)) if census.call_count(c.path) > 0]
    got = {}
    for at, path in enumerate(order):
        got[path] = captures.calls(path, lambda at=at: order[at:])
    return captures, got


def _batches(n: int = 3) -> list:
    return [((torch.randn(5, 8, generator=torch.Generator().manual_seed(i)),), {}) for i in range(n)]


def tight_allowance(monkeypatch):
    """A 4-block Stack, three batches, and an allowance just above what the blocks' inputs take (the census cannot keep
    batch 0, as GPT-2 small's at 8 x 512): (model, batches, the blocks' input bytes)."""
    from cbsite.collector import memory
    from cbsite.collector.pipeline.capture_plan import planned_captures

    torch.manual_seed(0)
    model = Stack(width=64, depth=4)
    batches = [((torch.randn(64, 8),), {}) for _ in range(3)]
    _, plan, _ = planned_captures(model, batches, True, torch.device("cpu"))
    blocks = sum(plan.input_bytes[f"blocks.{k}"] * plan.batches_for(f"blocks.{k}") for k in range(4))
    monkeypatch.setattr(memory, "MIN_ALLOWANCE", blocks + 1)
    monkeypatch.setattr(memory, "EXTRA_FRACTION", 1e-12)
    return model, batches, blocks


def work(run):
    """What a run measured: (path, phase, FLOPs, input shapes) of every measured row."""
    table = run.table().filter(run.table()["status"] == "measured")
    return sorted(zip(table["path"], table["phase"], table["flops"], table["input_shapes"]))


def test_the_anchor_of_a_module_is_the_outermost_called_module_above_it_below_the_root():
    counts = {"": 1, "inp": 1, "blocks": 0, "blocks.0": 1, "blocks.0.fc1": 1, "blocks.0.attn": 1,
              "blocks.0.attn.proj": 2, "head": 1}
    assert anchors_of(counts) == {"blocks.0.fc1": "blocks.0", "blocks.0.attn": "blocks.0", "blocks.0.attn.proj": "blocks.0"}


def test_inner_modules_captured_through_their_anchors_get_the_inputs_a_whole_forward_gives_them():
    torch.manual_seed(0)
    model, batches = Stack(), _batches()
    captures, got = _grouped(model, batches)
    reference = [capture(model, *b, grad=True) for b in batches]
    inner = [p for p in got if p.count(".") == 2]  # blocks.k.fc1, .act, .fc2
    assert len(inner) == 9
    for path in inner:
        for i, calls in enumerate(got[path]):
            want = reference[i].calls[path]
            assert len(calls) == len(want) == 1
            assert torch.equal(calls[0].args[0], want[0].args[0]), (path, i)
            assert calls[0].requires_grad == want[0].requires_grad and calls[0].grad_enabled
    record = captures.anchors.record()
    assert record["off"] is None and record["anchors"] == 3
    assert record["batches"] == 9 * 3  # every inner group, every batch, without a forward
    # Without anchors the same groups take a forward each per batch.
    without, _ = _grouped(model, batches, anchors=False)
    assert without.forwards - captures.forwards == 9 * 3 and without.anchors.record()["batches"] == 0


def test_a_replay_that_changes_what_an_inner_module_receives_falls_back_to_the_whole_forward():
    """Block 1 runs under autocast in the model: its fc2 receives bfloat16 there, float32 when block 1 is replayed on
    its own. Batch 0's bytes against the census's say so; the group is captured by a forward after all, and the
    anchors are let go for the rest of the collection."""
    torch.manual_seed(0)
    model, batches = Stack(autocast=True), _batches()
    captures, got = _grouped(model, batches)
    reference = [capture(model, *b, grad=True) for b in batches]
    assert reference[0].calls["blocks.1.fc2"][0].args[0].dtype == torch.bfloat16
    for path in ("blocks.1.fc2", "blocks.2.fc1"):
        for i, calls in enumerate(got[path]):
            assert torch.equal(calls[0].args[0], reference[i].calls[path][0].args[0])
    off = captures.anchors.record()["off"]
    assert off is not None and "blocks.1.act" in off and "anchor blocks.1 " in off, off
    assert not captures.anchors.kept


def test_a_module_called_from_outside_its_anchor_is_captured_by_the_whole_forward():
    torch.manual_seed(0)
    model, batches = SharedInner(), _batches(2)
    captures, got = _grouped(model, batches)
    reference = [capture(model, *b, grad=True) for b in batches]
    assert [len(calls) for calls in got["a.fc1"]] == [2, 2]
    for i, calls in enumerate(got["a.fc1"]):
        assert all(torch.equal(c.args[0], r.args[0]) for c, r in zip(calls, reference[i].calls["a.fc1"]))
    assert "did not make its calls" in captures.anchors.record()["off"]


def test_anchors_past_the_allowance_are_not_kept():
    torch.manual_seed(0)
    model, batches = Stack(), _batches()
    captures, _ = _grouped(model, batches)
    assert captures.anchors.record()["off"] is None  # within the plan's allowance (64 MiB at least)
    from cbsite.collector.pipeline.capture_plan import planned_captures

    census, plan, tight = planned_captures(model, batches, True, torch.device("cpu"))
    assert not tight.anchors.fit(plan.input_bytes, plan.batches_for, allowance_bytes=1)
    assert "would pass the allowance" in tight.anchors.record()["off"]


def test_a_collection_captures_its_inner_groups_through_anchors_and_measures_the_same_work(monkeypatch, fast_config):
    """An allowance just above what the blocks' inputs take: the inner modules come in groups of their own, each
    captured by replaying its blocks (run.json memory.capture_anchors); the rows count what a collection without
    anchors counts."""
    from cbsite.collector.anchors import Anchors
    from cbsite.collector.profiler import profile_model

    model, batches, blocks = tight_allowance(monkeypatch)
    anchored = profile_model(model, batches, fast_config)
    mem = anchored.meta["memory"]
    assert mem["allowance_bytes"] == blocks + 1
    assert mem["capture_anchors"]["off"] is None and mem["capture_anchors"]["bytes"] == blocks
    assert mem["capture_anchors"]["batches"] > 0 and mem["capture_anchors"]["anchor_calls"] >= mem["capture_anchors"]["batches"]
    real_init = Anchors.__init__
    monkeypatch.setattr(Anchors, "__init__", lambda self, counts, modules, enabled=True: real_init(self, counts, modules, False))
    plain = profile_model(model, batches, fast_config)
    assert plain.meta["memory"]["capture_anchors"]["batches"] == 0
    assert plain.meta["memory"]["capture_forwards"] > mem["capture_forwards"]
    assert work(anchored) == work(plain) and len(work(plain)) >= 2 * 14


def test_the_hierarchy_remeasurement_captures_only_the_components_it_asks_for():
    """The re-measurement of inverted pairs re-captures a group of the pairs' components alone (remeasure.Remeasure
    `needed`), not of every measured component after the first: its forwards stop after the last of them."""
    from cbsite.collector.pipeline.capture_plan import planned_captures
    from cbsite.collector.pipeline.components import Outcome
    from cbsite.collector.pipeline.remeasure import Remeasure
    from cbsite.collector.timing.blocks import TimingConfig

    torch.manual_seed(0)
    model, batches = Stack(), _batches()
    census, plan, captures = planned_captures(model, batches, True, torch.device("cpu"))
    captures.batch0 = None  # every batch by a capture: the census's batch 0 is dropped by then
    captures.anchors.let_go("turned off by the test")
    order = [c for c in breadth_first(component_tree(model)) if census.call_count(c.path) > 0]
    outcomes = {c.path: {"forward": Outcome("measured")} for c in order}
    remeasure = Remeasure(order, outcomes, captures, dict(model.named_modules()), TimingConfig(), census)
    remeasure.needed(["blocks.0", "blocks.0.fc1"])
    fn, calls = remeasure.statement("blocks.0", "forward")
    assert set(captures.held) == {"blocks.0", "blocks.0.fc1"} and calls == 1
    fn()
    reference = capture(model, *batches[1], grad=True)
    assert torch.equal(captures.held["blocks.0.fc1"][1][0].args[0], reference.calls["blocks.0.fc1"][0].args[0])
