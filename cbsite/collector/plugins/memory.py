"""memory: a CUDA memory snapshot per component and phase (allocation history of one replay).

On CUDA, the caching allocator records every allocation and free, with stacks, while the phase is
replayed once (untimed); the snapshot is saved as `artifacts/<slug>/<phase>.memory.pickle` (linked
from `memory_file`; it opens in PyTorch's visualiser, torch.cuda._memory_viz / pytorch.org/memory_viz)
beside an offline text view made by PyTorch's own `_memory_viz.segsum` and `_memory_viz.trace`.
PyTorch's interactive HTML view (`_memory_viz.trace_plot`) imports its script and d3 from a CDN,
which an offline site cannot use, so it is not written.

On CPU there is no allocator history to record: the run says "not available on CPU" (run.json
config.plugins.memory.status and a note on each row) and writes no file. Peak memory per phase is
in `peak_memory_bytes` on both (the tensor census on CPU, the allocator's peak on CUDA).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler, RunContext

CPU_STATUS = "not available on CPU: memory snapshots record the CUDA caching allocator; peak_memory_bytes holds the tensor census"


class MemoryPlugin(Profiler):
    name = "memory"
    description = "CUDA memory snapshot per component and phase, with PyTorch's text views (CUDA only)"
    options = {"max_entries": Option(100_000, "allocator events recorded per snapshot")}

    def start(self, run: RunContext) -> str | None:
        self.cuda = run.device.type == "cuda"
        return None if self.cuda else CPU_STATUS

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        if ctx.replay is None:
            return None
        if not self.cuda:
            return PluginResult(notes=["snapshot not available on CPU"])
        snapshot, peak = self._record(ctx)
        folder = ctx.artifact_dir()
        pickled = folder / f"{ctx.phase}.memory.pickle"
        pickled.write_bytes(pickle.dumps(snapshot))
        (folder / f"{ctx.phase}.memory.txt").write_text(_text_view(snapshot))
        events = sum(len(t) for t in snapshot.get("device_traces", []))
        return PluginResult(columns={"memory_file": ctx.link(pickled)}, metrics={"peak_bytes": peak, "events": events})

    def _record(self, ctx: PhaseContext) -> tuple[dict[str, Any], int]:
        assert ctx.replay is not None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=self.opts["max_entries"])
        try:
            ctx.replay()
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return snapshot, torch.cuda.max_memory_allocated() - base


def _text_view(snapshot: dict[str, Any]) -> str:
    from torch.cuda import _memory_viz

    return "== segments ==\n" + _memory_viz.segsum(snapshot) + "\n== allocation trace ==\n" + _memory_viz.trace(snapshot)
