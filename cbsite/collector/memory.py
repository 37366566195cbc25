"""Memory of a collection: what it may hold beside the model, and where it must stop.

A collection holds the model, the inputs it captured and, per component, the backward graphs of the
batches it rotates through. Without a plan those grow with the model: every module's inputs of every
batch plus one whole-model graph per batch (several times a plain training step). The plan here bounds
both by the model's own footprint:

* **Capture groups**: the components are taken in their breadth-first measuring order and cut into
  groups whose captured inputs fit `EXTRA_FRACTION` of the footprint (parameters and buffers plus the
  bytes autograd saves in one forward of the whole model); each group is captured, measured and freed
  before the next. One extra forward per group and batch is the price, up to the group's last member; a group
  of modules inside anchors (GPT-2's blocks) replays just those anchors' captured calls instead (anchors.py).
* **Rotation where it matters**: batches rotate so that ids and activations of one batch do not stay hot
  in cache. A component whose inputs of one batch exceed the last-level cache streams them through memory
  on every call anyway; one that writes more than the cache holds in a call (its outputs and the activations
  autograd saves) has evicted its inputs by the time the next call reads them, whichever batch it gets. Either
  is replayed on batch 0 only (its row says so), its other batches are never captured, and its backward holds
  one graph.
* **Graphs**: a component may hold the backward graphs of all its batches only if the extra ones fit the
  same allowance; otherwise they are built one at a time (timing.graphs.GraphCycle). A graph's size is what
  autograd saved plus the outputs and their gradients (capture.Capture.graph_bytes): a language model's
  head saves little but holds its logits and as much gradient per batch.

**Out of memory is a result** (`MemoryLimit`): on CPU the collecting process's data segment is capped
with `RLIMIT_DATA` (`--memory-limit`, by default what the machine has available), so an allocation
past it raises in the component that made it instead of calling the kernel's OOM killer on the whole
collection; CUDA raises `OutOfMemoryError` by itself. Either becomes `failed: out of memory` for that
component and phase, its children are measured and the parent estimated from them.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
import resource
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from cbsite.errors import CbsiteError

EXTRA_FRACTION = 0.25  # of the model's footprint, for captured inputs; as much again for extra graphs
MIN_ALLOWANCE = 64 * 2**20  # small models: capture everything at once, as before
DEFAULT_CACHE_BYTES = 32 * 2**20
OOM_PREFIX = "out of memory"
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_size(text: str | int | float) -> int:
    """Bytes from `24GB`, `1.5GiB`, `800MB` or a plain number of bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise CbsiteError(f"a memory limit must be above 0 bytes, got {text}")
        return int(text)
    m = _SIZE.match(str(text))
    if not m or (m.group(2) or "").lower() not in _UNITS:
        raise CbsiteError(f"memory limit {text!r}: give a size such as 24GB, 1.5GiB or 800MB")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if value <= 0:
        raise CbsiteError(f"a memory limit must be above 0 bytes, got {text!r}")
    return int(value)


def cache_bytes(device: torch.device) -> int:
    """The last-level cache a component's inputs compete for: the CPU's L3 (sysfs), a GPU's L2."""
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or DEFAULT_CACHE_BYTES
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(f"{base}/{entry}/size") as f:
                    best = max(best, parse_size(f.read().strip().upper().replace("K", "KiB").replace("M", "MiB")))
            except (OSError, CbsiteError):
                continue
    except OSError:
        pass
    return best or DEFAULT_CACHE_BYTES


def graph_size(saved_bytes: int, output_bytes: int) -> int:
    """What one backward graph holds for one batch: the tensors autograd saved while the forward ran, its outputs (the
    roots a backward starts from) and as many bytes of gradients for them. A language model's head saves 12 MB of
    inputs but holds 0.8 GB of logits and their gradient per graph."""
    return saved_bytes + 2 * output_bytes


