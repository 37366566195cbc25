"""The caller's model is left as it was found: `preserved(model)` around profiling.

Profiling runs the model's own modules: every forward updates what a module keeps per call (BatchNorm's
running statistics and `num_batches_tracked`, any buffer a module writes), dropout draws from the global
random generators, and a collection converts the model to the asked dtype and device in place. On exit
(also on an error or Ctrl-C) this puts back, bit for bit:

* every parameter and buffer: the same tensor objects, with their original values, dtype and device
  (values are kept as a CPU copy while profiling, so a GPU model costs host memory, not device memory);
* `requires_grad` and `.grad` of every parameter;
* the training flag of every module;
* the random states of torch (CPU, and CUDA when it was initialised), Python's `random` and numpy.

Parameters or buffers a module adds while profiling (lazy modules materialising) are kept: there was
nothing before to restore.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn


@dataclass
class _Tensor:
    """One parameter or buffer as found: the object, a tensor on its original storage, and its values."""

    obj: torch.Tensor
    data: torch.Tensor  # the original storage, dtype and device (kept alive: a conversion leaves it untouched)
    values: torch.Tensor  # a CPU copy of the original values
    requires_grad: bool
    grad: torch.Tensor | None
    grad_values: torch.Tensor | None


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _keep(t: torch.Tensor) -> _Tensor:
    grad = t.grad if isinstance(t, nn.Parameter) else None
    return _Tensor(
        obj=t, data=t.data, values=_cpu_copy(t), requires_grad=t.requires_grad,
        grad=grad, grad_values=None if grad is None else _cpu_copy(grad),
    )


def _put_back(kept: _Tensor) -> None:
    with torch.no_grad():
        kept.data.copy_(kept.values)  # same dtype: a bitwise copy
        if kept.grad is not None and kept.grad_values is not None:
            kept.grad.copy_(kept.grad_values)
    t = kept.obj
    if t.data.data_ptr() != kept.data.data_ptr() or t.dtype != kept.data.dtype or t.device != kept.data.device:
        t.data = kept.data
    if isinstance(t, nn.Parameter):
        t.requires_grad_(kept.requires_grad)
        t.grad = kept.grad


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # never initialise CUDA just to save it
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with polars' and torch's stack
        pass
    else:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["random"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Profile `model` inside this block; on exit it is as it was found (see the module docstring)."""
    rng = _rng_state()
    modules = list(model.modules())
    training = [m.training for m in modules]
    slots: list[tuple[dict[str, Any], str, Any]] = []  # (module._parameters or ._buffers, name, object or None)
    kept: dict[int, _Tensor] = {}
    for m in modules:
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                slots.append((table, name, t))
                if t is not None and id(t) not in kept:  # a tied weight is kept once
                    kept[id(t)] = _keep(t)
    try:
        yield
    finally:
        for table, name, t in slots:
            table[name] = t  # a conversion may have put new objects in (buffers always, parameters sometimes)
        for k in kept.values():
            _put_back(k)
        for m, flag in zip(modules, training):
            m.training = flag
        _set_rng_state(rng)
