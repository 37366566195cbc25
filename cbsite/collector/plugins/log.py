"""log: what a component printed, warned or logged while it was measured, and its error with traceback.

Saved per component as `artifacts/<slug>/log.txt` (all phases in one file) and linked from
`log_file` on each phase's row; a component that printed nothing and did not fail gets no file.

Capture is Python-level: `sys.stdout`/`sys.stderr` writes from the measuring thread (other threads,
such as a progress bar's refresh, pass through untouched), warnings (every occurrence counted) and
log records at WARNING and above. Output written by C/C++ straight to the file descriptors is not
seen. The timed loop runs the component many times, so only the first `max_lines` lines are kept
and the rest counted.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

from cbsite.artifacts import relative_paths
from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler


@dataclass
class _Captured:
    max_lines: int
    lines: list[str] = field(default_factory=list)
    repeats: list[int] = field(default_factory=list)  # a line printed again and again is kept once, counted
    dropped: int = 0
    partial: str = ""
    warned: Counter = field(default_factory=Counter)
    logged: Counter = field(default_factory=Counter)

    def write(self, stream: str, text: str) -> None:
        self.partial += text
        *complete, self.partial = self.partial.split("\n")
        for line in complete:
            line = f"[{stream}] {line}"
            if self.lines and self.lines[-1] == line:
                self.repeats[-1] += 1
            elif len(self.lines) < self.max_lines:
                self.lines.append(line)
                self.repeats.append(1)
            else:
                self.dropped += 1

    def kept(self) -> list[str]:
        return [line if n == 1 else f"{line}  (x{n})" for line, n in zip(self.lines, self.repeats)]

    def count(self) -> int:
        return sum(self.repeats) + self.dropped

    def empty(self) -> bool:
        return not (self.lines or self.partial or self.warned or self.logged)


class _ThreadTee:
    """Stands in for sys.stdout/stderr: the measuring thread's writes are captured, others pass."""

    def __init__(self, original: TextIO, captured: _Captured, stream: str) -> None:
        self.original, self.captured, self.stream = original, captured, stream
        self.owner = threading.get_ident()

    def write(self, text: str) -> int:
        if threading.get_ident() == self.owner:
            self.captured.write(self.stream, text)
            return len(text)
        return self.original.write(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


class _Records(logging.Handler):
    def __init__(self, captured: _Captured) -> None:
        super().__init__(level=logging.WARNING)
        self.captured = captured

    def emit(self, record: logging.LogRecord) -> None:
        self.captured.logged[f"{record.levelname} {record.name}: {record.getMessage()}"] += 1


class LogPlugin(Profiler):
    name = "log"
    description = "what each component printed or warned while measured, and its error with traceback"
    options = {"max_lines": Option(200, "printed lines kept per component and phase")}

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.current: dict[tuple[str, str], _Captured] = {}
        self.sections: dict[str, list[str]] = {}

    @contextlib.contextmanager
    def watch(self, ctx: PhaseContext) -> Iterator[None]:
        captured = _Captured(self.opts["max_lines"])
        self.current[(ctx.path, ctx.phase)] = captured
        handler = _Records(captured)
        root = logging.getLogger()
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _ThreadTee(out, captured, "stdout"), _ThreadTee(err, captured, "stderr")
        root.addHandler(handler)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")  # count every occurrence, not only the first
                warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
                    captured.warned.update([f"{category.__name__}: {message} ({filename}:{lineno})"])
                yield
        finally:
            sys.stdout, sys.stderr = out, err
            root.removeHandler(handler)

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        captured = self.current.pop((ctx.path, ctx.phase), None) or _Captured(0)
        failed = ctx.status == "failed"
        if captured.empty() and not failed:
            return PluginResult(metrics={"lines": 0})
        section = [f"== {ctx.phase} ({ctx.status}) =="]
        section += captured.kept() + ([f"[no newline at end] {captured.partial}"] if captured.partial else [])
        if captured.dropped:
            section.append(f"... {captured.dropped} more lines not kept (max_lines={self.opts['max_lines']})")
        section += [f"[warning x{n}] {w}" for w, n in captured.warned.items()]
        section += [f"[log x{n}] {r}" for r, n in captured.logged.items()]
        if failed:
            section += ["[error] " + (ctx.error or ""), ctx.traceback or "(no traceback)"]
        sections = self.sections.setdefault(ctx.path, [])
        sections.append("\n".join(section))
        out = ctx.artifact_dir() / "log.txt"
        # Rewritten with every phase so far: one file per component, complete after its last phase.
        text = f"{ctx.path or '<root>'} ({ctx.module_type})\n\n" + "\n\n".join(sections) + "\n"
        out.write_text(relative_paths(text))  # tracebacks name local files: never an absolute path in a run
        return PluginResult(
            columns={"log_file": ctx.link(out)},
            metrics={"lines": captured.count(), "warnings": sum(captured.warned.values())},
        )
