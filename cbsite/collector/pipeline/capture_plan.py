"""Census, memory plan and grouped captures: which inputs every module received, how much each graph saves, and the
captured inputs group by group within the plan's allowance (memory.py). Used by the collection and by session
workers alike, so it imports nothing above it."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from cbsite.collector import memory
from cbsite.collector.anchors import Anchors
from cbsite.collector.capture import Call, Capture, Rider, capture, root_calls
from cbsite.collector.config import Batch, CollectConfig
from cbsite.collector.counting import count_on_shapes
from cbsite.collector.pipeline.failures import error_text, forward_error
from cbsite.collector.pipeline.rows import static_size
from cbsite.collector.plan import Component, PlanConfig, component_tree, selected


def _captured(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool, index: int,
              keep_bytes: int | None = None, stop_past_keep: bool = False) -> Capture:
    """The capture of one batch; a forward that raises is the user's to fix: one line, the traceback in a file."""
    try:
        return capture(model, args, kwargs, grad=grad, keep_bytes=keep_bytes, stop_past_keep=stop_past_keep)
    except Exception as exc:
        raise forward_error(exc, index) from exc


def census_on_shapes(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool,
                     keep_bytes: int) -> Capture | None:
    """The census on fake tensors (counting.count_on_shapes: the same ops, shapes and what autograd saves, without
    the arithmetic), where a real census would not keep batch 0's inputs anyway (they pass `keep_bytes`), and a real
    forward of a large model is seconds. None where it cannot stand for a real one (a value-dependent op, an op
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


class CaptureOutOfMemory(Exception):
    """Capturing one component's inputs alone ran out of memory."""


class GroupedCaptures:
    """Captured inputs group by group, in measuring order (memory.py): a component's calls are captured
    with the components after it that fit the allowance, and the previous group is dropped first."""

    def __init__(self, model: nn.Module, batches: Sequence[Batch], grad: bool, plan: memory.Plan, census: Capture,
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
                # through the anchors (run.json memory.capture_anchors).
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
            except CaptureOutOfMemory:
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
                except Exception as exc:
                    self.held = {}
                    if memory.is_out_of_memory(exc) and self.whole_forward_ran:
                        raise CaptureOutOfMemory(error_text(exc)) from exc
                    raise forward_error(exc, i) from exc
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
        if rider is None or cap is None or not set(wanted) <= set(rider.paths):
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
        except Exception as exc:
            if memory.is_out_of_memory(exc) and self.whole_forward_ran:
                self.held = {}
                raise CaptureOutOfMemory(error_text(exc)) from exc
            self.anchors.let_go(f"replaying an anchor raised {error_text(exc)}")
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


def planned_captures(model: nn.Module, batches: Sequence[Batch], grad: bool, device: torch.device,
                     everything: bool = False) -> tuple[Capture, memory.Plan, "GroupedCaptures"]:
    """The census of batch 0 (one forward that keeps no inputs past the provisional allowance, only what
    every module received and how much its graph saved), the memory plan made from it and the model's own
    size, and the captures that follow that plan. Used by the collection and by session workers alike."""
    model_bytes = static_size(model)[0]
    keep_bytes = None if everything else memory.provisional_allowance(model_bytes)
    # The real census first, stopped where batch 0's inputs pass the allowance. Where they fit (the small models) it is
    # the whole census, and the one on shapes is not tried: the real census has to run anyway to keep the inputs.
    # Where they do not, it stops at the first module whose inputs pass the allowance, and the census on shapes stands
    # in for the whole forward; where that cannot (a value-dependent op), a real census to the end that keeps nothing.
    census = _captured(model, *batches[0], grad, 0, keep_bytes=keep_bytes, stop_past_keep=not everything)
    stopped = not census.complete
    if stopped:
        assert keep_bytes is not None  # only a capture with an allowance stops short
        census = (census_on_shapes(model, *batches[0], grad, keep_bytes)
                  or _captured(model, *batches[0], grad, 0, keep_bytes=0))
    mem_plan = memory.plan(census.input_bytes, model_bytes, census.saved_bytes.get("", 0), len(batches),
                           memory.cache_bytes(device), census.output_bytes, census.saved_bytes)
    # Real census forwards: the stopped one, and one to the end where no census on shapes stood in.
    return census, mem_plan, GroupedCaptures(model, batches, grad, mem_plan, census, everything=everything,
                                             census_forwards=1 + (stopped and not census.on_shapes),
                                             ride=device.type == "cpu")


@dataclass(frozen=True)
class Planned:
    """The census and plan stages' result: the census, the captures that follow the memory plan, the component tree
    and the filters that select from it."""

    census: Capture
    captures: GroupedCaptures
    components: list[Component]
    selection: PlanConfig

    @property
    def memory(self) -> memory.Plan:
        return self.captures.plan


def plan_collection(model: nn.Module, batches: Sequence[Batch], config: CollectConfig, device: torch.device) -> Planned:
    """The census of batch 0, the memory plan made from it, and the component tree with its filters."""
    census, mem_plan, captures = planned_captures(model, batches, "backward" in config.phases, device,
                                                  everything=config.capture_all_at_once)
    components = component_tree(model)
    selection = PlanConfig(config.max_depth, config.include, config.exclude)
    if not config.capture_all_at_once and not selected(components[0], selection):
        # The whole model is measured: its graph is memory the collection needs anyway (memory.Plan.group).
        captures.plan = dataclasses.replace(mem_plan, headroom_bytes=census.graph_bytes("") or 0)
    return Planned(census, captures, components, selection)
