"""The re-measure stage: children slower than their parents beyond both intervals are timed again, interleaved with
them (hierarchy.py), on inputs re-captured group by group for the pairs alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from torch import nn

from cbsite.collector import hierarchy, memory
from cbsite.collector.capture import Capture
from cbsite.collector.measure import ComponentMeasurement
from cbsite.collector.pipeline.capture_plan import CaptureOutOfMemory, GroupedCaptures, Planned
from cbsite.collector.pipeline.components import Measured, Outcome
from cbsite.collector.plan import Component
from cbsite.collector.timing.blocks import TimingConfig
from cbsite.errors import CbsiteError


class Remeasure:
    """Measured components rebuilt on demand after the loop, whose captures were dropped, for the
    hierarchy re-measurement: re-captured group by group as they are asked for."""

    def __init__(self, order: Sequence[Component], outcomes: dict[str, dict[str, Outcome]], captures: GroupedCaptures,
                 modules: dict[str, nn.Module], timing: TimingConfig, census: Capture) -> None:
        self.outcomes, self.captures, self.modules, self.timing, self.census = outcomes, captures, modules, timing, census
        self.measured = [c.path for c in order if any(o.status == "measured" for o in outcomes.get(c.path, {}).values())]
        self.built: dict[str, ComponentMeasurement] = {}
        # The components the re-measurement asks for (`needed`): a group is captured for them alone, its forwards stopping
        # after the last of them, not for every measured component after the first.
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
        except (CaptureOutOfMemory, MemoryError, CbsiteError):  # a model that no longer runs: nothing re-measured
            return None
        except Exception as exc:
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


@dataclass(frozen=True)
class Remeasured:
    """What the re-measurement adds: its blocks' samples, how many pairs it timed again, its seconds in timed blocks,
    and the capture groups and forwards it made (which pairs are inverted follows the timings, so the run record
    keeps them apart from the plan's captures)."""

    samples: list[dict[str, Any]]
    pairs: int
    timed_s: float
    capture_groups: int = 0
    capture_forwards: int = 0


def remeasure_inverted(rows: list[dict[str, Any]], samples: Sequence[dict[str, Any]], measured: Measured,
                       planned: Planned, modules: dict[str, nn.Module], timing: TimingConfig, num_threads: int,
                       run_id: str) -> Remeasured:
    """Time inverted pairs again; the captured inputs are let go after it (their last use)."""
    pair_index = {(s["path"], s["phase"]): s["pair"] for s in samples}
    groups, forwards = planned.captures.groups, planned.captures.forwards
    measurements = Remeasure(measured.order, measured.outcomes, planned.captures, modules, timing, planned.census)
    measurements.needed(row["path"] for pair in hierarchy.inverted_pairs(rows) for row in pair)
    extra, remeasured = hierarchy.remeasure(
        rows, measurements.statement,
        timing.block_s(), num_threads, run_id,
        lambda path, phase: pair_index.get((path, phase), -1) + 1,
    )
    # The re-timing's blocks are timed blocks too (their samples join the rows' medians): breakdown_s says how long.
    timed_s = sum(s["seconds_per_call"] * s["calls"] for s in extra)
    measurements.drop()
    return Remeasured(extra, remeasured, timed_s, planned.captures.groups - groups, planned.captures.forwards - forwards)
