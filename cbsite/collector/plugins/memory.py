"""memory: an allocation timeline per component and phase, as a snapshot and a timeline the site draws.

The phase is replayed once more (untimed) while allocations are recorded:
- on CUDA, the caching allocator's history (`torch.cuda.memory._record_memory_history`, with stacks)
  gives `torch.cuda.memory._snapshot()`;
- on CPU there is no allocator history, so the CUDA snapshot is "not available on CPU" (the run's
  status says so); instead torch.profiler records the replay with `profile_memory=True`, and every
  allocation and free it saw (with its Python stack, and the category its memory profile gives:
  activation, gradient, parameter, ...) is written in the same snapshot format. PyTorch's own
  converter (`_memory_viz._profile_to_snapshot`) is not used: it keeps only allocations proven to
  be tensors by a later use inside the profile, which drops a component's outputs.

Either way the run gets, under `artifacts/<slug>/`:
- `<phase>.memory.pickle`: the snapshot, which PyTorch's memory viewer opens as it is;
- `<phase>.memory.json`: the timeline laid out by `memory_timeline.py`, linked from `memory_file`;
  the site draws it with its one offline viewer (PyTorch's interactive view imports its script and
  d3 from the network, so an offline site cannot use it);
- on CUDA also `<phase>.memory.txt`, PyTorch's text views (`_memory_viz.segsum` and `trace`).

Metrics: `memory.peak_bytes` (the most bytes live at once among the phase's own allocations: the
definition of `peak_memory_bytes`, measured here on a separate replay), `memory.baseline_bytes`
(live before the phase and used by it), `memory.events`, `memory.allocations`.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import torch

from cbsite.artifacts import scrubbed
from cbsite.collector.cpu_memory import allocation_nodes
from cbsite.collector.plugins import memory_timeline
from cbsite.collector.plugins.base import Option, PhaseContext, PluginResult, Profiler, RunContext
from cbsite.collector.quiet_profiler import quiet_profiler

CPU_STATUS = ("CUDA allocator snapshot not available on CPU: the timeline shows the CPU allocator's "
              "allocations and frees as torch.profiler records them")


class MemoryPlugin(Profiler):
    name = "memory"
    description = "allocation timeline per component and phase: snapshot + timeline for the site's view (CUDA allocator; CPU profiler)"
    options = {
        "max_entries": Option(100_000, "allocator events recorded per snapshot (CUDA)"),
        "max_blocks": Option(1500, "allocations drawn one by one in the view; smaller ones form one band"),
    }

    def start(self, run: RunContext) -> str | None:
        self.cuda = run.device.type == "cuda"
        self.model = run.model_name
        return None if self.cuda else CPU_STATUS

    def profile(self, ctx: PhaseContext) -> PluginResult | None:
        if ctx.replay is None:
            return None
        # Stack frames name local files: relative paths only, in the pickle and the timeline alike.
        snapshot = scrubbed(self._record_cuda(ctx) if self.cuda else self._record_cpu(ctx))
        device = torch.cuda.current_device() if self.cuda else None
        data = memory_timeline.timeline(snapshot, device=device, max_blocks=self.opts["max_blocks"],
                                        source="cuda-allocator" if self.cuda else "cpu-profiler")
        folder = ctx.artifact_dir()
        pickled = folder / f"{ctx.phase}.memory.pickle"
        pickled.write_bytes(pickle.dumps(snapshot))
        view = folder / f"{ctx.phase}.memory.json"
        title = f"{self.model} · {ctx.path or '(root)'} · {ctx.phase} memory"
        view.write_text(json.dumps({"title": title, "snapshot": pickled.name, "timeline": data}, separators=(",", ":")))
        if self.cuda:
            (folder / f"{ctx.phase}.memory.txt").write_text(_text_view(snapshot))
        return PluginResult(columns={"memory_file": ctx.link(view)}, metrics={
            "peak_bytes": data["allocated_peak_bytes"], "baseline_bytes": data["baseline_bytes"],
            "events": data["events"], "allocations": data["allocations"]})

    def _record_cuda(self, ctx: PhaseContext) -> dict[str, Any]:
        assert ctx.replay is not None
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=self.opts["max_entries"])
        try:
            ctx.replay()
            torch.cuda.synchronize()
            return torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)

    def _record_cpu(self, ctx: PhaseContext) -> dict[str, Any]:
        assert ctx.replay is not None
        ctx.replay()  # warm-up outside the recording: lazy initialisation is not the component's memory
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                      record_shapes=True, with_stack=True)
        # The CPU allocator warns on stderr for each free of a block allocated before the profiler
        # started ("profiler results will not include the deallocation event"): silenced; such a
        # block stays in the baseline until the end.
        with quiet_profiler(prof, whole=True):
            ctx.replay()
        return cpu_snapshot(prof)


def cpu_snapshot(prof: Any) -> dict[str, Any]:
    """A stopped CPU profile (profile_memory, with_stack) in PyTorch's snapshot format, device 0 = CPU.

    The trace holds every allocation and free the profiler recorded; `segments` hold what was live at
    the end, including tensors that existed before and were used by the phase (parameters, inputs,
    saved activations), laid out by address with `inactive` gaps as PyTorch's converter does.
    """
    from torch.profiler._memory_profiler import Action, TensorKey

    memory_profile = prof._memory_profile()

    def category(key: Any, version: int) -> str:
        cat = memory_profile._categories.get(key, version) if key is not None else None
        return cat.name.lower() if cat is not None else "unknown"

    trace: list[dict[str, Any]] = []
    live: dict[int, dict[str, Any]] = {}
    freed_before: set[int] = set()  # pointers freed during the phase that it never allocated
    for node in allocation_nodes(memory_profile._op_tree):  # the tree the memory profile already built
        fields = node.extra_fields
        ptr, size = int(fields.ptr), int(fields.alloc_size)
        if size > 0:
            event = {"action": "alloc", "addr": ptr, "size": size, "stream": 0, "frames": _stack_of(node),
                     "category": category(TensorKey.from_allocation(fields), 0), "time_us": node.start_time_ns // 1000}
            live[ptr] = event
            trace.append(event)
        elif size < 0:
            allocated = live.pop(ptr, None)
            if allocated is None:
                freed_before.add(ptr)
            frames = allocated["frames"] if allocated else _stack_of(node)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": ptr, "size": -size, "stream": 0, "frames": frames,
                              "time_us": node.start_time_ns // 1000})
    at_end = {ptr: (e["size"], e["frames"], e["category"]) for ptr, e in live.items()}
    for _, action, (key, version), size in memory_profile.timeline:
        if action == Action.PREEXISTING and isinstance(key, TensorKey):
            ptr = int(key.storage.ptr)
            if ptr not in freed_before and ptr not in at_end and size > 0:
                at_end[ptr] = (int(size), [], category(key, version))
    return {"device_traces": [trace], "segments": _segments(at_end)}


def _stack_of(node: Any) -> list[dict[str, Any]]:
    """The operators and Python frames above a profiler event, innermost first, as snapshot frames.

    Operators (`aten::addmm`, `autograd::engine::evaluate_function: MmBackward0`) are kept beside the
    Python frames: in backward the Python stack is only the autograd engine's entry point, and the
    operator is what says which computation allocated.
    """
    from torch._C._profiler import _EventType

    frames = []
    parent = node.parent
    while parent is not None:
        if parent.tag in (_EventType.PyCall, _EventType.PyCCall, _EventType.TorchOp):
            frames.append({"filename": "none", "line": 0, "name": parent.name})
        parent = parent.parent
    return frames


def _segments(blocks: dict[int, tuple[int, list[dict[str, Any]], str]]) -> list[dict[str, Any]]:
    """One CPU segment spanning the live blocks by address, gaps marked inactive."""
    if not blocks:
        return []
    start = min(blocks)
    seg: dict[str, Any] = {"device": 0, "address": start, "total_size": 0, "stream": 0, "blocks": []}
    cursor = start
    for ptr in sorted(blocks):
        size, frames, cat = blocks[ptr]
        if ptr < cursor:
            continue  # overlapping storage (already counted by the block below it)
        if ptr > cursor:
            seg["blocks"].append({"size": ptr - cursor, "state": "inactive"})
        seg["blocks"].append({"size": size, "requested_size": size, "state": "active_allocated",
                              "frames": frames, "category": cat})
        cursor = ptr + size
    seg["total_size"] = cursor - start
    return [seg]


def _text_view(snapshot: dict[str, Any]) -> str:
    from torch.cuda import _memory_viz

    return "== segments ==\n" + _memory_viz.segsum(snapshot) + "\n== allocation trace ==\n" + _memory_viz.trace(snapshot)
