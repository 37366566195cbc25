"""Where a collection is (a live bar, or occasional lines in a log) and where its time went (run.json
`breakdown_s`, one key per stage)."""

from __future__ import annotations

import sys
import time
from typing import Any

from cbsite.collector import memory
from cbsite.collector.pipeline.line_progress import LineProgress, NotebookLine, in_notebook

PASSES = ("counting", "memory_peaks", "backward_graphs", "warm_up", "block_sizing")  # a phase's untimed passes (measure.PhaseResult.untimed_s)


class Stages:
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


def progress_bar(enabled: bool, total: int):
    """A live bar on a terminal; where stderr is a file or a pipe (a CI log, nohup), a plain line at most
    every LINE_EVERY_S seconds, so a long collection still says where it is. A notebook's stderr is no terminal
    but rich draws its bar there where ipywidgets is installed; without it, one line redrawn in place."""
    if enabled and not sys.stderr.isatty() and not _notebook_bar():
        return NotebookLine() if in_notebook() else LineProgress()
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}", justify="left"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),  # from the components done so far: a rough estimate, as rich says "-:--:--" until then
        disable=not enabled,
        transient=False,
    )


def _notebook_bar() -> bool:
    """True in a Jupyter kernel that can show rich's live bar (it needs ipywidgets; without it, lines)."""
    from importlib.util import find_spec

    from rich.console import Console

    return Console().is_jupyter and find_spec("ipywidgets") is not None
