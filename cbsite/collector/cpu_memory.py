"""CPU memory of one run of a phase, from the allocator events torch.profiler records.

Why not the census (a TorchDispatchMode, counting.py)? A Python dispatch mode changes what autograd
does: with one active every tensor counts as "subclass-like", so backward formulas that normally
write in place (gradient accumulation, `index_put_` into a zeros buffer) take their out-of-place
branch and allocate more. Measured on torchrec's InteractionArch backward: census 432 KiB, the
allocator 328 KiB. The profiler installs no dispatch mode, so the run it sees is the real one.

The CPU allocator reports each allocation and free with its pointer; pairing them by pointer gives
the bytes live at every event. Frees of blocks allocated before recording began carry no size (the
allocator warns on stderr, silenced) and are ignored: the peak is of what the phase allocated.
"""

from __future__ import annotations

from typing import Any, Callable, Collection

import torch

from cbsite.collector.memory import trimmed_if_left
from cbsite.collector.quiet_profiler import quiet_profiler


def allocation_nodes(op_tree: Any) -> list[Any]:
    """The CPU allocation/free events of a profile's op tree (torch.profiler._memory_profiler.OpTree of
    a profile_memory=True run), in time order."""
    from torch._C._profiler import _EventType

    return [n for n in op_tree.sorted_nodes if n.tag == _EventType.Allocation and n.extra_fields.device.type == "cpu"]


def peak_allocated(nodes: list[Any], excluded: Collection[int] = ()) -> int:
    """Most bytes live at once among the blocks allocated within the recording. `excluded`: data pointers of blocks
    still live at the end that are not the run's own (a Rider's clones): each one's last allocation is left out."""
    skip: set[int] = set()
    if excluded:
        last: dict[int, int] = {}
        for i, n in enumerate(nodes):
            ptr = int(n.extra_fields.ptr)
            if ptr in excluded and int(n.extra_fields.alloc_size) > 0:
                last[ptr] = i
        skip = set(last.values())
    live: dict[int, int] = {}
    total = peak = 0
    for i, n in enumerate(nodes):
        if i in skip:
            continue
        ptr, size = int(n.extra_fields.ptr), int(n.extra_fields.alloc_size)
        if size > 0:
            live[ptr] = size
            total += size
            peak = max(peak, total)
        elif size < 0 and ptr in live:
            total -= live.pop(ptr)
    return peak


def cpu_peak(fn: Callable[[], Any], excluded: Callable[[], Collection[int]] | None = None) -> int:
    """Peak bytes allocated by one (warm) call of `fn` on CPU, as the allocator saw it. `excluded`: asked after the
    call, the data pointers of live blocks the call made that are not the run's own (`peak_allocated`)."""
    # The profiler's own small allocations, made between the run's, pin the heap: what the run freed stayed
    # resident and the timing after it allocated afresh beside it (a whole-model backward writing gradients as large
    # as its embedding tables; README "Memory and scale").
    # A run that left that much behind has its freed heap handed back; a small one is left alone (memory.TRIM_LEFT_BYTES).
    with trimmed_if_left():
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        with quiet_profiler(prof, whole=True):
            fn()
        from torch.profiler._memory_profiler import OpTree

        assert prof.profiler is not None and prof.profiler.kineto_results is not None  # set once the profile ran
        peak = peak_allocated(allocation_nodes(OpTree(prof.profiler.kineto_results)), excluded() if excluded else ())
        del prof
    return peak