@dataclass(frozen=True)
class Plan:
    """What one collection may hold beside the model, from the census of batch 0's forward."""

    footprint_bytes: int  # parameters and buffers + bytes saved by one forward of the whole model
    allowance_bytes: int  # captured inputs at once; extra backward graphs at once (each)
    cache_bytes: int  # inputs above this per batch: replayed on batch 0 only
    batches: int  # batches captured for the run
    input_bytes: dict[str, int]  # per component, its inputs in one forward (all calls)
    output_bytes: dict[str, int] = field(default_factory=dict)  # per component, its outputs in one forward
    saved_bytes: dict[str, int] = field(default_factory=dict)  # per component, what autograd saved in one forward
    # What the whole model's own measurement holds (its graph: capture.Capture.graph_bytes("")), where the collection
    # measures it: a group's inputs may take the room between that and what measuring its largest member holds
    # (`group`). 0: no such room (a session worker, or a collection that does not measure the whole model).
    headroom_bytes: int = 0

    def batches_for(self, path: str) -> int:
        """Batches a component rotates through: all, or batch 0 alone when its inputs, or what one call writes
        (outputs and saved activations), outgrow the cache (`past_cache`)."""
        return 1 if max(self.input_bytes.get(path, 0), self.written_bytes(path)) > self.cache_bytes else self.batches

    def written_bytes(self, path: str) -> int:
        """What one forward of the component writes that the census sees: its outputs and the activations
        autograd saves (a lower bound: temporaries freed within the call are not counted)."""
        return self.output_bytes.get(path, 0) + self.saved_bytes.get(path, 0)

    def past_cache(self, path: str) -> str | None:
        """Why rotating batches cannot change what the component finds in cache (its row's note), or None."""
        mib = 2**20
        if self.input_bytes.get(path, 0) > self.cache_bytes:
            return f"its inputs ({self.input_bytes[path] / mib:,.0f} MiB) exceed the last-level cache ({self.cache_bytes / mib:,.0f} MiB)"
        if self.written_bytes(path) > self.cache_bytes:
            return (f"a call writes more than the last-level cache holds ({self.written_bytes(path) / mib:,.0f} MiB of outputs "
                    f"and saved activations against {self.cache_bytes / mib:,.0f} MiB), so the next call finds none of its "
                    "inputs cached, whichever batch it gets")
        return None

    def graph_bytes(self, path: str) -> int:
        """One backward graph of the component (`graph_size`)."""
        return graph_size(self.saved_bytes.get(path, 0), self.output_bytes.get(path, 0))

    def working_bytes(self, path: str) -> int:
        """The graphs measuring the component holds at once: one per batch where the extra ones fit the allowance
        (measure.ComponentMeasurement.graphs_fit), else one."""
        batches = self.batches_for(path)
        graph = self.graph_bytes(path)
        return graph * batches if (batches - 1) * graph <= self.allowance_bytes else graph

    def group(self, candidates: Sequence[str], held: int = 0, batch0_room: int | None = None) -> list[str]:
        """The next capture group: `candidates` in order while their inputs fit (at least one). They fit the
        allowance, or, where the collection measures the whole model, the room its measurement needs anyway: the
        group's inputs plus the graphs measuring its largest member holds stay within the whole model's graph
        (`headroom_bytes`): fewer groups, and a forward per batch each group needs. The bound is on the census's
        figures, not on resident memory: a measurement also holds gradients and outputs, and the allocator keeps
        what was freed (run.json `memory.peak_set_by` says which measurement set the peak). `held`: bytes already
        held beside the group (the anchors' kept inputs, anchors.py). `batch0_room`: a bound on the group's inputs of
        batch 0 alone (a rider's, held through the whole model's measurement: capture_plan.GroupedCaptures)."""
        chosen: list[str] = []
        largest = 0
        first = 0
        for path in candidates:
            need = self.input_bytes.get(path, 0) * self.batches_for(path)
            working = max(largest, self.working_bytes(path))
            room = max(self.allowance_bytes, self.headroom_bytes - working)
            over_first = batch0_room is not None and first + self.input_bytes.get(path, 0) > batch0_room
            if chosen and (held + need > room or over_first):
                break
            chosen.append(path)
            held += need
            first += self.input_bytes.get(path, 0)
            largest = working
        return chosen

    def record(self) -> dict[str, Any]:
        return {
            "footprint_bytes": self.footprint_bytes, "allowance_bytes": self.allowance_bytes,
            "cache_bytes": self.cache_bytes, "headroom_bytes": self.headroom_bytes,
            "batch0_only": sorted(p for p in self.input_bytes if self.batches_for(p) < self.batches),
        }


def provisional_allowance(model_bytes: int) -> int:
    """What the census may keep of batch 0's inputs before the graph's size is known: the allowance
    from the parameters alone (the real one, with the graph, is at least this)."""
    return max(MIN_ALLOWANCE, int(EXTRA_FRACTION * model_bytes))


