"""CPU memory of one run of a phase, from the allocator events torch.profiler records.

Why not the census (a TorchDispatchMode, counting.py)? A Python dispatch mode changes what autograd
does: with one active every tensor counts as "subclass-like", so backward formulas that normally
write in place (gradient accumulation, `index_put_` into a zeros buffer) take their out-of-place
branch and allocate more. Measured on torchrec's InteractionArch backward: census 432 KiB, the
allocator 328 KiB. The profiler installs no dispatch mode, so the run it sees is the real one.

The CPU allocator reports each allocation and free with its pointer; pairing them by pointer gives
the bytes live at every event. Frees of blocks allocated before recording began carry no size (the
allocator warns on stderr, silenced here) and are ignored: the peak is of what the phase allocated.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Iterator

import torch


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Kineto writes lines to the process's stderr at every profiler start and stop (hundreds per
    run), and the CPU allocator one per free of a block it saw no allocation of; KINETO_LOG_LEVEL does
    not reach them once pyarrow is loaded. Silence fd 2 for just those calls."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def quiet_profiler(prof: Any, *, whole: bool = False) -> Iterator[Any]:
    """Run `prof` (a torch.profiler.profile) around the block, its native start/stop lines silenced;
    `whole` silences the block too (the allocator's per-free warnings under profile_memory)."""
    with native_stderr_silenced():
        prof.start()
    try:
        with native_stderr_silenced() if whole else contextlib.nullcontext():
            yield prof
    finally:
        with native_stderr_silenced():
            prof.stop()


def allocation_nodes(prof: Any) -> list[Any]:
    """The CPU allocation/free events of a stopped profile (profile_memory=True), in time order."""
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import OpTree

    return [n for n in OpTree(prof.profiler.kineto_results).sorted_nodes
            if n.tag == _EventType.Allocation and n.extra_fields.device.type == "cpu"]


def peak_allocated(nodes: list[Any]) -> int:
    """Most bytes live at once among the blocks allocated within the recording."""
    live: dict[int, int] = {}
    total = peak = 0
    for n in nodes:
        ptr, size = int(n.extra_fields.ptr), int(n.extra_fields.alloc_size)
        if size > 0:
            live[ptr] = size
            total += size
            peak = max(peak, total)
        elif size < 0 and ptr in live:
            total -= live.pop(ptr)
    return peak


def cpu_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated by one (warm) call of `fn` on CPU, as the allocator saw it."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with quiet_profiler(prof, whole=True):
        fn()
    return peak_allocated(allocation_nodes(prof))
