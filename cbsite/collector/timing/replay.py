"""A component's captured calls replayed: fresh copies of the inputs a call changes (in place, or state such as a
cache), made before the timed block, and the notes that say how the inputs were replayed."""

from __future__ import annotations

import collections
import collections.abc
import functools
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cbsite.collector.capture import Call, is_state, tensors_in
from cbsite.collector.memory import cache_bytes


def used_up(call: Call) -> str | None:
    """Why a call cannot be replayed because an input is an iterator (a generator, `iter(list)`), or None: the model's
    own call used it up, so every replay would see it empty and count nothing (0 FLOPs "measured")."""
    leaves = pytree.tree_leaves((call.args, call.kwargs))
    found = next((x for x in leaves if isinstance(x, collections.abc.Iterator) and not isinstance(x, torch.Tensor)), None)
    if found is None:
        return None
    return (f"an input is a {type(found).__name__}, an iterator: the model's call used it up, so a replay would see "
            "it empty; pass this module a list or tuple to measure it (its children are measured)")


class StateNotReplayable(Exception):
    """The component's inputs hold state that could not be copied at the call and has changed (capture.Call
    state_problem): every replay would run on a state the model never had, so the component is not measured."""


def _mutated_inputs(module: nn.Module, call: Call) -> bool:
    """Does the module write into its inputs (an in-place activation, say)?"""
    args, kwargs = call.replay_inputs(with_grad=False)
    leaves = tensors_in((args, kwargs))
    before = [t._version for t in leaves]
    with torch.no_grad():
        module(*args, **kwargs)
    return any(t._version != v for t, v in zip(leaves, before))


INPLACE_NOTE = "in-place module"


def _input_notes(batches: list[list[Call]], inplace: bool) -> list[str]:
    """How the component's inputs were replayed, where that is not plain clones of tensors."""
    notes = []
    if inplace:
        notes.append(f"{INPLACE_NOTE}: each timed call writes into its own fresh copy of the inputs, made before "
                     "the timed block (the block times the op as the model runs it, not the copy)")
    calls = [c for b in batches for c in b if c.stateful]
    kinds = ", ".join(sorted({type(x).__name__ for c in calls for x in pytree.tree_leaves((c.args, c.kwargs))
                              if is_state(x)}))
    by_reference = sorted({c.state_error for c in calls if c.state_error is not None})
    if by_reference:
        notes.append(f"inputs hold state that cannot be copied ({by_reference[0]}): replayed on the live object, "
                     "which neither the call nor the rest of the forward changed")
    elif any(c.state_changed is not False for c in calls):
        notes.append(f"stateful inputs ({kinds}): the call changes them, so every run replays its own copy of the "
                     "state as it was at the call, made before the timed block")
    elif calls:
        notes.append(f"inputs hold objects ({kinds}): replayed from a copy made at the call, which the call does not "
                     "change")
    return notes


@dataclass
class Replay:
    """One run's inputs of every call of a batch: `inputs` (fresh copies, the leaves a backward differentiates for),
    the grad mode of each call, and `given`, what the module is called with: the inputs themselves, or for an in-place
    module with grad, copies of the leaves that require grad (autograd refuses to write into a leaf that does)."""

    inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]
    modes: list[bool]
    given: list[tuple[tuple[Any, ...], dict[str, Any]]]


class FreshInputs:
    """Inputs for a forward statement whose calls change them (an in-place module writes into its input; a cache
    grows): each run takes a copy of its own, as the captured call had it, from a pool made before each timed block
    (`prepare`, called by timed_block and stmt_seconds before the clocks start), so a block times the component as
    the model runs it, and no copy. A run outside a block (a warm-up) makes its own.

    The pool holds at most `limit_bytes` of copies (`pool_limit`: half the core's own cache), so a block holds at most
    `max_calls` statements (sized_block): the copies made just before it are still in that cache, as the model's input
    to an in-place op is, its producer having just written it; a larger input is one call per block on a copy just
    made, in cache as far as the producer's output would be (copies that together outgrow the cache evict each other,
    and the op then runs from memory)."""

    def __init__(self, make: Callable[[int], Replay], batches: int, snapshot: Any, limit_bytes: int) -> None:
        self.make = make
        self.batches = batches
        self.made = 0
        self.pool: collections.deque[tuple[int, Replay]] = collections.deque()
        # Copies a run has used, let go at the next `prepare`: freeing them (an in-place op's output is its input; a
        # large one is unmapped) is not the component's work, and inside a block it was timed.
        self.used: list[tuple[int, Replay]] = []
        self.prepare(1)
        self.max_calls = max(1, limit_bytes // max(1, _new_bytes(self.pool[0][1], snapshot)))

    def prepare(self, runs: int) -> None:
        self.used.clear()
        while len(self.pool) < runs:
            index = self.made % self.batches
            self.pool.append((index, self.make(index)))
            self.made += 1

    def next(self) -> tuple[int, Replay]:
        if not self.pool:
            self.prepare(1)
        self.used.append(self.pool.popleft())
        return self.used[-1]


@functools.cache
def pool_limit(device: str) -> int:
    """Bytes of fresh inputs a FreshInputs pool may hold: half the cache a CPU core has to itself (its L2, from
    sysfs), or half a GPU's L2."""
    if device.startswith("cuda"):
        return cache_bytes(torch.device(device)) // 2
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            with open(f"{base}/{entry}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{entry}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{entry}/size") as f:
                size = f.read().strip().upper()
            if level == "2" and kind in ("Unified", "Data") and size.endswith("K"):
                return int(size[:-1]) * 1024 // 2
    except (OSError, ValueError):
        pass
    return 256 * 1024


def _new_bytes(replay: Replay, snapshot: Any) -> int:
    """Bytes a replay's copies allocate: its tensors' storages that are not the snapshot's (a state tensor nothing
    writes into is shared with it)."""
    def storages(obj: Any) -> dict[int, int]:
        out = {}
        for t in tensors_in(obj):
            try:
                out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):
                out[id(t)] = t.numel() * t.element_size()
        return out

    kept = storages(snapshot)
    return sum(n for ptr, n in storages((replay.inputs, replay.given)).items() if ptr not in kept)