def plan(input_bytes: dict[str, int], model_bytes: int, saved_bytes: int, batches: int, cache: int,
         output_bytes: dict[str, int] | None = None, saved_by_component: dict[str, int] | None = None) -> Plan:
    """The plan of a collection from batch 0's census (capture.Capture) and the model's static size
    (`saved_bytes`: what the whole model's forward saved; `saved_by_component`: each component's share)."""
    footprint = model_bytes + saved_bytes
    allowance = max(MIN_ALLOWANCE, int(EXTRA_FRACTION * footprint))
    return Plan(footprint, allowance, cache, batches, dict(input_bytes), dict(output_bytes or {}),
                dict(saved_by_component or {}))


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's
    ENOMEM (what RLIMIT_DATA produces)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return "can't allocate memory" in text or "Cannot allocate memory" in text or "out of memory" in text.lower()


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def data_bytes() -> int | None:
    """This process's data segment (VmData: heap and private anonymous mappings), what RLIMIT_DATA caps."""
    return _status_kb("VmData")


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Inside: the objects that existed on entry (every import's, the model, its batches) are out of the cyclic
    garbage collector's reach (`gc.freeze`), after a collection of the young ones. They live through a collection,
    yet every full collection walked them, `release_freed`'s among them (the untimed part of the hierarchy stage it
    ends, README "Memory and scale"). On exit they are handed back (`gc.unfreeze`).
    Where the caller froze objects of its own, nothing is done: unfreezing would hand back theirs too."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect(1)  # the young generations: garbage made just before is not kept
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release_freed() -> None:
    """Give the C allocator's freed memory back to the system (glibc's `malloc_trim`; nothing elsewhere). Tensors below
    its mmap threshold (up to 32 MiB once larger ones were freed) live in its heap, which keeps what they freed: the
    whole-model step after the components stage then raises the process's peak above the components' own
    (benchmarks/collect_scale.py)."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """glibc's `malloc_trim(0)`: the heap's free pages go back to the system (nothing elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def resident_bytes() -> int | None:
    """This process's resident memory now (VmRSS), None where there is no procfs."""
    return _status_kb("VmRSS")


class HeapReturns:
    """Where a collection handed freed heap back to the system after a component's measurement (trimmed_if_left with
    `returns`): after whose, what that measurement had left resident, and how much went back (run.json memory
    `heap_returned`). A large return after a component is memory the next one would otherwise have allocated beside."""

    KEEP = 5

    def __init__(self) -> None:
        self.returned: list[dict[str, Any]] = []

    def note(self, path: str, left_bytes: int, returned_bytes: int) -> None:
        self.returned.append({"path": path, "left_bytes": left_bytes, "returned_bytes": returned_bytes})

    def record(self) -> dict[str, Any]:
        top = sorted(self.returned, key=lambda r: -r["returned_bytes"])[: self.KEEP]
        return {"heap_returned": {"times": len(self.returned), "bytes": sum(r["returned_bytes"] for r in self.returned),
                                  "most_after": top}}


@contextlib.contextmanager
def trimmed_if_left(returns: HeapReturns | None = None, path: str = "", left_bytes: int = 0) -> Iterator[None]:
    """Around an untimed pass (a peak pass, a real counting pass) or a component's whole measurement: where it left more
    than max(TRIM_LEFT_BYTES, `left_bytes`) resident beyond what it found, or either is unknown, its freed heap goes
    back to the system (noted in `returns`, as after `path`'s measurement, where given)."""
    before = resident_bytes()
    yield
    after = resident_bytes()
    if before is None or after is None or after - before > max(TRIM_LEFT_BYTES, left_bytes):
        trim_heap()
        now = resident_bytes()
        if returns is not None and before is not None and after is not None and now is not None:
            returns.note(path, after - before, max(0, after - now))


# A pass that leaves more than this resident beyond what it found has its freed heap handed back (trimmed_if_left).
# Below it nothing is trimmed: a trimmed heap faults its pages in again on the next calls, and the first timed
# block pays for that (benchmarks/collect_scale.py `first_blocks`). Above it, what the pass left would stay resident
# under the timing that follows, which allocates beside it: a backward writing dense gradients of whole embedding
# tables then raises the collection's peak (benchmarks/collect_scale.py, README "Memory and scale").
TRIM_LEFT_BYTES = 64 * 2**20


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (ru_maxrss)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class StagePeaks:
    """The process's peak resident memory (ru_maxrss) as it stood at the end of each stage of a collection:
    the stage after which it first reaches its final value is the one that needed the memory. Read only,
    never reset, so a caller's own ru_maxrss stays true."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}

    def done(self, stage: str) -> None:
        self.peaks[stage] = peak_rss_bytes()


class PeakRaisers:
    """Which steps of a collection raised the process's peak resident memory (ru_maxrss), and by how
    much: `step(what, path)` after each capture and each component's measurement. The last raiser set the
    run's peak; an expert who finds the peak too high reads here which component needed it."""

    KEEP = 5

    def __init__(self, stages: StagePeaks | None = None) -> None:
        self.last = peak_rss_bytes()
        self.raised: list[dict[str, Any]] = []
        # Where no capture or measurement raises the peak, the stage before them that reached it set it (the census's
        # whole-model forward, loading the model): `stages`, the peaks as each earlier stage ended.
        reached = [stage for stage, peak in (stages.peaks.items() if stages else ()) if peak >= self.last]
        self.before = {"what": "stage", "path": None, "stage": reached[0], "peak_bytes": self.last} if reached else None

    def step(self, what: str, path: str) -> None:
        now = peak_rss_bytes()
        if now > self.last:
            self.raised.append({"what": what, "path": path, "raised_bytes": now - self.last, "peak_bytes": now})
            self.last = now

    def record(self) -> dict[str, Any]:
        top = sorted(self.raised, key=lambda r: -r["raised_bytes"])[: self.KEEP]
        return {"peak_set_by": self.raised[-1] if self.raised else self.before, "peak_raised_most_by": top}


def suggested_limit(needed: int) -> int:
    """The --memory-limit a refusal names for `needed` bytes: what the next run holds with the model loaded varies by a
    few MiB, so the figure carries RERUN_ROOM_BYTES more and is
    rounded up to whole multiples of it."""
    return -(-(needed + RERUN_ROOM_BYTES) // RERUN_ROOM_BYTES) * RERUN_ROOM_BYTES


RERUN_ROOM_BYTES = 32 * 2**20


def available_bytes() -> int | None:
    """What the machine can still give: MemAvailable, or less where a cgroup limit says so."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            room = int(limit) - used
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


AUTO_SHARE = 0.9  # of what is available when the collection starts: the rest for the OS and neighbours
# What cbsite's own work beside the measurement needs above the data segment it starts the cap with: thread stacks
# (torch's and polars' pools, 8 MiB of mapping each, counted by RLIMIT_DATA), imports done on the way, progress and
# plugins. A tiny model's collection failed at 80-110 MiB above (a MemoryError importing a module, an abort when
# polars' allocator could not start a thread) and passed at 170 MiB; this leaves a margin.
OWN_WORK_BYTES = 256 * 2**20


class MemoryLimit:
    """Caps the process's data segment for the duration of a `with` block (CPU only), then restores it.

    `limit`: bytes the data segment may reach; None: the data segment now plus AUTO_SHARE of what the
    machine has available. Where RLIMIT_DATA cannot be set (not Linux), nothing is capped and
    `record()` says so.
    """

    def __init__(self, limit: int | None, device: torch.device) -> None:
        self.asked = limit
        self.device = device
        self.bytes: int | None = None
        self.source = "none"
        self.previous: tuple[int, int] | None = None

    def __enter__(self) -> "MemoryLimit":
        if self.device.type != "cpu" or not hasattr(resource, "RLIMIT_DATA"):
            self.source = "not capped (CUDA raises OutOfMemoryError itself)" if self.device.type == "cuda" else "not capped"
            return self
        now = data_bytes()
        if self.asked is not None:
            if now is not None and self.asked < now + OWN_WORK_BYTES:
                needed = now + OWN_WORK_BYTES
                # Refused before any measurement: a cap this close to what the process holds crashed cbsite itself
                # (a segfault, an abort, a MemoryError in its bookkeeping), not the component that asked for more.
                raise CbsiteError(
                    f"--memory-limit {self.asked / 2**20:.0f}MiB is below what the process already holds with the "
                    f"model loaded and what cbsite's own work needs beside the measurement: {needed / 2**20:.0f}MiB "
                    f"({now / 2**20:.0f}MiB held + {OWN_WORK_BYTES / 2**20:.0f}MiB); give --memory-limit "
                    f"{suggested_limit(needed) // 2**20}MiB or more"
                )
            self.bytes, self.source = self.asked, "given (--memory-limit)"
        else:
            avail = available_bytes()
            if now is None or avail is None:
                return self
            self.bytes, self.source = now + int(AUTO_SHARE * avail), f"auto: {AUTO_SHARE:.0%} of the memory available at the start"
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        self.previous = (soft, hard)
        wanted = self.bytes if hard == resource.RLIM_INFINITY else min(self.bytes, hard)
        if soft == resource.RLIM_INFINITY or wanted < soft:
            resource.setrlimit(resource.RLIMIT_DATA, (wanted, hard))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> None:
        """Lift the cap before the block ends: it is for measurement, and what follows the measurement (provenance,
        the run's tables, plugins' reports) is cbsite's own bookkeeping, which must not fail for want of memory."""
        if self.previous is not None:
            resource.setrlimit(resource.RLIMIT_DATA, self.previous)
            self.previous = None

    def record(self) -> dict[str, Any]:
        return {"limit_bytes": self.bytes, "limit_source": self.source}
