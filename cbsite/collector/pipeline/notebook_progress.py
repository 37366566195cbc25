"""A collection's progress in a Jupyter kernel that cannot show rich's live bar (it needs ipywidgets): one line on
stderr, redrawn in place with a carriage return, which Jupyter's output area honours. A log's LineProgress writes
a new line at most every 30 s, which leaves a notebook cell looking stalled for most of a collection."""

from __future__ import annotations

import sys
import time
from typing import Any

from cbsite.collector.pipeline.progress import LineProgress

BAR_WIDTH = 20


def in_notebook() -> bool:
    """True in a Jupyter kernel, as rich detects it (IPython's ZMQ shell, Colab, Databricks)."""
    from rich.console import Console

    return Console().is_jupyter


class NotebookLine(LineProgress):
    """LineProgress's interface, drawn as one line that is rewritten at most every LINE_EVERY_S seconds; shown
    as soon as the task is added, ended with a newline when the stage is done."""

    LINE_EVERY_S = 0.5  # a redraw of the same line here, not a new one

    def __init__(self) -> None:
        super().__init__()
        self.width = 0

    def add_task(self, description: str, total: int) -> int:
        task_id = super().add_task(description, total)
        self._line(self.tasks[task_id])
        return task_id

    def _line(self, task: dict[str, Any], final: bool = False) -> None:
        self.last = time.perf_counter()
        elapsed = self.last - task["started"]
        done, total = task["done"], task["total"]
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
        text = (f"cbsite: {task['title']} {'█' * filled}{'░' * (BAR_WIDTH - filled)} {done}/{total} "
                f"({'done' if final else task['description']}), {elapsed:.0f} s elapsed{left}")
        # Padded to the longest line drawn, should a frontend keep what a shorter line does not cover.
        self.width = max(self.width, len(text))
        sys.stderr.write("\r" + text.ljust(self.width) + ("\n" if final else ""))
        sys.stderr.flush()
