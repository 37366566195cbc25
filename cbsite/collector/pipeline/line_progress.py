"""A collection's progress without rich's live bar: in a log (stderr a file or a pipe), LineProgress writes a plain
line at most every 30 s; in a Jupyter kernel without ipywidgets (which rich's bar needs), NotebookLine draws one line
on stderr, redrawn in place with a carriage return, which Jupyter's output area honours (a line every 30 s would
leave the cell looking stalled for most of a collection)."""

from __future__ import annotations

import sys
import time
from typing import Any

BAR_WIDTH = 20


def in_notebook() -> bool:
    """True in a Jupyter kernel, as rich detects it (IPython's ZMQ shell, Colab, Databricks)."""
    from rich.console import Console

    return Console().is_jupyter


class LineProgress:
    """The part of rich's Progress the collector uses, written as occasional plain lines to stderr."""

    LINE_EVERY_S = 30.0

    def __init__(self) -> None:
        self.tasks: dict[int, dict[str, Any]] = {}
        self.last = 0.0

    def __enter__(self) -> "LineProgress":
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
