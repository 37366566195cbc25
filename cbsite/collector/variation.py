"""Work that varies per call: random control flow (stochastic depth, LayerDrop, a loop of random length).

cbsite replays each component from its captured inputs and compares replays of two sides. That holds only where a
call does the same work every time it is made on the same inputs. A module whose forward draws its own control flow
(a block skipped at random, a Linear called a random number of times) does different work on every replay: its
latency is one draw of a distribution, and two sides compared block by block can differ many times over on identical
code.

`probe` runs the model's forward `FORWARDS` times on the same batch (no graph, the RNG put back after) with hooks on
every module, and compares what each call did: the sub-modules it called, in order, with their input shapes. A module
whose calls differ between those forwards varies per call; one whose number of calls per forward differs has a
`call_count` that is one draw. The rows say so (`annotate`) and a comparison does not judge them (session/compare.py).
"""

from __future__ import annotations

import copy
import random
import sys
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

FORWARDS = 3  # forwards of the same batch: two equal draws of a 10 % stochastic depth over 12 blocks are 9 % likely, three 2 %
VARIES_NOTE = "work varies per call"
COUNT_NOTE = "calls per forward vary"


def _shapes(args: Any, kwargs: Any) -> tuple[Any, ...]:
    return tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None
                 for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor))


def _one_forward(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    """path -> one entry per call of that module: the (path, input shapes) of every module called inside it, in order."""
    names = {id(m): path for path, m in model.named_modules()}
    stack: list[list[tuple[Any, ...]]] = []
    calls: dict[str, list[tuple[Any, ...]]] = {}

    def pre(module: nn.Module, a: Any, kw: Any) -> None:
        me = (names[id(module)], _shapes(a, kw))
        for frame in stack:
            frame.append(me)
        stack.append([])

    def post(module: nn.Module, a: Any, kw: Any, out: Any) -> None:
        inside = stack.pop() if stack else []
        calls.setdefault(names[id(module)], []).append(tuple(inside))

    handles = []
    try:
        for module in model.modules():
            if id(module) in names:
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls


def probe(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], forwards: int = FORWARDS) -> dict[str, str]:
    """path -> a note, for every module whose work differed between `forwards` forwards of the same inputs.

    The random number generators (torch's CPU and CUDA ones, Python's, NumPy's) are put back afterwards, so the
    collection's own forwards draw what they would have drawn without the probe. A forward that raises is left to the
    collection to report (it makes the same forward), and a batch that cannot be copied is not probed: the probe then
    finds nothing."""
    numpy = sys.modules.get("numpy")
    py_state = random.getstate()
    np_state = numpy.random.get_state() if numpy is not None else None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    seen: list[dict[str, list[tuple[Any, ...]]]] = []
    try:
        with torch.random.fork_rng(devices=devices):
            for _ in range(forwards):
                # Each forward on its own copy of the batch: a state the forward extends (a transformers cache) would
                # otherwise grow between them and read as work that varies, and the collection's batch stays as it was.
                seen.append(_one_forward(model, *copy.deepcopy((args, kwargs))))
    except Exception:  # noqa: BLE001 - a forward that fails, or a batch that cannot be copied: nothing is said
        return {}
    finally:
        random.setstate(py_state)
        if numpy is not None and np_state is not None:
            numpy.random.set_state(np_state)
    notes: dict[str, str] = {}
    for path in dict.fromkeys(p for calls in seen for p in calls):
        per_forward = [calls.get(path, []) for calls in seen]
        counts = [len(c) for c in per_forward]
        if len(set(counts)) > 1:
            notes[path] = (f"{COUNT_NOTE}: {', '.join(map(str, counts))} calls in {forwards} forwards of the same batch "
                           "(random control flow): call_count and the totals that use it are one draw")
        # Each call's own work, call by call (the i-th call of each forward; those that exist in every forward): the
        # same inputs gave different sub-calls. A leaf calls nothing, so only its count can vary.
        if any(len({f[i] for f in per_forward}) > 1 for i in range(min(counts))):
            notes[path] = (f"{VARIES_NOTE}: its calls ran different sub-modules in {forwards} forwards of the same "
                           "batch (random control flow such as stochastic depth or LayerDrop): its latency is one draw, "
                           "and comparisons do not judge it")
    return notes


def annotate(rows: list[dict[str, Any]], notes: dict[str, str]) -> None:
    """Add each varying module's note to its rows (every phase)."""
    for row in rows:
        note = notes.get(row["path"])
        if note and note not in (row.get("notes") or []):
            row["notes"] = list(row.get("notes") or []) + [note]


def varies(notes: Any) -> str | None:
    """The row's note saying its work varies per call (a comparison does not judge it), or None."""
    return next((n for n in notes or () if isinstance(n, str) and n.startswith(VARIES_NOTE)), None)
