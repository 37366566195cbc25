"""An allocation timeline from a PyTorch memory snapshot, laid out for the site's memory view.

Input is the snapshot format PyTorch's own tools share (`torch.cuda.memory._snapshot()` on CUDA;
`torch.cuda._memory_viz._profile_to_snapshot` of a memory profile on CPU): per device a trace of
`alloc` / `free_requested` / `free_completed` / `oom` events and, for the state at the end,
`segments` with their blocks. Output is plain JSON for the viewer:

- the x axis is the event index: t = 0 is before the first event, each alloc or free moves it by one;
- an allocation is live over `[start, end)`; ones made before recording began (parameters, inputs,
  the saved forward graph during backward) start at 0 and are flagged `before`;
- allocations are stacked in the order they were made, each at the summed size of the live ones
  below it, so the stack's height at t is exactly the bytes live at t (as in PyTorch's active
  memory timeline). `max_blocks` are drawn one by one (the largest live at the peak first, then the
  largest of all); the rest form one band on top with the same total, so no byte is dropped from the
  heights or the peak.

Pure Python (no torch): the collector calls it and writes the result as `<phase>.memory.json`; the
site's one viewer (`cbsite/generator/templates/assets/memory.html`) draws any of them; the tests check the
layout's invariants directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

FORMAT = "cbsite.memory-timeline/1"
MAX_FRAMES = 24  # stack frames kept per allocation (the innermost ones)


@dataclass
class _Alloc:
    addr: int
    size: int
    start: int
    end: int | None
    frames: tuple[str, ...]
    category: str | None
    before: bool


def frame_text(frame: Any) -> str:
    """One stack frame as `name (file:line)`; frames without a file (CPU memory profiles) keep their name."""
    if not isinstance(frame, dict):
        return str(frame)
    name = str(frame.get("name", "?"))
    filename = frame.get("filename")
    if not filename or filename in ("none", "??"):
        return name
    return f"{name} ({filename}:{frame.get('line', 0)})"


def _stack(frames: Iterable[Any] | None) -> tuple[str, ...]:
    return tuple(frame_text(f) for f in list(frames or [])[:MAX_FRAMES])


def pick_device(snapshot: dict[str, Any]) -> int:
    """The device whose trace has the most events (ties: the lowest index)."""
    traces = snapshot.get("device_traces") or [[]]
    return max(range(len(traces)), key=lambda i: (len(traces[i] or []), -i))


def _blocks_at_end(snapshot: dict[str, Any], device: int) -> list[tuple[int, int, tuple[str, ...], str | None]]:
    """(addr, size, frames, category) of the blocks live when the snapshot was taken, from its segments.

    Sizes are the allocator's block sizes (CUDA rounds requests up), as in the trace's events; a block's
    address is its own `address` where the snapshot gives one, else the running sum over its segment.
    """
    out = []
    for seg in snapshot.get("segments") or []:
        if seg.get("device", device) != device or seg.get("address") is None:
            continue
        addr = int(seg["address"])
        for block in seg.get("blocks") or []:
            addr = int(block.get("address", addr))
            if block.get("state") in ("active_allocated", "active_awaiting_free"):
                out.append((addr, int(block["size"]), _stack(block.get("frames")), block.get("category")))
            addr += int(block["size"])
    return out


def allocations(snapshot: dict[str, Any], device: int) -> tuple[list[_Alloc], int, list[dict[str, int]]]:
    """Every allocation with its live interval, the number of events on the x axis, and the OOMs."""
    trace = (snapshot.get("device_traces") or [[]])[device] or []
    allocs: list[_Alloc] = []
    open_by_addr: dict[int, _Alloc] = {}
    ooms: list[dict[str, int]] = []
    t = 0
    for e in trace:
        action = e.get("action")
        if action == "alloc":
            t += 1
            a = _Alloc(int(e["addr"]), int(e["size"]), t, None, _stack(e.get("frames")), e.get("category"), False)
            open_by_addr[a.addr] = a
            allocs.append(a)
        elif action in ("free_requested", "free_completed"):
            freed = open_by_addr.pop(int(e["addr"]), None)
            if freed is None:
                if action == "free_completed":
                    continue  # the second half of a free already counted at free_requested
                # Freed but never allocated while recording: it was live from the start.
                t += 1
                a = _Alloc(int(e["addr"]), int(e["size"]), 0, t, _stack(e.get("frames")), e.get("category"), True)
                allocs.append(a)
            else:
                t += 1
                freed.end = t
        elif action == "oom":
            ooms.append({"at": t, "size": int(e.get("size", 0)), "free": int(e.get("device_free", 0))})
    for addr, size, frames, cat in _blocks_at_end(snapshot, device):
        if addr not in open_by_addr:  # live at the end and never allocated while recording
            allocs.append(_Alloc(addr, size, 0, None, frames, cat, True))
    for a in allocs:
        if a.end is None:
            a.end = t + 1  # still live after the last event
    allocs.sort(key=lambda a: (a.start, not a.before))
    return allocs, t, ooms


def _drawn(allocs: list[_Alloc], peak_at: int, max_blocks: int) -> set[int]:
    """Which allocations are drawn one by one: the largest of those live at the peak first (up to half
    the budget, so the peak is always explained), then the largest of all."""
    by_size = sorted(range(len(allocs)), key=lambda i: (-allocs[i].size, i))
    at_peak = [i for i in by_size if allocs[i].start <= peak_at < allocs[i].end]  # type: ignore[operator]
    keep = set(at_peak[:max(1, max_blocks // 2)][:max_blocks])
    for i in by_size:
        if len(keep) >= max_blocks:
            break
        keep.add(i)
    return keep


def _live_bytes(allocs: list[_Alloc], horizon: int) -> list[int]:
    """Bytes live at each t in 0..horizon (a difference array over the intervals)."""
    diff = [0] * (horizon + 2)
    for a in allocs:
        diff[a.start] += a.size
        diff[a.end] -= a.size  # type: ignore[index]
    live, total = [], 0
    for t in range(horizon + 1):
        total += diff[t]
        live.append(total)
    return live


def _stack_layout(drawn: list[_Alloc]) -> list[list[list[int]]]:
    """Bottom edge of each drawn allocation as steps [[t, y], ...]: y changes only when one below frees."""
    events: dict[int, list[tuple[int, int]]] = {}  # t -> [(kind, index)], kind 0 = free, 1 = alloc
    for i, a in enumerate(drawn):
        events.setdefault(a.start, []).append((1, i))
        events.setdefault(a.end, []).append((0, i))  # type: ignore[arg-type]
    steps: list[list[list[int]]] = [[] for _ in drawn]
    stack: list[int] = []  # indices, bottom first
    for t in sorted(events):
        frees = {i for kind, i in events[t] if kind == 0}
        if frees:
            lowest = min(pos for pos, i in enumerate(stack) if i in frees)
            stack = [i for i in stack if i not in frees]
            y = sum(drawn[i].size for i in stack[:lowest])
            for i in stack[lowest:]:  # everything above the lowest freed block moves down
                if steps[i][-1][1] != y:
                    steps[i].append([t, y])
                y += drawn[i].size
        for kind, i in events[t]:
            if kind == 1:
                steps[i].append([t, sum(drawn[j].size for j in stack)])
                stack.append(i)
    return steps


def timeline(snapshot: dict[str, Any], *, device: int | None = None, max_blocks: int = 1500,
             source: str = "cuda-allocator") -> dict[str, Any]:
    """The laid-out timeline of one device's trace (see the module docstring)."""
    device = pick_device(snapshot) if device is None else device
    allocs, horizon, ooms = allocations(snapshot, device)
    live = _live_bytes(allocs, horizon)
    peak_at = max(range(len(live)), key=lambda t: (live[t], -t))
    during = [a for a in allocs if not a.before]

    keep = _drawn(allocs, peak_at, max_blocks)
    drawn = [a for i, a in enumerate(allocs) if i in keep]
    others = [a for i, a in enumerate(allocs) if i not in keep]
    steps = _stack_layout(drawn)
    drawn_live = _live_bytes(drawn, horizon)
    other_live = _live_bytes(others, horizon)

    frames: list[list[str]] = []
    frame_ids: dict[tuple[str, ...], int] = {}
    categories: list[str] = []
    blocks: list[dict[str, Any]] = []
    for a, pts in zip(drawn, steps):
        if a.frames not in frame_ids:
            frame_ids[a.frames] = len(frames)
            frames.append(list(a.frames))
        cat = a.category or ("before" if a.before else "unknown")
        if cat not in categories:
            categories.append(cat)
        blocks.append({"size": a.size, "start": a.start, "end": a.end, "before": a.before, "points": pts,
                       "frames": frame_ids[a.frames], "category": categories.index(cat)})
    at_peak = sorted((i for i, b in enumerate(blocks) if b["start"] <= peak_at < b["end"]),
                     key=lambda i: (-blocks[i]["size"], i))
    return {
        "format": FORMAT, "source": source, "device": device, "events": horizon,
        "allocations": len(during), "preexisting": len(allocs) - len(during),
        "baseline_bytes": live[0], "peak_bytes": live[peak_at], "peak_at": peak_at,
        # the most bytes live at once among the phase's own allocations (the collector's peak_memory_bytes)
        "allocated_peak_bytes": max(_live_bytes(during, horizon)),
        "blocks": blocks, "frames": frames, "categories": categories,
        "other": {"count": len(others), "bytes": sum(a.size for a in others),
                  "base": _changes(drawn_live), "height": _changes(other_live)},
        "at_peak": at_peak[:50], "at_peak_other_bytes": other_live[peak_at], "ooms": ooms,
    }


def _changes(series: list[int]) -> list[list[int]]:
    """A per-t series as [[t, value], ...] at the points where it changes (first point always kept)."""
    out: list[list[int]] = []
    for t, v in enumerate(series):
        if not out or out[-1][1] != v:
            out.append([t, v])
    return out
