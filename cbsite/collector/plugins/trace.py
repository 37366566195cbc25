"""trace: a Kineto (Chrome trace JSON) trace per component and phase, gzipped, for Perfetto.

Written to `artifacts/<slug>/<phase>.trace.json.gz` and linked from `trace_file`. A few iterations
of the component alone keep the file small, so Perfetto opens it instantly.
"""

from __future__ import annotations

import gzip
import os
import tempfile
from pathlib import Path

from cbsite.artifacts import relative_paths
from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler
from cbsite.collector.plugins.kineto import profiled_pass


class TracePlugin(Profiler):
    name = "trace"
    description = "torch.profiler (Kineto) trace per component and phase, gzipped Chrome trace JSON"
    options = {"iterations": Option(3, "profiled iterations per component and phase (one span each)")}

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        if ctx.replay is None:
            return None
        profiled = profiled_pass(ctx, self.opts["iterations"])
        out = ctx.artifact_dir() / f"{ctx.phase}.trace.json.gz"
        fd, raw = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            profiled.prof.export_chrome_trace(raw)
            text = Path(raw).read_text(encoding="utf-8", errors="surrogateescape")
            with gzip.open(out, "wb", compresslevel=6) as dst:  # stack frames and file names: relative
                dst.write(relative_paths(text).encode("utf-8", "surrogateescape"))
        finally:
            Path(raw).unlink(missing_ok=True)
        return PluginResult(columns={"trace_file": ctx.link(out)}, metrics={"bytes": out.stat().st_size})
